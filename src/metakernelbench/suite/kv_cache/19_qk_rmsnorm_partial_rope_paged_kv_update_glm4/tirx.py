"""Q/K RMSNorm + partial NeoX RoPE + paged KV update in TIRx: one CTA per token, eight lanes per head.

Each lane holds two 16-byte chunks of its head (eight bf16 each), chosen so that RoPE's pairs meet in one thread:
lanes 0-3 hold chunks c and c + 4 (dims 8c.. and 8c + 32..: the rotated half-pairs), lanes 4-7 chunks 8-15 (the
pass-through dims). The head's sum of squares is an 8-lane shuffle reduction. Q heads go to q; K heads (rotated) and
V heads (raw) go to the cache row of the token's slot, unless the slot is -1. On the host (llvm) one parallel
iteration per (token, head) does the same arithmetic.
"""
import functools

import torch
from tvm_tirx.script import tirx as T

from metakernelbench.suite.kits.common import gpu_arch, require_int32_indexing
from metakernelbench.suite.kits.tirx import NO_FAST_MATH, bf16_round, build_cpu, build_cuda, nvcc_build

HEAD_DIM = 128
ROTARY_DIM = 64
VEC = 8  # bf16 per 16-byte chunk
ROPE_CHUNKS = ROTARY_DIM // 2 // VEC  # 4: chunk c < 4 pairs with chunk c + 4
LANES = HEAD_DIM // VEC // 2  # two chunks per lane
CPU_PATH = True  # a host (llvm) build too: CI grades it on the CPU


def _bf16_cast(x):
    """fp32 to bf16 and back through casts: one rounding on CUDA, where the reference rounds after every bf16 operation
    (the host kernel rounds with the kit's bf16_round instead: llvm's cast round trip does not round)."""
    return T.float32(T.bfloat16(x))


