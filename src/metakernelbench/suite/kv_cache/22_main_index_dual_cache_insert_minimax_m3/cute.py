"""MiniMax-M3 (1 + w) RMSNorm + partial NeoX RoPE + dual cache insert in CuTe DSL: one CTA per token, eight lanes
per head (29 heads: q, k, v, index q, index k).

Each lane holds two 16-byte chunks of its head (eight bf16 each), chosen so that RoPE's pairs meet in one thread:
lanes 0-3 hold chunks c and c + 4 (dims 8c.. and 8c + 32..: the rotated half-pairs), lanes 4-7 chunks 8-15 (the
pass-through dims). The head's sum of squares is a 3-step shuffle over its eight lanes. Each head then goes to its
own destination: q, index q, the k or v half of the token's kv_cache row, or its index_cache row.
"""
import functools

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from metakernelbench.suite.kits.common import gpu_arch, require_int32_indexing
from metakernelbench.suite.kits.cute import compile_kernel, fake_ptr, gmem_ptr, lanes_sum, stream_of

Q_HEADS, KV_HEADS, INDEX_Q_HEADS, HEAD_DIM = 16, 4, 4, 128
HEADS = Q_HEADS + 2 * KV_HEADS + INDEX_Q_HEADS + 1  # the last one is the index key
K_FIRST, V_FIRST, IQ_FIRST, IK_HEAD = Q_HEADS, Q_HEADS + KV_HEADS, Q_HEADS + 2 * KV_HEADS, HEADS - 1
ROTARY_DIM = 64
EPS = 1e-6
VEC = 8  # bf16 per 16-byte chunk
CHUNKS = HEAD_DIM // VEC  # 16 per head
ROPE_CHUNKS = ROTARY_DIM // 2 // VEC  # 4: chunk c < 4 pairs with chunk c + 4
LANES = CHUNKS // 2  # two chunks per lane
THREADS = (HEADS * LANES + 31) // 32 * 32


