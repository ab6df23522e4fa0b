"""Softmax top-k router in CuTe DSL: 8 lanes per token hold its logits in registers; k rounds of shuffle max + argmin."""
import functools

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_stream, make_ptr

THREADS = 128
_DTYPES = {torch.float32: cutlass.Float32, torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16}


class _TopKRouter:
    def __init__(self, experts: int, top_k: int, vec: int):
        self.experts, self.top_k, self.vec = experts, top_k, vec
        self.nvec = experts // vec
        # About 16 logits per lane: fewer lanes per token means fewer shuffle levels per round, more means
        # longer per-lane scans; 8 lanes for 128 experts balances the two.
        lanes = 1
        while lanes * 2 <= min(32, max(1, self.nvec * vec // 16)):
            lanes *= 2
        self.lanes = lanes
        self.per_lane = -(-self.nvec // lanes)

    @cute.jit
    def __call__(self, pL: cute.Pointer, pW: cute.Pointer, pI: cute.Pointer, tokens: cutlass.Int32,
                 stream: cuda.CUstream):
        # Raw pointers and a runtime token count: no DLPack conversion per call, one compile per (experts, k).
        mL = cute.make_tensor(pL, cute.make_layout((tokens, self.experts), stride=(self.experts, 1)))
        out = cute.make_layout((tokens, self.top_k), stride=(self.top_k, 1))
        mW, mI = cute.make_tensor(pW, out), cute.make_tensor(pI, out)
        per_cta = THREADS // self.lanes
        self.kernel(mL, mW, mI).launch(grid=((tokens + per_cta - 1) // per_cta, 1, 1), block=(THREADS, 1, 1),
                                       stream=stream)

    @cute.kernel
    def kernel(self, mL: cute.Tensor, mW: cute.Tensor, mI: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        V, G, K = self.vec, self.lanes, self.top_k
        tok = bidx * (THREADS // G) + tidx // G
        lane = tidx % G
        live = tok < mL.shape[0]
        load = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), mL.element_type,
                                   num_bits_per_copy=V * mL.element_type.width)
        # Lane l holds vectors l, l + G, ...: each load instruction of a token's G lanes reads one contiguous run.
        gL = cute.zipped_divide(mL[tok, None], (V,))
        rL = cute.make_rmem_tensor((V, self.per_lane), mL.element_type)
        rL.fill(float("nan"))  # NaN is never selected: it marks padding and, below, experts already taken
        if live:
            for j in cutlass.range_constexpr(self.per_lane):
                if lane + G * j < self.nvec:
                    cute.copy(load, gL[None, lane + G * j], rL[None, j])
        rV = cute.make_rmem_tensor((V, self.per_lane), cutlass.Float32)
        rV.store(rL.load().to(cutlass.Float32))
        base = lane * V  # expert id of slot (e, j) is base + (G * j * V + e)

        nan = cutlass.Float32(float("nan"))
        vals, ids = [], []
        for _ in cutlass.range_constexpr(K):
            # Each round takes the largest remaining logit, then the lowest expert id holding it (the tie
            # rule). max.f32 skips NaN, so taken experts and padding drop out; -inf logits stay selectable.
            best = cutlass.Float32(-float("inf"))
            for j in cutlass.range_constexpr(self.per_lane):
                for e in cutlass.range_constexpr(V):
                    best = cute.arch.fmax(best, rV[e, j])
            for s in cutlass.range_constexpr(G.bit_length() - 1):
                best = cute.arch.fmax(best, cute.arch.shuffle_sync_bfly(best, offset=G >> (s + 1)))
            arg = cutlass.Int32(self.experts)
            for j in cutlass.range_constexpr(self.per_lane - 1, -1, -1):
                for e in cutlass.range_constexpr(V - 1, -1, -1):
                    arg = cutlass.Int32(cutlass.select_(rV[e, j] == best, base + (G * j * V + e), arg))
            for s in cutlass.range_constexpr(G.bit_length() - 1):
                arg = cutlass.min(arg, cute.arch.shuffle_sync_bfly(arg, offset=G >> (s + 1)))
            vals.append(best)
            ids.append(arg)
            d = arg - base
            for j in cutlass.range_constexpr(self.per_lane):
                for e in cutlass.range_constexpr(V):
                    rV[e, j] = cutlass.Float32(cutlass.select_(d == G * j * V + e, nan, rV[e, j]))

        # Softmax over the selected logits; vals[0] is their maximum.
        ex = [cute.math.exp(v - vals[0]) for v in vals]
        total = ex[0]
        for r in cutlass.range_constexpr(1, K):
            total = total + ex[r]
        # Lane l writes entries l, l + G, ... of its token, so a warp's stores are contiguous.
        for c in cutlass.range_constexpr(-(-K // G)):
            w, i = ex[c * G] / total, ids[c * G]
            for q in cutlass.range_constexpr(1, min(G, K - c * G)):
                w = cutlass.Float32(cutlass.select_(lane == q, ex[c * G + q] / total, w))
                i = cutlass.Int32(cutlass.select_(lane == q, ids[c * G + q], i))
            if live and c * G + lane < K:
                mW[tok, c * G + lane] = w
                mI[tok, c * G + lane] = i


@functools.lru_cache(maxsize=None)
def _compiled(experts, top_k, dtype, vec, arch):
    """Compile once per expert count, k, dtype, vector width and arch; the token count stays dynamic."""
    dt = _DTYPES[dtype]
    logits = make_ptr(dt, 0, cute.AddressSpace.gmem, assumed_align=vec * dt.width // 8)
    w = make_ptr(cutlass.Float32, 0, cute.AddressSpace.gmem, assumed_align=4)
    i = make_ptr(cutlass.Int32, 0, cute.AddressSpace.gmem, assumed_align=4)
    return cute.compile(_TopKRouter(experts, top_k, vec), logits, w, i, cutlass.Int32(1), make_fake_stream(),
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
    logits = logits.contiguous()
    weights = torch.empty((tokens, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((tokens, top_k), dtype=torch.int32, device=logits.device)
    if tokens == 0:
        return weights, ids
    if logits.numel() >= 2**31:
        raise ValueError("softmax_topk_router cute: 32-bit indexing supports fewer than 2**31 logits")
    pl, size = logits.data_ptr(), logits.element_size()
    vec = 16 // size
    while vec > 1 and (experts % vec or pl % (vec * size)):
        vec //= 2
    kernel = _compiled(experts, top_k, logits.dtype, vec, _arch(logits.device))
    gmem = cute.AddressSpace.gmem
    kernel(make_ptr(_DTYPES[logits.dtype], pl, gmem, assumed_align=vec * size),
           make_ptr(cutlass.Float32, weights.data_ptr(), gmem, assumed_align=4),
           make_ptr(cutlass.Int32, ids.data_ptr(), gmem, assumed_align=4),
           tokens, cuda.CUstream(torch.cuda.current_stream(logits.device).cuda_stream))
    return weights, ids


def compile_for(arch: str) -> None:
    _compiled(128, 8, torch.float32, 4, arch)  # "full" and "odd": 128 experts, top 8, fp32; tokens are dynamic
