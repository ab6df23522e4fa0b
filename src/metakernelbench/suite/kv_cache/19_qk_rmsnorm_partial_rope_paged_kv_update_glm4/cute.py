"""Q/K RMSNorm + partial NeoX RoPE + paged KV update in CuTe DSL: one CTA per token, eight lanes per head.

Each lane holds two 16-byte chunks of its head (eight bf16 each), chosen so that RoPE's pairs meet in one thread:
lanes 0-3 hold chunks c and c + 4 (dims 8c.. and 8c + 32..: the rotated half-pairs), lanes 4-7 chunks 8-15 (the
pass-through dims). The head's sum of squares is a 3-step shuffle over its eight lanes. Q heads go to q; K heads
(rotated) and V heads (raw) go to the cache row of the token's slot, unless the slot is -1.
"""
import functools

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from metakernelbench.suite.kits.common import gpu_arch, require_int32_indexing
from metakernelbench.suite.kits.cute import compile_kernel, fake_ptr, gmem_ptr, lanes_sum, stream_of

HEAD_DIM = 128
ROTARY_DIM = 64
VEC = 8  # bf16 per 16-byte chunk
CHUNKS = HEAD_DIM // VEC  # 16 per head
ROPE_CHUNKS = ROTARY_DIM // 2 // VEC  # 4: chunk c < 4 pairs with chunk c + 4
LANES = CHUNKS // 2  # two chunks per lane


def _bf16_round(x):
    """Round fp32 values to bf16 and back: the reference rounds after every bf16 operation."""
    return x.to(cutlass.BFloat16).to(cutlass.Float32)


@cute.kernel
def _kernel(
    mQKV: cute.Tensor,  # (VEC, CHUNKS, heads, tokens) bf16
    mPos: cute.Tensor,  # (tokens,) int64
    mQw: cute.Tensor,  # (VEC, CHUNKS) bf16
    mKw: cute.Tensor,
    mCS: cute.Tensor,  # (VEC, 2 * ROPE_CHUNKS, positions) bf16: chunks 0-3 cos, 4-7 sin
    mSlot: cute.Tensor,  # (tokens,) int64
    mQ: cute.Tensor,  # (VEC, CHUNKS, q_heads, tokens) bf16
    mKc: cute.Tensor,  # (VEC, CHUNKS, kv_heads, slots) bf16: kv_cache[0] with one row per slot
    mVc: cute.Tensor,  # kv_cache[1], likewise
    eps: cutlass.Float32,
    q_heads: cutlass.Constexpr,
    kv_heads: cutlass.Constexpr,
):
    tid, _, _ = cute.arch.thread_idx()
    t, _, _ = cute.arch.block_idx()
    heads = q_heads + 2 * kv_heads
    # Threads past the last head (the CTA is a whole number of warps) redo the last head and store nothing, so every
    # lane of a warp takes part in the shuffles.
    own = tid // LANES
    head = cutlass.min(own, heads - 1)
    lane = tid % LANES
    ca = lane % ROPE_CHUNKS + 2 * ROPE_CHUNKS * (lane // ROPE_CHUNKS)
    cb = ca + ROPE_CHUNKS
    dt = mQKV.element_type

    rA = cute.make_rmem_tensor((VEC,), dt)
    rB = cute.make_rmem_tensor((VEC,), dt)
    cute.autovec_copy(mQKV[None, ca, head, t], rA)
    cute.autovec_copy(mQKV[None, cb, head, t], rB)
    wA = cute.make_rmem_tensor((VEC,), dt)
    wB = cute.make_rmem_tensor((VEC,), dt)
    if head < q_heads:
        cute.autovec_copy(mQw[None, ca], wA)
        cute.autovec_copy(mQw[None, cb], wB)
    else:
        cute.autovec_copy(mKw[None, ca], wA)
        cute.autovec_copy(mKw[None, cb], wB)
    slot = mSlot[t]
    cos = cute.make_rmem_tensor((VEC,), dt)
    sin = cute.make_rmem_tensor((VEC,), dt)
    if lane < ROPE_CHUNKS:
        pos = mPos[t]
        cute.autovec_copy(mCS[None, lane, pos], cos)
        cute.autovec_copy(mCS[None, lane + ROPE_CHUNKS, pos], sin)

    xa = rA.load().to(cutlass.Float32)
    xb = rB.load().to(cutlass.Float32)
    ss = lanes_sum((xa * xa + xb * xb).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), 0), LANES)
    rstd = cute.math.rsqrt(ss * cutlass.Float32(1.0 / HEAD_DIM) + eps)
    na = _bf16_round(_bf16_round(xa * rstd) * wA.load().to(cutlass.Float32))
    nb = _bf16_round(_bf16_round(xb * rstd) * wB.load().to(cutlass.Float32))

    oA = cute.make_rmem_tensor((VEC,), dt)
    oB = cute.make_rmem_tensor((VEC,), dt)
    oA.store(na.to(dt))
    oB.store(nb.to(dt))
    if lane < ROPE_CHUNKS:
        c = cos.load().to(cutlass.Float32)
        s = sin.load().to(cutlass.Float32)
        oA.store((_bf16_round(na * c) - _bf16_round(nb * s)).to(dt))
        oB.store((_bf16_round(nb * c) + _bf16_round(na * s)).to(dt))

    if own < heads:
        if head < q_heads:
            cute.autovec_copy(oA, mQ[None, ca, head, t])
            cute.autovec_copy(oB, mQ[None, cb, head, t])
        elif slot >= 0:
            if head < q_heads + kv_heads:
                cute.autovec_copy(oA, mKc[None, ca, head - q_heads, slot])
                cute.autovec_copy(oB, mKc[None, cb, head - q_heads, slot])
            else:
                cute.autovec_copy(rA, mVc[None, ca, head - q_heads - kv_heads, slot])
                cute.autovec_copy(rB, mVc[None, cb, head - q_heads - kv_heads, slot])


