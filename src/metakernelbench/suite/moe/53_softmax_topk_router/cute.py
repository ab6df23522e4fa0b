"""Softmax top-k router in CuTe DSL: one thread per token. The k-th largest of the token's group maxima bounds its
k-th largest logit from below, so only the few logits at or above it (about 10 of 128) are ranked: as exact 64-bit
keys (value descending, then expert id ascending, the tie rule), by sorting networks in registers.

The CTA's rows are staged in shared memory with coalesced cp.async copies; a row stride of an odd number of 16-byte
chunks lets each thread read its own row with conflict-free 16-byte loads. Logits must be finite or infinite: NaN
is outside the problem's domain (it is never selected here, where torch's sort ranks it first)."""
import functools

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_stream, make_ptr

TOKENS = 32  # tokens per CTA, one thread each
GROUP = 8  # logits per group maximum


def _batcher(n):
    """Comparator pairs (i, j), i < j, of Batcher's odd-even merge sort for n a power of two."""
    pairs = []
    p = 1
    while p < n:
        k = p
        while k >= 1:
            for j in range(k % p, n - k, 2 * k):
                for i in range(min(k, n - j - k)):
                    if (i + j) // (2 * p) == (i + j + k) // (2 * p):
                        pairs.append((i + j, i + j + k))
            k //= 2
        p *= 2
    return pairs


def _sort_desc(xs, ce):
    """Sort a list descending with a comparator network; ce(a, b) returns (larger, smaller)."""
    xs = list(xs)
    for i, j in _batcher(len(xs)):
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


def _dce(a, b):
    """Compare-exchange of two keys: one DSETP and four selects. Keys are never NaN and never equal, and sm_90
    has no DMNMX: max.f64 becomes a DSETP.MAX, selects and NaN fix-ups."""
    first = a > b
    return cutlass.Float64(cutlass.select_(first, a, b)), cutlass.Float64(cutlass.select_(first, b, a))


def _dmax(a, b):
    return cutlass.Float64(cutlass.select_(a > b, a, b))


