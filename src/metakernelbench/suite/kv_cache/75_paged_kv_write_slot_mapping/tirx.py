"""Paged KV-cache write: one CTA per token copies its key/value rows to cache row slot_mapping[t] in 16-byte vectors."""
import functools

import torch
from tvm_tirx.script import tirx as T

from metakernelbench.suite.kits.common import gpu_arch, vector_width
from metakernelbench.suite.kits.tirx import TIRX_DTYPES, build_cpu, build_cuda, nvcc_build

_THREADS = 128
CPU_PATH = True


def _kernel(row, dtype, vec, elem_bytes, slot_dtype):
    n = T.dynamic("n")
    slots = T.dynamic("slots")
    nvec = row // vec
    align = vec * elem_bytes

    @T.function
    def paged_kv_write(key: T.Tensor((n, row), dtype, data_alignment=align),
                       value: T.Tensor((n, row), dtype, data_alignment=align),
                       key_cache: T.Tensor((slots, row), dtype, data_alignment=align),
                       value_cache: T.Tensor((slots, row), dtype, data_alignment=align),
                       slot_mapping: T.Tensor((n,), slot_dtype)):
        T.device_entry(launch=T.cuda.LaunchConfig(grid=n, block=_THREADS))
        t = T.cuda.block_idx("x")
        tid = T.cuda.thread_idx("x")
        s = slot_mapping[t]
        if s >= 0:
            for i in T.unroll(T.ceildiv(nvec, _THREADS)):
                c = (i * _THREADS + tid) * vec
                if c < row:
                    # int64 offsets: slots * row can exceed 2**31 for large caches.
                    key_cache[T.int64(s), T.Ramp(T.int64(c), 1, vec)] = key[T.int64(t), T.Ramp(T.int64(c), 1, vec)]
                    value_cache[T.int64(s), T.Ramp(T.int64(c), 1, vec)] = value[T.int64(t), T.Ramp(T.int64(c), 1, vec)]

    return paged_kv_write


@functools.cache
def _compiled(row, dtype, vec, elem_bytes, slot_dtype, arch):
    return build_cuda(_kernel(row, dtype, vec, elem_bytes, slot_dtype), arch)


# Host path: rows move as same-width integers, so every bit pattern (NaN payloads included) copies exactly.
_CPU_BITS = {1: (torch.uint8, "uint8"), 2: (torch.int16, "int16"), 4: (torch.int32, "int32"), 8: (torch.int64, "int64")}


@functools.cache
def _cpu_compiled(row, bits_dtype, slot_dtype):
    """Host (llvm) kernel: one parallel iteration per token copies its key/value rows to cache row slot_mapping[t]."""
    n = T.dynamic("n")
    slots = T.dynamic("slots")

    @T.function
    def paged_kv_write_cpu(key: T.Tensor((n, row), bits_dtype), value: T.Tensor((n, row), bits_dtype),
                           key_cache: T.Tensor((slots, row), bits_dtype),
                           value_cache: T.Tensor((slots, row), bits_dtype),
                           slot_mapping: T.Tensor((n,), slot_dtype)):
        for t in T.parallel(n):
            s = T.Cast("int64", slot_mapping[t])
            if s >= T.int64(0):
                for c in range(row):
                    key_cache[s, c] = key[t, c]
                    value_cache[s, c] = value[t, c]

    return build_cpu(paged_kv_write_cpu)


def _solve_cpu(key, value, key_cache, value_cache, slot_mapping):
    tokens = key.shape[0]
    row = key.shape[1] * key.shape[2]
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
        raise ValueError("paged_kv_write: caches must be contiguous to be updated in place")
    key, value = key.reshape(tokens, row).contiguous(), value.reshape(tokens, row).contiguous()
    bits, bits_name = _CPU_BITS[key.element_size()]
    if tokens:
        _cpu_compiled(row, bits_name, TIRX_DTYPES[slot_mapping.dtype])(
            key.view(bits), value.view(bits), key_cache.view(-1, row).view(bits),
            value_cache.view(-1, row).view(bits), slot_mapping.contiguous())
    return key_cache, value_cache


def solve(key, value, key_cache, value_cache, slot_mapping):
    if not key.is_cuda:
        return _solve_cpu(key, value, key_cache, value_cache, slot_mapping)
    tokens = key.shape[0]
    row = key.shape[1] * key.shape[2]
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
        raise ValueError("paged_kv_write: caches must be contiguous to be updated in place")
    key, value = key.reshape(tokens, row).contiguous(), value.reshape(tokens, row).contiguous()
    esize = key.element_size()
    vec = vector_width(esize, row, [t.data_ptr() for t in (key, value, key_cache, value_cache)])
    ex = _compiled(row, TIRX_DTYPES[key.dtype], vec, esize, TIRX_DTYPES[slot_mapping.dtype], gpu_arch(key.device))
    if tokens:
        ex(key, value, key_cache.view(-1, row), value_cache.view(-1, row), slot_mapping.contiguous())
    return key_cache, value_cache


def compile_for(arch: str, sizes: list[dict]) -> None:
    """One kernel per row width (KV heads x head dim); token count and cache size are dynamic."""
    for row in {dims["kv_heads"] * dims["head_dim"] for dims in sizes}:
        nvcc_build(_compiled(row, "bfloat16", vector_width(2, row), 2, "int64", arch), f"row={row}")