@cute.kernel
def _kernel(
    mQKV: cute.Tensor,  # (VEC, CHUNKS, HEADS, tokens) bf16
    mQw: cute.Tensor,  # (VEC, CHUNKS) bf16, and likewise the next three
    mKw: cute.Tensor,
    mIQw: cute.Tensor,
    mIKw: cute.Tensor,
    mPos: cute.Tensor,  # (tokens,) int64
    mCS: cute.Tensor,  # (VEC, 2 * ROPE_CHUNKS, positions) bf16: chunks 0-3 cos, 4-7 sin
    mSlot: cute.Tensor,  # (tokens,) int64
    mISlot: cute.Tensor,
    mKV: cute.Tensor,  # (VEC, 2 * CHUNKS, KV_HEADS, block_size, blocks) bf16: chunks 0-15 k, 16-31 v
    mIdx: cute.Tensor,  # (VEC, CHUNKS, slots) bf16: the index cache, one row per slot
    mQ: cute.Tensor,  # (VEC, CHUNKS, Q_HEADS, tokens) bf16
    mIQ: cute.Tensor,  # (VEC, CHUNKS, INDEX_Q_HEADS, tokens) bf16
    block_size: cutlass.Constexpr,
):
    tid, _, _ = cute.arch.thread_idx()
    t, _, _ = cute.arch.block_idx()
    # Threads past the last head (the CTA is a whole number of warps) redo the last head and store nothing, so every
    # lane of a warp takes part in the shuffles.
    own = tid // LANES
    head = cutlass.min(own, HEADS - 1)
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
    if head < K_FIRST:
        cute.autovec_copy(mQw[None, ca], wA)
        cute.autovec_copy(mQw[None, cb], wB)
    elif head < V_FIRST:
        cute.autovec_copy(mKw[None, ca], wA)
        cute.autovec_copy(mKw[None, cb], wB)
    elif head < IK_HEAD:  # v heads load a weight too and ignore it
        cute.autovec_copy(mIQw[None, ca], wA)
        cute.autovec_copy(mIQw[None, cb], wB)
    else:
        cute.autovec_copy(mIKw[None, ca], wA)
        cute.autovec_copy(mIKw[None, cb], wB)
    slot = mSlot[t]
    index_slot = mISlot[t]
    cos = cute.make_rmem_tensor((VEC,), dt)
    sin = cute.make_rmem_tensor((VEC,), dt)
    if lane < ROPE_CHUNKS:
        pos = mPos[t]
        cute.autovec_copy(mCS[None, lane, pos], cos)
        cute.autovec_copy(mCS[None, lane + ROPE_CHUNKS, pos], sin)

    xa = rA.load().to(cutlass.Float32)
    xb = rB.load().to(cutlass.Float32)
    ss = lanes_sum((xa * xa + xb * xb).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), 0), LANES)
    rstd = cute.math.rsqrt(ss * cutlass.Float32(1.0 / HEAD_DIM) + cutlass.Float32(EPS))
    # fp32 products, one rounding to bf16 at the end, as the reference: (x * rstd) * (1 + w).
    na = ((xa * rstd) * (wA.load().to(cutlass.Float32) + cutlass.Float32(1.0))).to(dt).to(cutlass.Float32)
    nb = ((xb * rstd) * (wB.load().to(cutlass.Float32) + cutlass.Float32(1.0))).to(dt).to(cutlass.Float32)

    oA = cute.make_rmem_tensor((VEC,), dt)
    oB = cute.make_rmem_tensor((VEC,), dt)
    oA.store(na.to(dt))
    oB.store(nb.to(dt))
    if lane < ROPE_CHUNKS:  # the rotation runs in fp32, rounded once
        c = cos.load().to(cutlass.Float32)
        s = sin.load().to(cutlass.Float32)
        oA.store((na * c - nb * s).to(dt))
        oB.store((nb * c + na * s).to(dt))

    if own < HEADS:
        if head < K_FIRST:
            cute.autovec_copy(oA, mQ[None, ca, head, t])
            cute.autovec_copy(oB, mQ[None, cb, head, t])
        elif head < IQ_FIRST:
            block = slot // block_size
            offset = slot % block_size
            if head < V_FIRST:
                cute.autovec_copy(oA, mKV[None, ca, head - K_FIRST, offset, block])
                cute.autovec_copy(oB, mKV[None, cb, head - K_FIRST, offset, block])
            else:
                cute.autovec_copy(rA, mKV[None, CHUNKS + ca, head - V_FIRST, offset, block])
                cute.autovec_copy(rB, mKV[None, CHUNKS + cb, head - V_FIRST, offset, block])
        elif head < IK_HEAD:
            cute.autovec_copy(oA, mIQ[None, ca, head - IQ_FIRST, t])
            cute.autovec_copy(oB, mIQ[None, cb, head - IQ_FIRST, t])
        else:
            cute.autovec_copy(oA, mIdx[None, ca, index_slot])
            cute.autovec_copy(oB, mIdx[None, cb, index_slot])


@cute.jit
def _launch(pQKV: cute.Pointer, pQw: cute.Pointer, pKw: cute.Pointer, pIQw: cute.Pointer, pIKw: cute.Pointer,
            pPos: cute.Pointer, pCS: cute.Pointer, pSlot: cute.Pointer, pISlot: cute.Pointer, pKV: cute.Pointer,
            pIdx: cute.Pointer, pQ: cute.Pointer, pIQ: cute.Pointer, tokens: cutlass.Int32, positions: cutlass.Int32,
            blocks: cutlass.Int32, block_size: cutlass.Constexpr, stream: cuda.CUstream):
    def heads_of(count, total):
        return cute.make_layout((VEC, CHUNKS, count, tokens), stride=(1, VEC, HEAD_DIM, total * HEAD_DIM))

    weight = cute.make_layout((VEC, CHUNKS), stride=(1, VEC))
    kv_row = 2 * HEAD_DIM
    kv = cute.make_layout((VEC, 2 * CHUNKS, KV_HEADS, block_size, blocks),
                          stride=(1, VEC, block_size * kv_row, kv_row, KV_HEADS * block_size * kv_row))
    index = cute.make_layout((VEC, CHUNKS, blocks * block_size), stride=(1, VEC, HEAD_DIM))
    cos_sin = cute.make_layout((VEC, 2 * ROPE_CHUNKS, positions), stride=(1, VEC, ROTARY_DIM))
    per_token = cute.make_layout((tokens,))
    _kernel(
        cute.make_tensor(pQKV, heads_of(HEADS, HEADS)), cute.make_tensor(pQw, weight), cute.make_tensor(pKw, weight),
        cute.make_tensor(pIQw, weight), cute.make_tensor(pIKw, weight), cute.make_tensor(pPos, per_token),
        cute.make_tensor(pCS, cos_sin), cute.make_tensor(pSlot, per_token), cute.make_tensor(pISlot, per_token),
        cute.make_tensor(pKV, kv), cute.make_tensor(pIdx, index), cute.make_tensor(pQ, heads_of(Q_HEADS, Q_HEADS)),
        cute.make_tensor(pIQ, heads_of(INDEX_Q_HEADS, INDEX_Q_HEADS)), block_size,
    ).launch(grid=(tokens, 1, 1), block=(THREADS, 1, 1), stream=stream)