class _TopKRouter:
    def __init__(self, experts: int, top_k: int):
        self.E, self.K = experts, top_k
        self.S = max(8, 1 << (top_k - 1).bit_length())  # candidates sorted per block
        self.groups = experts // GROUP
        self.row = experts + 4  # an odd number of 16-byte chunks: a column of LDS.128 is bank-conflict free
        self.code_bits = (experts - 1).bit_length()

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
        E, K, S = self.E, self.K, self.S
        n = mL.shape[0]
        first = bidx * TOKENS
        tok = first + tidx
        sRow = cute.make_tensor(cute.arch.alloc_smem(cutlass.Float32, TOKENS * self.row, 16),
                                cute.make_layout((TOKENS, self.row), stride=(self.row, 1)))
        sCand = cute.make_tensor(cute.arch.alloc_smem(cutlass.Uint8, TOKENS * E, 16), cute.make_layout(TOKENS * E))

        # Stage the CTA's rows: instruction r copies row r, 16 bytes a thread, so every copy is coalesced.
        chunks = E // 4
        g2s = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(), cutlass.Float32, num_bits_per_copy=128)
        for q in cutlass.range_constexpr(chunks):
            lin = q * TOKENS + tidx
            r = lin // chunks
            c = lin % chunks
            src_row = cutlass.min(first + r, n - 1)  # tail rows repeat the last token; their results are not stored
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

        # Candidates: the ids of this token's logits at or above the bound, in shared memory, slot-major (candidate
        # j of thread t at j * TOKENS + t, so the warp's stores rarely share a bank). The write position itself is
        # the counter: a logit costs a compare, a predicated store and a predicated increment.
        start = tidx
        pos = start
        for c in cutlass.range_constexpr(chunks):
            cute.autovec_copy(mine[None, c], frag)
            for e in cutlass.range_constexpr(4):
                if frag[e] >= bound:
                    sCand[pos] = cutlass.Uint8(c * 4 + e)
                    pos = pos + TOKENS
        count = (pos - start) // TOKENS

        # Top S of the candidates: sort each block of S keys, fold it into the running top S.
        best = cute.make_rmem_tensor((S,), cutlass.Float64)
        self._block_keys(sRow, sCand, tidx, count, 0, best)
        cur = _sort_desc([best[i] for i in range(S)], _dce)
        for i in cutlass.range_constexpr(S):
            best[i] = cur[i]
        blk = cute.make_rmem_tensor((S,), cutlass.Float64)
        for b in cutlass.range(1, (count + S - 1) // S):
            self._block_keys(sRow, sCand, tidx, count, b * S, blk)
            new = _sort_desc([blk[i] for i in range(S)], _dce)
            cur = _bitonic_desc([_dmax(best[i], new[S - 1 - i]) for i in range(S)], _dce)
            for i in cutlass.range_constexpr(S):
                best[i] = cur[i]

        # Softmax over the k winners; best[0] holds the largest logit.
        rW = cute.make_rmem_tensor((K,), cutlass.Float32)
        rI = cute.make_rmem_tensor((K,), cutlass.Int32)
        peak = best[0].to(cutlass.Float32)
        total = cutlass.Float32(0.0)
        for i in cutlass.range_constexpr(K):
            v, expert = _decode(best[i], self.code_bits)
            x = cute.math.exp(v - peak)
            rW[i] = x
            rI[i] = expert
            total = total + x
        for i in cutlass.range_constexpr(K):
            rW[i] = rW[i] / total
        if tok < n:
            cute.autovec_copy(rW, mW[tok, None])
            cute.autovec_copy(rI, mI[tok, None])

    @cute.jit
    def _block_keys(self, sRow: cute.Tensor, sCand: cute.Tensor, t: cutlass.Int32, count: cutlass.Int32,
                    start: cutlass.Int32, keys: cute.Tensor):
        """Keys of candidates start .. start + S - 1; -inf past the last candidate (it ranks below every key)."""
        for s in cutlass.range_constexpr(self.S):
            slot = start + s
            expert = cutlass.Int32(sCand[cutlass.min(slot, self.E - 1) * TOKENS + t])
            key = _encode(sRow[t, expert], expert, self.code_bits)
            keys[s] = cutlass.Float64(cutlass.select_(slot < count, key, cutlass.Float64(-float("inf"))))


_FLT_MAX = 3.4028234663852886e38


@cute.jit
def _encode(v: cutlass.Float32, expert: cutlass.Int32, code_bits: cutlass.Constexpr) -> cutlass.Float64:
    """A double ordered like (v descending, expert ascending): v widened exactly (-0.0 as +0.0, as torch's sort
    ties them; infinities clamped to the largest finite floats), its low code_bits (zero in a widened float)
    replaced by the expert id, complemented for v >= 0 so that the lower id is the larger key either way."""
    finite = cute.arch.fmin(cute.arch.fmax(v, cutlass.Float32(-_FLT_MAX)), cutlass.Float32(_FLT_MAX))
    d = cutlass.Float64(finite + cutlass.Float32(0.0))
    bits = d.bitcast(cutlass.Int64)
    mask = (1 << code_bits) - 1
    code = cutlass.Int64(cutlass.select_(bits < 0, expert, mask - expert))
    return ((bits & cutlass.Int64(~mask)) | code).bitcast(cutlass.Float64)


@cute.jit
def _decode(key: cutlass.Float64, code_bits: cutlass.Constexpr):
    bits = key.bitcast(cutlass.Int64)
    mask = (1 << code_bits) - 1
    code = cutlass.Int32(bits & cutlass.Int64(mask))
    expert = cutlass.Int32(cutlass.select_(bits < 0, code, mask - code))
    return key.to(cutlass.Float32), expert


@functools.lru_cache(maxsize=None)
def _compiled(experts, top_k, arch):
    """Compile once per expert count, k and arch; the token count stays dynamic."""
    logits = make_ptr(cutlass.Float32, 0, cute.AddressSpace.gmem, assumed_align=16)
    w = make_ptr(cutlass.Float32, 0, cute.AddressSpace.gmem, assumed_align=16)
    i = make_ptr(cutlass.Int32, 0, cute.AddressSpace.gmem, assumed_align=16)
    return cute.compile(_TopKRouter(experts, top_k), logits, w, i, cutlass.Int32(1), make_fake_stream(),
                        options=f"--gpu-arch {arch}")


@functools.lru_cache(maxsize=None)
def _arch(device):
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def solve(logits, top_k):
    tokens, experts = logits.shape
    top_k = int(top_k)
    if not 0 < top_k <= experts:
        raise ValueError(f"softmax_topk_router cute: top_k={top_k} must lie in [1, {experts}]")
    if logits.dtype != torch.float32 or experts % GROUP or experts > 256:
        raise ValueError("softmax_topk_router cute: fp32 logits, experts a multiple of 8 and at most 256")
    logits = logits.contiguous()
    weights = torch.empty((tokens, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((tokens, top_k), dtype=torch.int32, device=logits.device)
    if tokens == 0:
        return weights, ids
    if logits.numel() >= 2**31:
        raise ValueError("softmax_topk_router cute: 32-bit indexing supports fewer than 2**31 logits")
    kernel = _compiled(experts, top_k, _arch(logits.device))
    gmem = cute.AddressSpace.gmem
    kernel(make_ptr(cutlass.Float32, logits.data_ptr(), gmem, assumed_align=16),
           make_ptr(cutlass.Float32, weights.data_ptr(), gmem, assumed_align=16),
           make_ptr(cutlass.Int32, ids.data_ptr(), gmem, assumed_align=16),
           tokens, cuda.CUstream(torch.cuda.current_stream(logits.device).cuda_stream))
    return weights, ids


def compile_for(arch: str) -> None:
    _compiled(128, 8, arch)  # "full" and "odd": 128 experts, top 8, fp32; tokens are dynamic