def _kernel(q_heads, kv_heads):
    heads = q_heads + 2 * kv_heads
    threads = (heads * LANES + 31) // 32 * 32
    width = heads * HEAD_DIM
    row = kv_heads * HEAD_DIM
    inv_dim = 1.0 / HEAD_DIM
    n = T.dynamic("n")
    positions_count = T.dynamic("positions_count")
    slots = T.dynamic("slots")

    @T.function
    def qk_norm_rope_kv_update(
        qkv: T.Tensor((n, width), "bfloat16", data_alignment=16),
        positions: T.Tensor((n,), "int64"),
        q_norm_weight: T.Tensor((HEAD_DIM,), "bfloat16", data_alignment=16),
        k_norm_weight: T.Tensor((HEAD_DIM,), "bfloat16", data_alignment=16),
        cos_sin_cache: T.Tensor((positions_count, ROTARY_DIM), "bfloat16", data_alignment=16),
        slot_mapping: T.Tensor((n,), "int64"),
        kv_cache: T.Tensor((2, slots, row), "bfloat16", data_alignment=16),
        eps: T.float32,
        q: T.Tensor((n, q_heads * HEAD_DIM), "bfloat16", data_alignment=16),
    ):
        T.device_entry(launch=T.cuda.LaunchConfig(grid=n, block=threads), backend_config=NO_FAST_MATH)
        t = T.cuda.block_idx("x")
        tid = T.cuda.thread_idx("x")
        # Threads past the last head (the CTA is a whole number of warps) redo the last head and store nothing, so
        # every lane of a warp takes part in the shuffles.
        own = tid // LANES
        head = T.min(own, heads - 1)
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
        if head < q_heads:
            w[0:VEC] = q_norm_weight[T.Ramp(ca, 1, VEC)]
            w[VEC:2 * VEC] = q_norm_weight[T.Ramp(cb, 1, VEC)]
        else:
            w[0:VEC] = k_norm_weight[T.Ramp(ca, 1, VEC)]
            w[VEC:2 * VEC] = k_norm_weight[T.Ramp(cb, 1, VEC)]
        slot = slot_mapping[t]
        if lane < ROPE_CHUNKS:
            pos = T.Cast("int32", positions[t])  # positions index a table far below 2**31 rows
            cs[0:VEC] = cos_sin_cache[pos, T.Ramp(lane * VEC, 1, VEC)]
            cs[VEC:2 * VEC] = cos_sin_cache[pos, T.Ramp((lane + ROPE_CHUNKS) * VEC, 1, VEC)]
        acc[0] = T.float32(0)
        for e in T.unroll(2 * VEC):
            x[e] = T.float32(raw[e])
            acc[0] = acc[0] + x[e] * x[e]
        total = T.cuda.warp_reduce(acc[0], "sum", LANES)
        rstd = T.rsqrt(total * T.float32(inv_dim) + eps)
        for e in T.unroll(2 * VEC):
            x[e] = _bf16_cast(_bf16_cast(x[e] * rstd) * T.float32(w[e]))
        if lane < ROPE_CHUNKS:
            for e in T.unroll(VEC):
                out[e] = T.bfloat16(
                    _bf16_cast(x[e] * T.float32(cs[e])) - _bf16_cast(x[VEC + e] * T.float32(cs[VEC + e])))
                out[VEC + e] = T.bfloat16(
                    _bf16_cast(x[VEC + e] * T.float32(cs[e])) + _bf16_cast(x[e] * T.float32(cs[VEC + e])))
        else:
            for e in T.unroll(2 * VEC):
                out[e] = T.bfloat16(x[e])
        if own < heads:
            if head < q_heads:
                q[t, T.Ramp(head * HEAD_DIM + ca, 1, VEC)] = out[T.Ramp(0, 1, VEC)]
                q[t, T.Ramp(head * HEAD_DIM + cb, 1, VEC)] = out[T.Ramp(VEC, 1, VEC)]
            elif slot >= T.int64(0):
                # int64 offsets: slots * row can pass 2**31 elements in a large pool.
                if head < q_heads + kv_heads:
                    base = T.int64((head - q_heads) * HEAD_DIM)
                    kv_cache[0, slot, T.Ramp(base + T.int64(ca), 1, VEC)] = out[T.Ramp(0, 1, VEC)]
                    kv_cache[0, slot, T.Ramp(base + T.int64(cb), 1, VEC)] = out[T.Ramp(VEC, 1, VEC)]
                else:
                    base = T.int64((head - q_heads - kv_heads) * HEAD_DIM)
                    kv_cache[1, slot, T.Ramp(base + T.int64(ca), 1, VEC)] = raw[T.Ramp(0, 1, VEC)]
                    kv_cache[1, slot, T.Ramp(base + T.int64(cb), 1, VEC)] = raw[T.Ramp(VEC, 1, VEC)]

    return qk_norm_rope_kv_update


