"""MiniMax-M3 (1 + w) RMSNorm + partial NeoX RoPE + dual cache insert in TIRx: one CTA per token, eight lanes per
head (29 heads: q, k, v, index q, index k).

Each lane holds two 16-byte chunks of its head (eight bf16 each), chosen so that RoPE's pairs meet in one thread:
lanes 0-3 hold chunks c and c + 4 (dims 8c.. and 8c + 32..: the rotated half-pairs), lanes 4-7 chunks 8-15 (the
pass-through dims). The head's sum of squares is an 8-lane shuffle reduction. Each head then goes to its own
destination: q, index q, the k or v half of the token's kv_cache row, or its index_cache row. On the host (llvm) one
parallel iteration per (token, head) does the same arithmetic.
"""
import functools

import torch
from tvm_tirx.script import tirx as T

from metakernelbench.suite.kits.common import gpu_arch, require_int32_indexing
from metakernelbench.suite.kits.tirx import NO_FAST_MATH, bf16_round, build_cpu, build_cuda, fp32, nvcc_build

Q_HEADS, KV_HEADS, INDEX_Q_HEADS, HEAD_DIM = 16, 4, 4, 128
HEADS = Q_HEADS + 2 * KV_HEADS + INDEX_Q_HEADS + 1  # the last one is the index key
K_FIRST, V_FIRST, IQ_FIRST, IK_HEAD = Q_HEADS, Q_HEADS + KV_HEADS, Q_HEADS + 2 * KV_HEADS, HEADS - 1
ROTARY_DIM = 64
EPS = 1e-6
VEC = 8  # bf16 per 16-byte chunk
ROPE_CHUNKS = ROTARY_DIM // 2 // VEC  # 4: chunk c < 4 pairs with chunk c + 4
LANES = HEAD_DIM // VEC // 2  # two chunks per lane
THREADS = (HEADS * LANES + 31) // 32 * 32
CPU_PATH = True  # a host (llvm) build too: CI grades it on the CPU


