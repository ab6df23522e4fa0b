"""Per-(token, head) FP8 cache append in TIRx: 8 lanes per head row, shuffle amax, 16-byte loads and code stores."""
import functools

import torch
from tvm_tirx.script import tirx as T

from metakernelbench.suite.kits.common import gpu_arch, require_int32_indexing
from metakernelbench.suite.kits.tirx import NO_FAST_MATH, build_cpu, build_cuda, e4m3_bits, fp32, nvcc_build

CPU_PATH = True
FP8_MAX = 448.0
MIN_SCALE = 1e-6
INV_FP8_MAX = fp32(1.0 / FP8_MAX)  # the scale is amax x fp32(1/448), as torch divides by a scalar on CUDA
_THREADS = 256
_CODES = 16  # codes per lane: one 16-byte store, fed by two 16-byte bf16 loads
_VEC = 8  # bf16 per 16-byte load


def _kernel(heads, head_dim):
    if head_dim % _CODES or (head_dim // _CODES) not in (2, 4, 8, 16, 32):
        raise ValueError(f"dynamic_quantized_cache_append tirx: head_dim {head_dim} is not 16 x a power of two "
                         "in 32..512")
    lanes = head_dim // _CODES
    min_scale = fp32(MIN_SCALE)  # the fp32 value the reference clamps to
    n = T.dynamic("n")
    slots = T.dynamic("slots")

    @T.function
    def quantized_cache_append(
        key: T.Tensor((n, heads, head_dim), T.bfloat16, align=16),
        value: T.Tensor((n, heads, head_dim), T.bfloat16, align=16),
        slot_mapping: T.Tensor((n,), T.int64),
        key_cache: T.Tensor((slots, heads, head_dim), T.float8_e4m3fn, align=16),
        value_cache: T.Tensor((slots, heads, head_dim), T.float8_e4m3fn, align=16),
        k_scale_cache: T.Tensor((slots, heads), T.float32),
        v_scale_cache: T.Tensor((slots, heads), T.float32),
    ):
        T.device_entry(
            launch=T.cuda.LaunchConfig(grid=T.ceildiv(n * heads * lanes, _THREADS), block=_THREADS),
            backend_config=NO_FAST_MATH,  # IEEE division and reciprocal, as the reference computes them
        )
        gtid = T.cuda.block_idx("x") * _THREADS + T.cuda.thread_idx("x")
        row = gtid // lanes
        lane = gtid % lanes
        # Tail rows still join the shuffles (full-warp masks): they read a valid token's slot and write nothing.
        t = T.min(row // heads, n - 1)
        h = row % heads
        s = slot_mapping[t]
        col = lane * _CODES
        xk = T.alloc_local((_CODES,), T.bfloat16)
        xv = T.alloc_local((_CODES,), T.bfloat16)
        qk = T.alloc_local((_CODES,), T.float8_e4m3fn)
        qv = T.alloc_local((_CODES,), T.float8_e4m3fn)
        for i in T.unroll(_CODES):
            xk[i] = T.bfloat16(0)
            xv[i] = T.bfloat16(0)
        write = (row < n * heads) & (s >= T.int64(0))
        if write:
            # Lane l owns elements [16 l, 16 l + 16) of its row: all four loads issue before any use.
            for j in T.unroll(2):
                xk[j * _VEC : j * _VEC + _VEC] = key[t, h, T.Ramp(col + j * _VEC, 1, _VEC)]
                xv[j * _VEC : j * _VEC + _VEC] = value[t, h, T.Ramp(col + j * _VEC, 1, _VEC)]
        amax_k: T.float32 = 0.0
        amax_v: T.float32 = 0.0
        for i in T.unroll(_CODES):
            amax_k = T.max(amax_k, T.abs(T.float32(xk[i])))
            amax_v = T.max(amax_v, T.abs(T.float32(xv[i])))
        amax_k = T.cuda.warp_max(amax_k, lanes)
        amax_v = T.cuda.warp_max(amax_v, lanes)
        k_scale = T.max(amax_k * T.float32(INV_FP8_MAX), T.float32(min_scale))
        v_scale = T.max(amax_v * T.float32(INV_FP8_MAX), T.float32(min_scale))
        # The contract multiplies by the fp32 reciprocal, so the kernel does too: the same codes, bit for bit. The
        # e4m3 cast rounds to nearest even and saturates (satfinite) at +-448, which is the clamp.
        k_inv = T.float32(1.0) / k_scale
        v_inv = T.float32(1.0) / v_scale
        for i in T.unroll(_CODES):
            qk[i] = T.float8_e4m3fn(T.float32(xk[i]) * k_inv)
            qv[i] = T.float8_e4m3fn(T.float32(xv[i]) * v_inv)
        if write:
            key_cache[s, h, T.Ramp(T.int64(col), 1, _CODES)] = qk[T.Ramp(0, 1, _CODES)]
            value_cache[s, h, T.Ramp(T.int64(col), 1, _CODES)] = qv[T.Ramp(0, 1, _CODES)]
            if lane == 0:
                k_scale_cache[s, h] = k_scale
                v_scale_cache[s, h] = v_scale

    return quantized_cache_append


def _cpu_kernel(heads, head_dim):
    """Host (llvm) kernel: one parallel iteration per (token, head); codes are written as e4m3 bit patterns."""
    min_scale = fp32(MIN_SCALE)
    n = T.dynamic("n")
    slots = T.dynamic("slots")

    @T.function
    def quantized_cache_append_cpu(
        key: T.Tensor((n, heads, head_dim), T.bfloat16),
        value: T.Tensor((n, heads, head_dim), T.bfloat16),
        slot_mapping: T.Tensor((n,), T.int64),
        key_cache: T.Tensor((slots, heads, head_dim), T.uint8),
        value_cache: T.Tensor((slots, heads, head_dim), T.uint8),
        k_scale_cache: T.Tensor((slots, heads), T.float32),
        v_scale_cache: T.Tensor((slots, heads), T.float32),
    ):
        for row in T.parallel(n * heads):
            t = row // heads
            h = row % heads
            s = slot_mapping[t]
            if s >= T.int64(0):
                st = T.alloc_local((4,), T.float32)  # key amax, value amax, then their reciprocal scales
                st[0] = T.float32(0)
                st[1] = T.float32(0)
                for d in range(head_dim):
                    st[0] = T.max(st[0], T.abs(T.float32(key[t, h, d])))
                    st[1] = T.max(st[1], T.abs(T.float32(value[t, h, d])))
                k_scale_cache[s, h] = T.max(st[0] * T.float32(INV_FP8_MAX), T.float32(min_scale))
                v_scale_cache[s, h] = T.max(st[1] * T.float32(INV_FP8_MAX), T.float32(min_scale))
                st[2] = T.float32(1.0) / k_scale_cache[s, h]
                st[3] = T.float32(1.0) / v_scale_cache[s, h]
                for d in range(head_dim):
                    key_cache[s, h, d] = e4m3_bits(
                        T.min(T.max(T.float32(key[t, h, d]) * st[2], T.float32(-FP8_MAX)), T.float32(FP8_MAX)))
                    value_cache[s, h, d] = e4m3_bits(
                        T.min(T.max(T.float32(value[t, h, d]) * st[3], T.float32(-FP8_MAX)), T.float32(FP8_MAX)))

    return quantized_cache_append_cpu


@functools.cache
def _compiled(heads, head_dim, arch):
    return build_cuda(_kernel(heads, head_dim), arch) if arch else build_cpu(_cpu_kernel(heads, head_dim))


def solve(key, value, slot_mapping, key_cache, value_cache, k_scale_cache, v_scale_cache):
    if key.dtype != torch.bfloat16 or value.dtype != torch.bfloat16:
        raise TypeError("dynamic_quantized_cache_append tirx: key and value must be bf16")
    if key_cache.dtype != torch.uint8 or value_cache.dtype != torch.uint8:
        raise TypeError("dynamic_quantized_cache_append tirx: the caches must be uint8 (e4m3 bit patterns)")
    if k_scale_cache.dtype != torch.float32 or v_scale_cache.dtype != torch.float32:
        raise TypeError("dynamic_quantized_cache_append tirx: the scale caches must be fp32")
    if not all(t.is_contiguous() for t in (key_cache, value_cache, k_scale_cache, v_scale_cache)):
        raise ValueError("dynamic_quantized_cache_append tirx: caches must be contiguous to be updated in place")
    tokens, heads, head_dim = key.shape
    if tokens == 0:
        return key_cache, value_cache, k_scale_cache, v_scale_cache
    key, value, slots = key.contiguous(), value.contiguous(), slot_mapping.to(torch.int64).contiguous()
    require_int32_indexing(key)
    # The uint8 caches hold e4m3 bit patterns: the device kernel writes them as e4m3, the host kernel as bytes.
    codes = torch.float8_e4m3fn if key.is_cuda else torch.uint8
    _compiled(heads, head_dim, gpu_arch(key.device) if key.is_cuda else None)(
        key, value, slots, key_cache.view(codes).view(-1, heads, head_dim),
        value_cache.view(codes).view(-1, heads, head_dim), k_scale_cache.view(-1, heads),
        v_scale_cache.view(-1, heads))
    return key_cache, value_cache, k_scale_cache, v_scale_cache


def compile_for(arch: str, sizes: list[dict]) -> None:
    for heads, head_dim in {(dims["heads"], dims["head_dim"]) for dims in sizes}:  # token and slot counts dynamic
        nvcc_build(_compiled(heads, head_dim, arch), f"heads={heads} head_dim={head_dim}")