def _cpu_kernel(q_heads, kv_heads):
    """Host (llvm) kernel: one parallel iteration per (token, head), rounding to bf16 where the reference does."""
    heads = q_heads + 2 * kv_heads
    row = kv_heads * HEAD_DIM
    half = ROTARY_DIM // 2
    inv_dim = 1.0 / HEAD_DIM
    n = T.dynamic("n")
    positions_count = T.dynamic("positions_count")
    slots = T.dynamic("slots")

    @T.function
    def qk_norm_rope_kv_update_cpu(
        qkv: T.Tensor((n, heads * HEAD_DIM), "bfloat16"),
        positions: T.Tensor((n,), "int64"),
        q_norm_weight: T.Tensor((HEAD_DIM,), "bfloat16"),
        k_norm_weight: T.Tensor((HEAD_DIM,), "bfloat16"),
        cos_sin_cache: T.Tensor((positions_count, ROTARY_DIM), "bfloat16"),
        slot_mapping: T.Tensor((n,), "int64"),
        kv_cache: T.Tensor((2, slots, row), "bfloat16"),
        eps: T.float32,
        q: T.Tensor((n, q_heads * HEAD_DIM), "bfloat16"),
    ):
        for job in T.parallel(n * heads):
            t = job // heads
            h = job % heads
            x = T.alloc_local((HEAD_DIM,), "float32")
            st = T.alloc_local((4,), "float32")  # sum of squares, rstd, the pair being rotated
            if h < q_heads + kv_heads:
                st[0] = T.float32(0)
                for j in range(HEAD_DIM):
                    x[j] = T.float32(qkv[t, h * HEAD_DIM + j])
                    st[0] = st[0] + x[j] * x[j]
                st[1] = T.rsqrt(st[0] * T.float32(inv_dim) + eps)
                for j in range(HEAD_DIM):
                    x[j] = bf16_round(bf16_round(x[j] * st[1]) * T.if_then_else(
                        h < q_heads, T.float32(q_norm_weight[j]), T.float32(k_norm_weight[j])))
                for j in range(half):
                    st[2] = x[j]
                    st[3] = x[half + j]
                    x[j] = bf16_round(bf16_round(st[2] * T.float32(cos_sin_cache[positions[t], j]))
                                      - bf16_round(st[3] * T.float32(cos_sin_cache[positions[t], half + j])))
                    x[half + j] = bf16_round(bf16_round(st[3] * T.float32(cos_sin_cache[positions[t], j]))
                                             + bf16_round(st[2] * T.float32(cos_sin_cache[positions[t], half + j])))
                if h < q_heads:
                    for j in range(HEAD_DIM):
                        q[t, h * HEAD_DIM + j] = T.bfloat16(x[j])
                elif slot_mapping[t] >= T.int64(0):
                    for j in range(HEAD_DIM):
                        kv_cache[0, slot_mapping[t], (h - q_heads) * HEAD_DIM + j] = T.bfloat16(x[j])
            elif slot_mapping[t] >= T.int64(0):
                for j in range(HEAD_DIM):
                    kv_cache[1, slot_mapping[t], (h - q_heads - kv_heads) * HEAD_DIM + j] = qkv[t, h * HEAD_DIM + j]

    return qk_norm_rope_kv_update_cpu


@functools.cache
def _compiled(q_heads, kv_heads, arch):
    """One build per head layout (CUDA for an arch, host without); tokens, positions, cache slots and eps are runtime
    arguments."""
    return build_cuda(_kernel(q_heads, kv_heads), arch) if arch else build_cpu(_cpu_kernel(q_heads, kv_heads))


def solve(qkv, positions, q_norm_weight, k_norm_weight, cos_sin_cache, slot_mapping, kv_cache, eps):
    tokens, width = qkv.shape
    kv_heads, head_dim = kv_cache.shape[3:]
    q_heads = width // head_dim - 2 * kv_heads
    if head_dim != HEAD_DIM or cos_sin_cache.shape[1] != ROTARY_DIM or width % head_dim or q_heads < 1:
        raise ValueError(f"qk_norm_rope_kv_update tirx: heads of {HEAD_DIM} with rotary dim {ROTARY_DIM} only")
    if qkv.dtype != torch.bfloat16 or kv_cache.dtype != torch.bfloat16 or cos_sin_cache.dtype != torch.bfloat16:
        raise TypeError("qk_norm_rope_kv_update tirx: bf16 qkv, weights, cos_sin_cache and kv_cache")
    if positions.dtype != torch.int64 or slot_mapping.dtype != torch.int64:
        raise TypeError("qk_norm_rope_kv_update tirx: int64 positions and slot_mapping")
    if not kv_cache.is_contiguous():
        raise ValueError("qk_norm_rope_kv_update tirx: kv_cache must be contiguous to be updated in place")
    q = torch.empty((tokens, q_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    if tokens == 0:
        return q, kv_cache
    require_int32_indexing(qkv)
    _compiled(q_heads, kv_heads, gpu_arch(qkv.device) if qkv.is_cuda else None)(
        qkv.contiguous(), positions.contiguous(), q_norm_weight.contiguous(), k_norm_weight.contiguous(),
        cos_sin_cache.contiguous(), slot_mapping.contiguous(), kv_cache.view(2, -1, kv_heads * head_dim), float(eps),
        q.view(tokens, q_heads * head_dim))
    return q, kv_cache


def compile_for(arch: str, sizes: list[dict]) -> None:
    for dims in sizes:
        nvcc_build(_compiled(dims["q_heads"], dims["kv_heads"], arch), f"{dims['q_heads']}/{dims['kv_heads']} heads")
