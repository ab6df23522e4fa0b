"""Softmax top-k router in TIRx: one thread per token. The k-th largest of the token's group maxima bounds its k-th
largest logit from below, so only the few logits at or above it (about 10 of 128) are candidates. Their ids are
compacted in ascending order; the first _SLOTS of them are ranked by pairwise compares, where slot order breaks ties
(equal logits go to the lower expert id, torch's stable-sort rule), and the rare later candidates are inserted.

The CTA's rows are staged in shared memory with coalesced 16-byte cp.async copies (0.26 µs faster on the H200 than
loads to registers and stores); a row stride of an odd number of 16-byte chunks lets each thread read its own row
without bank conflicts. Logits must be finite or infinite: NaN is outside
the problem's domain (it is never selected here, where torch's sort ranks it first). On the host (llvm) a plain
per-token loop does the same selection."""
import functools

import torch
from tvm_tirx.script import tirx as T

from metakernelbench.suite.kits.common import batcher_network, gpu_arch, require_int32_indexing
from metakernelbench.suite.kits.tirx import NO_FAST_MATH, build_cpu, build_cuda, nvcc_build

CPU_PATH = True
_TOKENS = 32  # tokens per CTA, one thread each
_GROUP = 8  # logits per group maximum
_BLOCK = 8  # group maxima sorted per block for the bound; also the largest top_k
_SLOTS = 16  # candidates ranked in registers; a token has more about 3% of the time
_ONE = 0x3F800000  # the bits of 1.0f, 127 << 23; 127 is invertible mod 512 (127 * 383 = 1 mod 512)


_PAIRS = batcher_network(_BLOCK)  # 19 comparators sort 8 maxima (a bitonic network needs 24)


def _pair(q, side):
    """Element `side` of comparator q, as an expression that folds to a constant once q is unrolled."""
    index = _PAIRS[-1][side]
    for r in reversed(range(len(_PAIRS) - 1)):
        index = T.if_then_else(q == r, _PAIRS[r][side], index)
    return index


