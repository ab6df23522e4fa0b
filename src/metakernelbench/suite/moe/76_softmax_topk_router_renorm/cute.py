"""Softmax top-k router in CuTe DSL: one thread per token. The k-th largest of the token's group maxima bounds its
k-th largest logit from below, so only the few logits at or above it (about 10 of 128) are candidates. Their ids are
compacted in ascending order; the first SLOTS of them are ranked by pairwise compares, where slot order breaks ties
(equal logits go to the lower expert id, torch's stable-sort rule), and the rare later candidates are inserted.

The GPU is latency-bound here: 32768 tokens are only two warps per scheduler, so every instruction after the loads
land is on the critical path, and the kernel is built to spend few. The CTA's rows are staged in shared memory with
coalesced cp.async copies; a row stride of an odd number of 16-byte chunks lets each thread read its own row with
conflict-free 16-byte loads. Logits must be finite or infinite: NaN is outside the problem's domain (it is never
selected here, where torch's sort ranks it first)."""
import functools

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from metakernelbench.suite.kits.common import batcher_network, gpu_arch, require_int32_indexing
from metakernelbench.suite.kits.cute import compile_kernel, fake_ptr, gmem_ptr, stream_of

TOKENS = 32  # tokens per CTA, one thread each
GROUP = 8  # logits per group maximum
SLOTS = 16  # candidates ranked in registers; a token has more about 3% of the time
ONE = 0x3F800000  # the bits of 1.0f, 127 << 23; 127 is invertible mod 512 (127 * 383 = 1 mod 512)


def _sort_desc(xs, ce):
    """Sort a list descending with a comparator network; ce(a, b) returns (larger, smaller)."""
    xs = list(xs)
    for i, j in batcher_network(len(xs)):
        xs[i], xs[j] = ce(xs[i], xs[j])
    return xs


def _bitonic_desc(xs, ce):
    """Sort a bitonic list descending (half-cleaners)."""
    xs = list(xs)
    n = len(xs)
    k = n // 2
    while k >= 1:
        for i in range(n):
            if i % (2 * k) < k:
                xs[i], xs[i + k] = ce(xs[i], xs[i + k])
        k //= 2
    return xs


def _tree(xs, op):
    """Reduce with a balanced tree: independent operations issue back to back."""
    while len(xs) > 1:
        xs = [op(xs[i], xs[i + 1]) if i + 1 < len(xs) else xs[i] for i in range(0, len(xs), 2)]
    return xs[0]


def _fmax(a, b):
    return cute.arch.fmax(a, b)


def _fmin(a, b):
    return cute.arch.fmin(a, b)


def _fce(a, b):
    return cute.arch.fmax(a, b), cute.arch.fmin(a, b)


@dsl_user_op
def _ge_one(a, b, *, loc=None, ip=None):
    """The bits of 1.0f where a >= b, else 0: one FSET.BF (a compare and a select when written as a select_)."""
    return cutlass.Int32(llvm.inline_asm(
        T.i32(), [cutlass.Float32(a).ir_value(loc=loc, ip=ip), cutlass.Float32(b).ir_value(loc=loc, ip=ip)],
        "set.ge.f32.f32 $0, $1, $2;", "=r,f,f", has_side_effects=False, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT))


