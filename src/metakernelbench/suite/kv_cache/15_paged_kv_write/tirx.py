"""Paged KV-cache write: one CTA per token copies its key/value rows to cache row slot_mapping[t] in 16-byte vectors."""
import functools

import torch
import tvm_tirx
from tvm_tirx.backend.config import parse_backend_config
from tvm_tirx.backend.cuda.compiler import compile_source
from tvm_tirx.script import tirx as T

_THREADS = 128
_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32", torch.int32: "int32",
           torch.int64: "int64"}


def _vector_width(row, elem_bytes, offsets=()):
    # Widest vector (16 bytes at most) dividing the row and every view's element offset (storages are 256-byte
    # aligned): one 128-bit load/store per chunk.
    vec = max(1, 16 // elem_bytes)
    while vec > 1 and (row % vec or any(o % vec for o in offsets)):
        vec //= 2
    return vec


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
    kernel = _kernel(row, dtype, vec, elem_bytes, slot_dtype)
    return tvm_tirx.tirx.compile(kernel, target=tvm_tirx.target.Target({"kind": "cuda", "arch": arch}))


@functools.cache
def _device_arch(index):
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


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

    return tvm_tirx.tirx.compile(paged_kv_write_cpu, target="llvm")


def _solve_cpu(key, value, key_cache, value_cache, slot_mapping):
    tokens = key.shape[0]
    row = key.shape[1] * key.shape[2]
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
        raise ValueError("paged_kv_write: caches must be contiguous to be updated in place")
    key, value = key.reshape(tokens, row).contiguous(), value.reshape(tokens, row).contiguous()
    bits, bits_name = _CPU_BITS[key.element_size()]
    if tokens:
        _cpu_compiled(row, bits_name, _DTYPES[slot_mapping.dtype])(
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
    vec = _vector_width(row, esize, [t.storage_offset() for t in (key, value, key_cache, value_cache)])
    arch = _device_arch(key.device.index or 0)
    ex = _compiled(row, _DTYPES[key.dtype], vec, esize, _DTYPES[slot_mapping.dtype], arch)
    if tokens:
        ex(key, value, key_cache.view(-1, row), value_cache.view(-1, row), slot_mapping.contiguous())
    return key_cache, value_cache


def compile_for(arch: str) -> None:
    """Compile the kernel (token count and cache size are dynamic) to a device binary for `arch` with nvcc."""
    row = 8 * 128  # full and odd sizes: 8 KV heads x head_dim 128
    ex = _compiled(row, "bfloat16", _vector_width(row, 2), 2, "int64", arch)
    for mod in ex.mod.imports:  # device code is otherwise built lazily at first launch
        config = parse_backend_config(mod.inspect_source("backend_config"))
        config["cuda"]["compiler"] = "nvcc"
        if not compile_source(mod.inspect_source("cuda"), config).binary:
            raise RuntimeError(f"nvcc produced no binary for {arch}")