@cute.jit
def _launch(pQKV: cute.Pointer, pPos: cute.Pointer, pQw: cute.Pointer, pKw: cute.Pointer, pCS: cute.Pointer,
            pSlot: cute.Pointer, pQ: cute.Pointer, pKc: cute.Pointer, pVc: cute.Pointer, tokens: cutlass.Int32,
            positions: cutlass.Int32, slots: cutlass.Int32, eps: cutlass.Float32, q_heads: cutlass.Constexpr,
            kv_heads: cutlass.Constexpr, stream: cuda.CUstream):
    heads = q_heads + 2 * kv_heads
    threads = (heads * LANES + 31) // 32 * 32
    rows = cute.make_layout((VEC, CHUNKS, heads, tokens), stride=(1, VEC, HEAD_DIM, heads * HEAD_DIM))
    q = cute.make_layout((VEC, CHUNKS, q_heads, tokens), stride=(1, VEC, HEAD_DIM, q_heads * HEAD_DIM))
    cache = cute.make_layout((VEC, CHUNKS, kv_heads, slots), stride=(1, VEC, HEAD_DIM, kv_heads * HEAD_DIM))
    weight = cute.make_layout((VEC, CHUNKS), stride=(1, VEC))
    cos_sin = cute.make_layout((VEC, 2 * ROPE_CHUNKS, positions), stride=(1, VEC, ROTARY_DIM))
    _kernel(
        cute.make_tensor(pQKV, rows), cute.make_tensor(pPos, cute.make_layout((tokens,))),
        cute.make_tensor(pQw, weight), cute.make_tensor(pKw, weight), cute.make_tensor(pCS, cos_sin),
        cute.make_tensor(pSlot, cute.make_layout((tokens,))), cute.make_tensor(pQ, q), cute.make_tensor(pKc, cache),
        cute.make_tensor(pVc, cache), eps, q_heads, kv_heads,
    ).launch(grid=(tokens, 1, 1), block=(threads, 1, 1), stream=stream)


@functools.cache
def _compiled(q_heads, kv_heads, arch):
    """One compile per head layout; tokens, positions, cache slots and eps are runtime arguments."""
    bf16, i64 = fake_ptr(torch.bfloat16, 16), fake_ptr(torch.int64, 8)
    return compile_kernel(_launch, bf16, i64, bf16, bf16, bf16, i64, bf16, bf16, bf16, cutlass.Int32(1),
                          cutlass.Int32(1), cutlass.Int32(1), cutlass.Float32(1e-5), q_heads, kv_heads, arch=arch)


def solve(qkv, positions, q_norm_weight, k_norm_weight, cos_sin_cache, slot_mapping, kv_cache, eps):
    tokens, width = qkv.shape
    kv_heads, head_dim = kv_cache.shape[3:]
    q_heads = width // head_dim - 2 * kv_heads
    if head_dim != HEAD_DIM or cos_sin_cache.shape[1] != ROTARY_DIM or width % head_dim or q_heads < 1:
        raise ValueError(f"qk_norm_rope_kv_update cute: heads of {HEAD_DIM} with rotary dim {ROTARY_DIM} only")
    if qkv.dtype != torch.bfloat16 or kv_cache.dtype != torch.bfloat16 or cos_sin_cache.dtype != torch.bfloat16:
        raise TypeError("qk_norm_rope_kv_update cute: bf16 qkv, weights, cos_sin_cache and kv_cache")
    if positions.dtype != torch.int64 or slot_mapping.dtype != torch.int64:
        raise TypeError("qk_norm_rope_kv_update cute: int64 positions and slot_mapping")
    if not kv_cache.is_contiguous():
        raise ValueError("qk_norm_rope_kv_update cute: kv_cache must be contiguous to be updated in place")
    qkv, cos_sin_cache = qkv.contiguous(), cos_sin_cache.contiguous()
    q_norm_weight, k_norm_weight = q_norm_weight.contiguous(), k_norm_weight.contiguous()
    positions, slot_mapping = positions.contiguous(), slot_mapping.contiguous()
    q = torch.empty((tokens, q_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    if tokens == 0:
        return q, kv_cache
    require_int32_indexing(qkv)
    slots = kv_cache.shape[1] * kv_cache.shape[2]
    kernel = _compiled(q_heads, kv_heads, gpu_arch(qkv.device))
    kernel(gmem_ptr(qkv, 16), gmem_ptr(positions, 8), gmem_ptr(q_norm_weight, 16), gmem_ptr(k_norm_weight, 16),
           gmem_ptr(cos_sin_cache, 16), gmem_ptr(slot_mapping, 8), gmem_ptr(q, 16), gmem_ptr(kv_cache[0], 16),
           gmem_ptr(kv_cache[1], 16), tokens, cos_sin_cache.shape[0], slots, float(eps), stream_of(qkv))
    return q, kv_cache


def compile_for(arch: str, sizes: list[dict]) -> None:
    for dims in sizes:
        _compiled(dims["q_heads"], dims["kv_heads"], arch)