@functools.cache
def _compiled(block_size, arch):
    """One compile per cache block size; tokens, positions and the number of cache blocks are runtime arguments."""
    bf16, i64 = fake_ptr(torch.bfloat16, 16), fake_ptr(torch.int64, 8)
    return compile_kernel(_launch, bf16, bf16, bf16, bf16, bf16, i64, bf16, i64, i64, bf16, bf16, bf16, bf16,
                          cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1), block_size, arch=arch)


def solve(qkv, q_norm_weight, k_norm_weight, index_q_norm_weight, index_k_norm_weight, positions, cos_sin_cache,
          slot_mapping, index_slot_mapping, kv_cache, index_cache):
    tokens, width = qkv.shape
    blocks, block_size = index_cache.shape[:2]
    if (width != HEADS * HEAD_DIM or cos_sin_cache.shape[1] != ROTARY_DIM
            or tuple(kv_cache.shape) != (blocks, KV_HEADS, block_size, 2 * HEAD_DIM)
            or tuple(index_cache.shape) != (blocks, block_size, HEAD_DIM)):
        raise ValueError(f"minimax_m3_cache_insert cute: {Q_HEADS}/{KV_HEADS}/{INDEX_Q_HEADS}/1 heads of {HEAD_DIM}, "
                         f"rotary dim {ROTARY_DIM}, caches [blocks, {KV_HEADS}, bs, 256] and [blocks, bs, 128] only")
    if any(t.dtype != torch.bfloat16 for t in (qkv, cos_sin_cache, kv_cache, index_cache, q_norm_weight,
                                                k_norm_weight, index_q_norm_weight, index_k_norm_weight)):
        raise TypeError("minimax_m3_cache_insert cute: bf16 qkv, weights, cos_sin_cache and caches")
    if any(t.dtype != torch.int64 for t in (positions, slot_mapping, index_slot_mapping)):
        raise TypeError("minimax_m3_cache_insert cute: int64 positions and slot mappings")
    if not (kv_cache.is_contiguous() and index_cache.is_contiguous()):
        raise ValueError("minimax_m3_cache_insert cute: caches must be contiguous to be updated in place")
    q = torch.empty((tokens, Q_HEADS, HEAD_DIM), dtype=qkv.dtype, device=qkv.device)
    index_q = torch.empty((tokens, INDEX_Q_HEADS, HEAD_DIM), dtype=qkv.dtype, device=qkv.device)
    if tokens == 0:
        return q, index_q, kv_cache, index_cache
    require_int32_indexing(qkv)
    qkv, cos_sin_cache = qkv.contiguous(), cos_sin_cache.contiguous()
    weights = [w.contiguous() for w in (q_norm_weight, k_norm_weight, index_q_norm_weight, index_k_norm_weight)]
    kernel = _compiled(block_size, gpu_arch(qkv.device))
    kernel(gmem_ptr(qkv, 16), *(gmem_ptr(w, 16) for w in weights), gmem_ptr(positions.contiguous(), 8),
           gmem_ptr(cos_sin_cache, 16), gmem_ptr(slot_mapping.contiguous(), 8),
           gmem_ptr(index_slot_mapping.contiguous(), 8), gmem_ptr(kv_cache, 16), gmem_ptr(index_cache, 16),
           gmem_ptr(q, 16), gmem_ptr(index_q, 16), tokens, cos_sin_cache.shape[0], blocks, stream_of(qkv))
    return q, index_q, kv_cache, index_cache


def compile_for(arch: str, sizes: list[dict]) -> None:
    for block_size in {dims["block_size"] for dims in sizes}:
        _compiled(block_size, arch)