class _TopKRouter:
    def __init__(self, experts: int, top_k: int):
        self.E, self.K = experts, top_k
        self.groups = experts // GROUP
        self.row = experts + 4  # an odd number of 16-byte chunks: a column of LDS.128 is bank-conflict free

    @cute.jit
    def __call__(self, pL: cute.Pointer, pW: cute.Pointer, pI: cute.Pointer, tokens: cutlass.Int32,
                 stream: cuda.CUstream):
        mL = cute.make_tensor(pL, cute.make_layout((tokens, self.E), stride=(self.E, 1)))
        out = cute.make_layout((tokens, self.K), stride=(self.K, 1))
        mW, mI = cute.make_tensor(pW, out), cute.make_tensor(pI, out)
        self.kernel(mL, mW, mI).launch(grid=((tokens + TOKENS - 1) // TOKENS, 1, 1), block=(TOKENS, 1, 1),
                                       stream=stream)

    @cute.kernel
    def kernel(self, mL: cute.Tensor, mW: cute.Tensor, mI: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        E, K = self.E, self.K
        n = mL.shape[0]
        first = bidx * TOKENS
        tok = first + tidx
        sRow = cute.make_tensor(cute.arch.alloc_smem(cutlass.Float32, TOKENS * self.row, 16),
                                cute.make_layout((TOKENS, self.row), stride=(self.row, 1)))
        sCand = cute.make_tensor(cute.arch.alloc_smem(cutlass.Uint8, TOKENS * E, 16), cute.make_layout(TOKENS * E))
        # The ranked top k, slot-major; rank k is a scratch slot shared by every candidate ranked below it.
        sTopV = cute.make_tensor(cute.arch.alloc_smem(cutlass.Float32, TOKENS * (K + 1), 16),
                                 cute.make_layout(TOKENS * (K + 1)))
        sTopI = cute.make_tensor(cute.arch.alloc_smem(cutlass.Int32, TOKENS * (K + 1), 16),
                                 cute.make_layout(TOKENS * (K + 1)))

        # Stage the CTA's rows: every copy instruction is coalesced.
        chunks = E // 4
        g2s = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(), cutlass.Float32, num_bits_per_copy=128)
        if cutlass.const_expr(chunks == TOKENS):
            # Copy q moves row q; a full CTA's rows are contiguous, so its copies need no address arithmetic.
            if first + TOKENS <= n:
                mCta = cute.make_tensor(mL.iterator + cute.assume(first * E, divby=E),
                                        cute.make_layout((TOKENS, E), stride=(E, 1)))
                for q in cutlass.range_constexpr(TOKENS):
                    cute.copy(g2s, cute.zipped_divide(mCta[q, None], (4,))[None, tidx],
                              cute.zipped_divide(sRow[q, None], (4,))[None, tidx])
            else:
                for q in cutlass.range_constexpr(TOKENS):
                    src_row = cutlass.min(first + q, n - 1)  # tail rows repeat the last token; never stored
                    cute.copy(g2s, cute.zipped_divide(mL[src_row, None], (4,))[None, tidx],
                              cute.zipped_divide(sRow[q, None], (4,))[None, tidx])
        else:
            for q in cutlass.range_constexpr(chunks):
                lin = q * TOKENS + tidx
                r = lin // chunks
                c = lin % chunks
                src_row = cutlass.min(first + r, n - 1)
                cute.copy(g2s, cute.zipped_divide(mL[src_row, None], (4,))[None, c],
                          cute.zipped_divide(sRow[r, None], (4,))[None, c])
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()

        mine = cute.zipped_divide(sRow[tidx, None], (4,))
        frag = cute.make_rmem_tensor((4,), cutlass.Float32)
        ninf = cutlass.Float32(-float("inf"))

        # Bound: the k-th largest group maximum. Those k maxima are distinct logits, so the token's k-th largest
        # logit is at least the bound, and only logits at or above it can be among the top k.
        S = GROUP
        maxima = []
        for g in cutlass.range_constexpr(self.groups):
            vals = []
            for h in cutlass.range_constexpr(GROUP // 4):
                cute.autovec_copy(mine[None, g * (GROUP // 4) + h], frag)
                vals.extend(frag[e] for e in range(4))
            maxima.append(_tree(vals, _fmax))
        if cutlass.const_expr(K <= self.groups):
            maxima.extend([ninf] * (-len(maxima) % S))
            chunks_sorted = [_sort_desc(maxima[i:i + S], _fce) for i in range(0, len(maxima), S)]
            top = chunks_sorted[0]
            for other in chunks_sorted[1:]:
                top = [_fmax(top[i], other[S - 1 - i]) for i in range(S)]
                if cutlass.const_expr(K < S or other is not chunks_sorted[-1]):
                    top = _bitonic_desc(top, _fce)
            bound = top[K - 1] if cutlass.const_expr(K < S or len(chunks_sorted) == 1) else _tree(top, _fmin)
        else:
            bound = ninf

        # Candidates: the ids of this token's logits at or above the bound, ascending, in shared memory slot-major
        # (candidate j of thread t at j * TOKENS + t, so the warp's stores rarely share a bank). The write position
        # itself is the counter: a logit costs a compare, a predicated store and a predicated increment.
        pos = tidx
        for c in cutlass.range_constexpr(chunks):
            cute.autovec_copy(mine[None, c], frag)
            for e in cutlass.range_constexpr(4):
                if frag[e] >= bound:
                    sCand[pos] = cutlass.Uint8(c * 4 + e)
                    pos = pos + TOKENS
        count = (pos - tidx) // TOKENS

        # Rank the first SLOTS candidates (-inf past the last one): slot i ranks above slot j > i unless v_j > v_i.
        # Each pair is one FSET whose 1.0f bits are summed; rank * ONE mod 2**32 still determines the rank.
        ids = []
        vals = []
        for s in cutlass.range_constexpr(SLOTS):
            expert = cutlass.Int32(sCand[cutlass.min(s, E - 1) * TOKENS + tidx])
            ids.append(expert)
            vals.append(cutlass.Float32(cutlass.select_(s < count, sRow[tidx, expert], ninf)))
        above = [[] for _ in range(SLOTS)]  # terms that count a slot ranked above this one
        beaten = [[] for _ in range(SLOTS)]  # terms that count a later slot this one ranks above
        for i in cutlass.range_constexpr(SLOTS):
            for j in cutlass.range_constexpr(i + 1, SLOTS):
                c = _ge_one(vals[i], vals[j])
                above[j].append(c)
                beaten[i].append(c)
        for i in cutlass.range_constexpr(SLOTS):
            start = ((SLOTS - 1 - i) * ONE) % (1 << 32)  # as if every later slot ranked above slot i
            code = cutlass.Int32(start - (1 << 32) if start >= 1 << 31 else start)
            for x in above[i]:
                code = code + x
            for x in beaten[i]:
                code = code - x
            rank = ((code >> 23) * 383) & 511
            at = cutlass.min(rank, K) * TOKENS + tidx
            sTopV[at] = vals[i]
            sTopI[at] = ids[i]
        topV = cute.make_rmem_tensor((K,), cutlass.Float32)
        topI = cute.make_rmem_tensor((K,), cutlass.Int32)
        for p in cutlass.range_constexpr(K):
            topV[p] = sTopV[p * TOKENS + tidx]
            topI[p] = sTopI[p * TOKENS + tidx]

        # Later candidates have higher ids than every kept one, so only a strictly larger logit enters.
        for s in cutlass.range(SLOTS, count):
            expert = cutlass.Int32(sCand[s * TOKENS + tidx])
            v = sRow[tidx, expert]
            if v > topV[K - 1]:
                for p in cutlass.range_constexpr(K - 1, 0, -1):
                    shift = v > topV[p - 1]
                    take = v > topV[p]
                    topV[p] = cutlass.Float32(cutlass.select_(take, cutlass.select_(shift, topV[p - 1], v), topV[p]))
                    topI[p] = cutlass.Int32(cutlass.select_(take, cutlass.select_(shift, topI[p - 1], expert),
                                                            topI[p]))
                lead = v > topV[0]
                topV[0] = cutlass.Float32(cutlass.select_(lead, v, topV[0]))
                topI[0] = cutlass.Int32(cutlass.select_(lead, expert, topI[0]))

        # Softmax over the k winners; topV[0] is the largest logit. One reciprocal, refined by a Newton step.
        rW = cute.make_rmem_tensor((K,), cutlass.Float32)
        total = cutlass.Float32(0.0)
        for p in cutlass.range_constexpr(K):
            x = cute.math.exp(topV[p] - topV[0])
            rW[p] = x
            total = total + x
        inv = cute.arch.rcp_approx(total)
        inv = inv * (cutlass.Float32(2.0) - total * inv)
        for p in cutlass.range_constexpr(K):
            rW[p] = rW[p] * inv
        if tok < n:
            cute.autovec_copy(rW, mW[tok, None])
            cute.autovec_copy(topI, mI[tok, None])


@functools.cache
def _compiled(experts, top_k, arch):
    """Compile once per expert count, k and arch; the token count stays dynamic."""
    return compile_kernel(_TopKRouter(experts, top_k), fake_ptr(torch.float32, 16), fake_ptr(torch.float32, 16),
                          fake_ptr(torch.int32, 16), cutlass.Int32(1), arch=arch)


def solve(logits, top_k):
    tokens, experts = logits.shape
    top_k = int(top_k)
    if not 0 < top_k <= experts:
        raise ValueError(f"softmax_topk_router cute: top_k={top_k} must lie in [1, {experts}]")
    if top_k > SLOTS // 2:
        raise ValueError(f"softmax_topk_router cute: top_k={top_k} above {SLOTS // 2} is not supported")
    if logits.dtype != torch.float32 or experts % GROUP or experts > 256:
        raise ValueError("softmax_topk_router cute: fp32 logits, experts a multiple of 8 and at most 256")
    logits = logits.contiguous()
    weights = torch.empty((tokens, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((tokens, top_k), dtype=torch.int32, device=logits.device)
    if tokens == 0:
        return weights, ids
    require_int32_indexing(logits)
    kernel = _compiled(experts, top_k, gpu_arch(logits.device))
    kernel(gmem_ptr(logits, 16), gmem_ptr(weights, 16), gmem_ptr(ids, 16), tokens, stream_of(logits))
    return weights, ids


def compile_for(arch: str, sizes: list[dict]) -> None:
    for experts, top_k in {(dims["experts"], dims["top_k"]) for dims in sizes}:  # tokens are dynamic
        _compiled(experts, top_k, arch)