def _kernel(block_size):
    inv_dim = 1.0 / HEAD_DIM
    eps = fp32(EPS)
    kv_row = 2 * HEAD_DIM
    n = T.dynamic("n")
    positions_count = T.dynamic("positions_count")
    blocks = T.dynamic("blocks")
    index_rows = T.dynamic("index_rows")  # blocks * block_size: solve checks that the two caches agree

    @T.function
    def minimax_m3_cache_insert(
        qkv: T.Tensor((n, HEADS * HEAD_DIM), "bfloat16", data_alignment=16),
        q_norm_weight: T.Tensor((HEAD_DIM,), "bfloat16", data_alignment=16),
        k_norm_weight: T.Tensor((HEAD_DIM,), "bfloat16", data_alignment=16),
        index_q_norm_weight: T.Tensor((HEAD_DIM,), "bfloat16", data_alignment=16),
        index_k_norm_weight: T.Tensor((HEAD_DIM,), "bfloat16", data_alignment=16),
        positions: T.Tensor((n,), "int64"),
        cos_sin_cache: T.Tensor((positions_count, ROTARY_DIM), "bfloat16", data_alignment=16),
        slot_mapping: T.Tensor((n,), "int64"),
        index_slot_mapping: T.Tensor((n,), "int64"),
        kv_cache: T.Tensor((blocks, KV_HEADS, block_size, kv_row), "bfloat16", data_alignment=16),
        index_cache: T.Tensor((index_rows, HEAD_DIM), "bfloat16", data_alignment=16),
        q: T.Tensor((n, Q_HEADS * HEAD_DIM), "bfloat16", data_alignment=16),
        index_q: T.Tensor((n, INDEX_Q_HEADS * HEAD_DIM), "bfloat16", data_alignment=16),
    ):
        T.device_entry(launch=T.cuda.LaunchConfig(grid=n, block=THREADS), backend_config=NO_FAST_MATH)
        t = T.cuda.block_idx("x")
        tid = T.cuda.thread_idx("x")
        # Threads past the last head (the CTA is a whole number of warps) redo the last head and store nothing, so
        # every lane of a warp takes part in the shuffles.
        own = tid // LANES
        head = T.min(own, HEADS - 1)
        lane = tid % LANES
        ca = (lane % ROPE_CHUNKS + 2 * ROPE_CHUNKS * (lane // ROPE_CHUNKS)) * VEC
        cb = ca + ROPE_CHUNKS * VEC
        raw = T.alloc_local((2 * VEC,), "bfloat16")
        w = T.alloc_local((2 * VEC,), "bfloat16")
        cs = T.alloc_local((2 * VEC,), "bfloat16")
        x = T.alloc_local((2 * VEC,), "float32")
        out = T.alloc_local((2 * VEC,), "bfloat16")
        acc = T.alloc_local((1,), "float32")
        raw[0:VEC] = qkv[t, T.Ramp(head * HEAD_DIM + ca, 1, VEC)]
        raw[VEC:2 * VEC] = qkv[t, T.Ramp(head * HEAD_DIM + cb, 1, VEC)]
        if head < K_FIRST:
            w[0:VEC] = q_norm_weight[T.Ramp(ca, 1, VEC)]
            w[VEC:2 * VEC] = q_norm_weight[T.Ramp(cb, 1, VEC)]
        elif head < V_FIRST:
            w[0:VEC] = k_norm_weight[T.Ramp(ca, 1, VEC)]
            w[VEC:2 * VEC] = k_norm_weight[T.Ramp(cb, 1, VEC)]
        elif head < IK_HEAD:  # v heads load a weight too and ignore it
            w[0:VEC] = index_q_norm_weight[T.Ramp(ca, 1, VEC)]
            w[VEC:2 * VEC] = index_q_norm_weight[T.Ramp(cb, 1, VEC)]
        else:
            w[0:VEC] = index_k_norm_weight[T.Ramp(ca, 1, VEC)]
            w[VEC:2 * VEC] = index_k_norm_weight[T.Ramp(cb, 1, VEC)]
        slot = slot_mapping[t]
        index_slot = index_slot_mapping[t]
        if lane < ROPE_CHUNKS:
            pos = T.Cast("int32", positions[t])  # positions index a table far below 2**31 rows
            cs[0:VEC] = cos_sin_cache[pos, T.Ramp(lane * VEC, 1, VEC)]
            cs[VEC:2 * VEC] = cos_sin_cache[pos, T.Ramp((lane + ROPE_CHUNKS) * VEC, 1, VEC)]
        acc[0] = T.float32(0)
        for e in T.unroll(2 * VEC):
            x[e] = T.float32(raw[e])
            acc[0] = acc[0] + x[e] * x[e]
        total = T.cuda.warp_reduce(acc[0], "sum", LANES)
        rstd = T.rsqrt(total * T.float32(inv_dim) + T.float32(eps))
        # fp32 products, one rounding to bf16, as the reference: (x * rstd) * (1 + w).
        for e in T.unroll(2 * VEC):
            x[e] = T.float32(T.bfloat16((x[e] * rstd) * (T.float32(w[e]) + T.float32(1.0))))
        if lane < ROPE_CHUNKS:  # the rotation runs in fp32, rounded once
            for e in T.unroll(VEC):
                out[e] = T.bfloat16(x[e] * T.float32(cs[e]) - x[VEC + e] * T.float32(cs[VEC + e]))
                out[VEC + e] = T.bfloat16(x[VEC + e] * T.float32(cs[e]) + x[e] * T.float32(cs[VEC + e]))
        else:
            for e in T.unroll(2 * VEC):
                out[e] = T.bfloat16(x[e])
        if own < HEADS:
            if head < K_FIRST:
                q[t, T.Ramp(head * HEAD_DIM + ca, 1, VEC)] = out[T.Ramp(0, 1, VEC)]
                q[t, T.Ramp(head * HEAD_DIM + cb, 1, VEC)] = out[T.Ramp(VEC, 1, VEC)]
            elif head < IQ_FIRST:
                # int64 offsets: blocks * block_size * 4 * 256 can pass 2**31 elements in a large pool.
                block = slot // T.int64(block_size)
                offset = slot % T.int64(block_size)
                if head < V_FIRST:
                    kv_cache[block, head - K_FIRST, offset, T.Ramp(T.int64(ca), 1, VEC)] = out[T.Ramp(0, 1, VEC)]
                    kv_cache[block, head - K_FIRST, offset, T.Ramp(T.int64(cb), 1, VEC)] = out[T.Ramp(VEC, 1, VEC)]
                else:
                    kv_cache[block, head - V_FIRST, offset, T.Ramp(T.int64(HEAD_DIM + ca), 1, VEC)] = raw[
                        T.Ramp(0, 1, VEC)]
                    kv_cache[block, head - V_FIRST, offset, T.Ramp(T.int64(HEAD_DIM + cb), 1, VEC)] = raw[
                        T.Ramp(VEC, 1, VEC)]
            elif head < IK_HEAD:
                index_q[t, T.Ramp((head - IQ_FIRST) * HEAD_DIM + ca, 1, VEC)] = out[T.Ramp(0, 1, VEC)]
                index_q[t, T.Ramp((head - IQ_FIRST) * HEAD_DIM + cb, 1, VEC)] = out[T.Ramp(VEC, 1, VEC)]
            else:
                index_cache[index_slot, T.Ramp(T.int64(ca), 1, VEC)] = out[T.Ramp(0, 1, VEC)]
                index_cache[index_slot, T.Ramp(T.int64(cb), 1, VEC)] = out[T.Ramp(VEC, 1, VEC)]

    return minimax_m3_cache_insert


def _cpu_kernel(block_size):
    """Host (llvm) kernel: one parallel iteration per (token, head), rounding to bf16 where the reference does."""
    half = ROTARY_DIM // 2
    inv_dim = 1.0 / HEAD_DIM
    eps = fp32(EPS)
    n = T.dynamic("n")
    positions_count = T.dynamic("positions_count")
    blocks = T.dynamic("blocks")
    index_rows = T.dynamic("index_rows")

    @T.function
    def minimax_m3_cache_insert_cpu(
        qkv: T.Tensor((n, HEADS * HEAD_DIM), "bfloat16"),
        q_norm_weight: T.Tensor((HEAD_DIM,), "bfloat16"),
        k_norm_weight: T.Tensor((HEAD_DIM,), "bfloat16"),
        index_q_norm_weight: T.Tensor((HEAD_DIM,), "bfloat16"),
        index_k_norm_weight: T.Tensor((HEAD_DIM,), "bfloat16"),
        positions: T.Tensor((n,), "int64"),
        cos_sin_cache: T.Tensor((positions_count, ROTARY_DIM), "bfloat16"),
        slot_mapping: T.Tensor((n,), "int64"),
        index_slot_mapping: T.Tensor((n,), "int64"),
        kv_cache: T.Tensor((blocks, KV_HEADS, block_size, 2 * HEAD_DIM), "bfloat16"),
        index_cache: T.Tensor((index_rows, HEAD_DIM), "bfloat16"),
        q: T.Tensor((n, Q_HEADS * HEAD_DIM), "bfloat16"),
        index_q: T.Tensor((n, INDEX_Q_HEADS * HEAD_DIM), "bfloat16"),
    ):
        for job in T.parallel(n * HEADS):
            t = job // HEADS
            h = job % HEADS
            x = T.alloc_local((HEAD_DIM,), "float32")
            st = T.alloc_local((4,), "float32")  # sum of squares, rstd, the pair being rotated
            block = slot_mapping[t] // T.int64(block_size)
            offset = slot_mapping[t] % T.int64(block_size)
            if V_FIRST <= h and h < IQ_FIRST:
                for j in range(HEAD_DIM):
                    kv_cache[block, h - V_FIRST, offset, HEAD_DIM + j] = qkv[t, h * HEAD_DIM + j]
            else:
                st[0] = T.float32(0)
                for j in range(HEAD_DIM):
                    x[j] = T.float32(qkv[t, h * HEAD_DIM + j])
                    st[0] = st[0] + x[j] * x[j]
                st[1] = T.rsqrt(st[0] * T.float32(inv_dim) + T.float32(eps))
                for j in range(HEAD_DIM):
                    x[j] = bf16_round((x[j] * st[1]) * (T.float32(1.0) + T.if_then_else(
                        h < K_FIRST, T.float32(q_norm_weight[j]), T.if_then_else(
                            h < V_FIRST, T.float32(k_norm_weight[j]), T.if_then_else(
                                h < IK_HEAD, T.float32(index_q_norm_weight[j]), T.float32(index_k_norm_weight[j]))))))
                for j in range(half):
                    st[2] = x[j]
                    st[3] = x[half + j]
                    x[j] = bf16_round(st[2] * T.float32(cos_sin_cache[positions[t], j])
                                      - st[3] * T.float32(cos_sin_cache[positions[t], half + j]))
                    x[half + j] = bf16_round(st[3] * T.float32(cos_sin_cache[positions[t], j])
                                             + st[2] * T.float32(cos_sin_cache[positions[t], half + j]))
                for j in range(HEAD_DIM):
                    if h < K_FIRST:
                        q[t, h * HEAD_DIM + j] = T.bfloat16(x[j])
                    elif h < V_FIRST:
                        kv_cache[block, h - K_FIRST, offset, j] = T.bfloat16(x[j])
                    elif h < IK_HEAD:
                        index_q[t, (h - IQ_FIRST) * HEAD_DIM + j] = T.bfloat16(x[j])
                    else:
                        index_cache[index_slot_mapping[t], j] = T.bfloat16(x[j])

    return minimax_m3_cache_insert_cpu


@functools.cache
def _compiled(block_size, arch):
    """One build per cache block size (CUDA for an arch, host without); tokens, positions and the number of cache
    blocks are runtime arguments."""
    return build_cuda(_kernel(block_size), arch) if arch else build_cpu(_cpu_kernel(block_size))


def solve(qkv, q_norm_weight, k_norm_weight, index_q_norm_weight, index_k_norm_weight, positions, cos_sin_cache,
          slot_mapping, index_slot_mapping, kv_cache, index_cache):
    tokens, width = qkv.shape
    blocks, block_size = index_cache.shape[:2]
    if (width != HEADS * HEAD_DIM or cos_sin_cache.shape[1] != ROTARY_DIM
            or tuple(kv_cache.shape) != (blocks, KV_HEADS, block_size, 2 * HEAD_DIM)
            or tuple(index_cache.shape) != (blocks, block_size, HEAD_DIM)):
        raise ValueError(f"minimax_m3_cache_insert tirx: {Q_HEADS}/{KV_HEADS}/{INDEX_Q_HEADS}/1 heads of {HEAD_DIM}, "
                         f"rotary dim {ROTARY_DIM}, caches [blocks, {KV_HEADS}, bs, 256] and [blocks, bs, 128] only")
    if any(t.dtype != torch.bfloat16 for t in (qkv, cos_sin_cache, kv_cache, index_cache, q_norm_weight,
                                                k_norm_weight, index_q_norm_weight, index_k_norm_weight)):
        raise TypeError("minimax_m3_cache_insert tirx: bf16 qkv, weights, cos_sin_cache and caches")
    if any(t.dtype != torch.int64 for t in (positions, slot_mapping, index_slot_mapping)):
        raise TypeError("minimax_m3_cache_insert tirx: int64 positions and slot mappings")
    if not (kv_cache.is_contiguous() and index_cache.is_contiguous()):
        raise ValueError("minimax_m3_cache_insert tirx: caches must be contiguous to be updated in place")
    q = torch.empty((tokens, Q_HEADS, HEAD_DIM), dtype=qkv.dtype, device=qkv.device)
    index_q = torch.empty((tokens, INDEX_Q_HEADS, HEAD_DIM), dtype=qkv.dtype, device=qkv.device)
    if tokens == 0:
        return q, index_q, kv_cache, index_cache
    require_int32_indexing(qkv)
    _compiled(block_size, gpu_arch(qkv.device) if qkv.is_cuda else None)(
        qkv.contiguous(), q_norm_weight.contiguous(), k_norm_weight.contiguous(), index_q_norm_weight.contiguous(),
        index_k_norm_weight.contiguous(), positions.contiguous(), cos_sin_cache.contiguous(),
        slot_mapping.contiguous(), index_slot_mapping.contiguous(), kv_cache, index_cache.view(-1, HEAD_DIM),
        q.view(tokens, -1), index_q.view(tokens, -1))
    return q, index_q, kv_cache, index_cache


def compile_for(arch: str, sizes: list[dict]) -> None:
    for block_size in {dims["block_size"] for dims in sizes}:
        nvcc_build(_compiled(block_size, arch), f"block_size={block_size}")