def _kernel(experts, top_k):
    groups = experts // _GROUP
    chunks = experts // 4
    row = experts + 4  # an odd number of 16-byte chunks: a column of 16-byte loads is bank-conflict free
    parts = -(-groups // _BLOCK)  # chunks of group maxima, sorted and folded for the bound
    bounded = top_k <= groups
    logb = _BLOCK.bit_length() - 1
    n = T.dynamic("n")

    @T.function
    def softmax_topk(
        L: T.Tensor((n, experts), T.float32, align=16),
        WT: T.Tensor((n, top_k), T.float32, align=16),
        ID: T.Tensor((n, top_k), T.int32, align=16),
    ):
        T.device_entry(
            launch=T.cuda.LaunchConfig(grid=T.ceildiv(n, _TOKENS), block=_TOKENS),
            backend_config=NO_FAST_MATH,
        )
        t = T.cuda.thread_idx("x")
        first = T.cuda.block_idx("x") * _TOKENS
        tok = first + t
        s_row = T.alloc_shared((_TOKENS * row,), "float32")
        s_cand = T.alloc_shared((experts * _TOKENS,), "uint8")
        # The ranked top k, slot-major; rank top_k is a scratch slot shared by every candidate ranked below it.
        s_top_v = T.alloc_shared(((top_k + 1) * _TOKENS,), "float32")
        s_top_i = T.alloc_shared(((top_k + 1) * _TOKENS,), "int32")
        frag = T.alloc_local((4,), "float32")
        maxima = T.alloc_local((parts * _BLOCK,), "float32")
        top = T.alloc_local((_BLOCK,), "float32")
        vals = T.alloc_local((_SLOTS,), "float32")
        ids = T.alloc_local((_SLOTS,), "int32")
        rank = T.alloc_local((_SLOTS,), "uint32")
        top_v = T.alloc_local((top_k,), "float32")
        top_i = T.alloc_local((top_k,), "int32")
        # Stage the CTA's rows: every copy is coalesced. With 32 chunks a row, copy q moves row q, and a full
        # CTA's rows are contiguous, so its copies need no address arithmetic.
        if T.constexpr(chunks == _TOKENS):
            if first + _TOKENS <= n:
                for q in T.unroll(_TOKENS):
                    T.ptx["cp.async.cg.shared.global"](T.address_of(s_row[q * row + t * 4]),
                                                       T.address_of(L[first + q, t * 4]), 16)
            else:
                for q in T.unroll(_TOKENS):
                    T.ptx["cp.async.cg.shared.global"](T.address_of(s_row[q * row + t * 4]),
                                                       T.address_of(L[T.min(first + q, n - 1), t * 4]), 16)
        else:
            for q in T.unroll(chunks):
                lin = q * _TOKENS + t
                r = lin // chunks
                c = lin % chunks
                T.ptx["cp.async.cg.shared.global"](T.address_of(s_row[r * row + c * 4]),
                                                   T.address_of(L[T.min(first + r, n - 1), c * 4]), 16)
        T.ptx["cp.async.commit_group"]()
        T.ptx["cp.async.wait_group"](0)
        T.cuda.cta_sync()
        base = t * row
        # Bound: the k-th largest group maximum. Those k maxima are distinct logits, so the token's k-th largest
        # logit is at least the bound: only logits at or above it can be among the top k.
        for g in T.unroll(groups, parts * _BLOCK):
            maxima[g] = T.float32(float("-inf"))
        for g in T.unroll(groups):
            for h in T.unroll(_GROUP // 4):
                frag[0:4] = s_row[T.Ramp(base + g * _GROUP + h * 4, 1, 4)]
                quad = _fmax(_fmax(frag[0], frag[1]), _fmax(frag[2], frag[3]))
                if h == 0:
                    maxima[g] = quad
                else:
                    maxima[g] = _fmax(maxima[g], quad)
        bound: T.float32 = T.float32(float("-inf"))
        if T.constexpr(bounded):
            # Sort each chunk of _BLOCK maxima descending (Batcher's network) and fold it into the running top:
            # the larger of top[i] and chunk[_BLOCK - 1 - i] are the _BLOCK largest of both, in bitonic order.
            for p in T.unroll(parts):
                for q in T.unroll(len(_PAIRS)):
                    a = maxima[p * _BLOCK + _pair(q, 0)]
                    b = maxima[p * _BLOCK + _pair(q, 1)]
                    maxima[p * _BLOCK + _pair(q, 0)] = _fmax(a, b)
                    maxima[p * _BLOCK + _pair(q, 1)] = _fmin(a, b)
                if p == 0:
                    for i in T.unroll(_BLOCK):
                        top[i] = maxima[i]
                else:
                    for i in T.unroll(_BLOCK):
                        top[i] = _fmax(top[i], maxima[p * _BLOCK + _BLOCK - 1 - i])
                    # Sort the bitonic top unless only its minimum is wanted (the last fold with top_k = _BLOCK).
                    if top_k < _BLOCK or p < parts - 1:
                        for jj in T.unroll(logb):
                            for i in T.unroll(_BLOCK):
                                if (i & (_BLOCK >> (jj + 1))) == 0:
                                    a = top[i]
                                    b = top[i + (_BLOCK >> (jj + 1))]
                                    top[i] = _fmax(a, b)
                                    top[i + (_BLOCK >> (jj + 1))] = _fmin(a, b)
            if T.constexpr(top_k < _BLOCK or parts == 1):
                bound = top[top_k - 1]
            else:
                bound = _fmin(_fmin(_fmin(top[0], top[1]), _fmin(top[2], top[3])),
                              _fmin(_fmin(top[4], top[5]), _fmin(top[6], top[7])))
        # Candidates: ids of this token's logits at or above the bound, ascending, slot-major (candidate j of
        # thread t at j * _TOKENS + t). Only candidates are stored: a warp's predicated stores have few active
        # lanes and rarely share a bank, where unconditional ones conflict up to four ways (0.17 us slower).
        pos: T.int32 = t
        for c in T.unroll(chunks):
            frag[0:4] = s_row[T.Ramp(base + c * 4, 1, 4)]
            for e in T.unroll(4):
                if frag[e] >= bound:
                    s_cand[pos] = T.Cast("uint8", c * 4 + e)
                    pos = pos + _TOKENS
        count = (pos - t) // _TOKENS
        # Rank the first _SLOTS candidates (-inf past the last one): slot i ranks above slot j > i unless
        # v_j > v_i.
        for s in T.unroll(_SLOTS):
            ids[s] = T.Cast("int32", s_cand[T.min(s, experts - 1) * _TOKENS + t])
            vals[s] = T.if_then_else(s < count, s_row[base + ids[s]], T.float32(float("-inf")))
            rank[s] = T.Cast("uint32", _SLOTS - 1 - s) * T.uint32(_ONE)  # as if every later slot ranked above
        for i in T.unroll(_SLOTS):
            for j in T.unroll(_SLOTS):
                if j > i:
                    # 1.0f where slot i ranks above slot j: the bits of one FSET; rank * _ONE mod 2**32 is summed
                    above = T.reinterpret(T.Cast("float32", vals[i] >= vals[j]), ty="uint32")
                    rank[j] = rank[j] + above
                    rank[i] = rank[i] - above
        for i in T.unroll(_SLOTS):
            place = T.Cast("int32", ((rank[i] >> T.uint32(23)) * T.uint32(383)) & T.uint32(511))
            at = T.min(place, top_k) * _TOKENS + t
            s_top_v[at] = vals[i]
            s_top_i[at] = ids[i]
        for p in T.unroll(top_k):
            top_v[p] = s_top_v[p * _TOKENS + t]
            top_i[p] = s_top_i[p * _TOKENS + t]
        # Later candidates have higher ids than every kept one, so only a strictly larger logit enters.
        for s in range(T.max(count - _SLOTS, 0)):
            expert = T.Cast("int32", s_cand[(s + _SLOTS) * _TOKENS + t])
            v = s_row[base + expert]
            if v > top_v[top_k - 1]:
                for q in T.unroll(top_k - 1):
                    p = top_k - 1 - q
                    if v > top_v[p]:
                        if v > top_v[p - 1]:
                            top_v[p] = top_v[p - 1]
                            top_i[p] = top_i[p - 1]
                        else:
                            top_v[p] = v
                            top_i[p] = expert
                if v > top_v[0]:
                    top_v[0] = v
                    top_i[0] = expert
        # Softmax over the k winners; top_v[0] is the largest logit. __expf and one reciprocal refined by a
        # Newton step are well inside the weights' tolerance.
        peak: T.float32 = top_v[0]
        total: T.float32 = T.float32(0.0)
        for p in T.unroll(top_k):
            top_v[p] = T.call_pure_extern("__expf", top_v[p] - peak, ty="float32")
            total = total + top_v[p]
        inv: T.float32 = T.call_pure_extern("__fdividef", T.float32(1.0), total, ty="float32")
        inv = inv * (T.float32(2.0) - total * inv)
        for p in T.unroll(top_k):
            top_v[p] = top_v[p] * inv
        # 16-byte stores: a warp's scalar stores to rows 32 bytes apart cost four times the store wavefronts.
        if tok < n:
            if T.constexpr(top_k % 4 == 0):
                for q in T.unroll(top_k // 4):
                    WT[tok, T.Ramp(q * 4, 1, 4)] = top_v[T.Ramp(q * 4, 1, 4)]
                    ID[tok, T.Ramp(q * 4, 1, 4)] = top_i[T.Ramp(q * 4, 1, 4)]
            else:
                for p in T.unroll(top_k):
                    WT[tok, p] = top_v[p]
                    ID[tok, p] = top_i[p]

    return softmax_topk


def _fmax(a, b):
    """fmaxf (FMNMX): T.max lowers to NaN-propagating compares and a select."""
    return T.call_pure_extern("fmaxf", a, b, ty="float32")


def _fmin(a, b):
    return T.call_pure_extern("fminf", a, b, ty="float32")


@functools.cache
def _compiled(experts, top_k, arch):
    return build_cuda(_kernel(experts, top_k), arch)


@functools.cache
def _cpu_compiled(experts, top_k):
    """Host (llvm) kernel: one parallel iteration per token; round r takes the largest logit that comes after the
    previous winner in the order (descending value, then ascending index), so ties go to the lower index."""
    if not 1 <= top_k <= experts:
        raise ValueError(f"top_k={top_k} must be in [1, experts={experts}]")
    n = T.dynamic("n")

    @T.function
    def softmax_topk_cpu(
        L: T.Tensor((n, experts), T.float32),
        WT: T.Tensor((n, top_k), T.float32),
        ID: T.Tensor((n, top_k), T.int32),
    ):
        for tok in T.parallel(n):
            # st: best value, previous winner's value, running sum; ix: best id, previous winner's id
            st = T.alloc_local((3,), T.float32)
            ix = T.alloc_local((2,), T.int32)
            ix[1] = -1
            st[1] = T.float32(0)
            for r in range(top_k):
                ix[0] = -1
                st[0] = T.float32(0)
                for e in range(experts):
                    x = L[tok, e]
                    after = (ix[1] < 0) | (x < st[1]) | ((x == st[1]) & (e > ix[1]))
                    if after & ((ix[0] < 0) | (x > st[0])):
                        st[0] = x
                        ix[0] = e
                WT[tok, r] = st[0]
                ID[tok, r] = ix[0]
                st[1] = st[0]
                ix[1] = ix[0]
            st[1] = WT[tok, 0]
            st[2] = T.float32(0)
            for r in range(top_k):
                WT[tok, r] = T.exp(WT[tok, r] - st[1])
                st[2] = st[2] + WT[tok, r]
            for r in range(top_k):
                WT[tok, r] = WT[tok, r] / st[2]

    return build_cpu(softmax_topk_cpu)


def _solve_cpu(logits, top_k):
    if logits.dtype != torch.float32 or logits.dim() != 2:
        raise TypeError("softmax_topk tirx kernel takes 2-D fp32 logits")
    top_k = int(top_k)
    tokens, experts = logits.shape
    logits = logits.contiguous()
    weights = torch.empty((tokens, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((tokens, top_k), dtype=torch.int32, device=logits.device)
    if tokens > 0:
        _cpu_compiled(experts, top_k)(logits, weights, ids)
    return weights, ids


def solve(logits, top_k):
    if not logits.is_cuda:
        return _solve_cpu(logits, top_k)
    if logits.dtype != torch.float32 or logits.dim() != 2:
        raise TypeError("softmax_topk tirx kernel takes 2-D fp32 logits")
    top_k = int(top_k)
    tokens, experts = logits.shape
    if experts % _GROUP or experts > 256 or not 1 <= top_k <= min(experts, _BLOCK):
        raise ValueError(f"softmax_topk tirx kernel: experts a multiple of {_GROUP} up to 256, top_k up to {_BLOCK}")
    logits = logits.contiguous()
    require_int32_indexing(logits)
    weights = torch.empty((tokens, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((tokens, top_k), dtype=torch.int32, device=logits.device)
    if tokens > 0:
        _compiled(experts, top_k, gpu_arch(logits.device))(logits, weights, ids)
    return weights, ids


def compile_for(arch: str, sizes: list[dict]) -> None:
    for experts, top_k in {(dims["experts"], dims["top_k"]) for dims in sizes}:  # tokens are dynamic
        nvcc_build(_compiled(experts, top_k, arch), f"experts={experts}, top_k={top_k}")
