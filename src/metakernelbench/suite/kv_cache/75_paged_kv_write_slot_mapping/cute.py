"""Paged KV write: one CTA per token scatters its key/value rows to the slot with 16-byte copies; slot -1 skipped."""
import functools

import torch

import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda

from metakernelbench.suite.kits.common import gpu_arch
from metakernelbench.suite.kits.cute import compile_kernel, fake_ptr, gmem_ptr, stream_of

MAX_THREADS = 128


@cute.kernel
def _write_kernel(
    mKey: cute.Tensor,  # (VEC, row/VEC, tokens)
    mVal: cute.Tensor,
    mKc: cute.Tensor,  # (VEC, row/VEC, cache rows): the cache viewed as one row per slot
    mVc: cute.Tensor,
    mSlot: cute.Tensor,  # (tokens,) int64
    threads: cutlass.Constexpr,
):
    tid, _, _ = cute.arch.thread_idx()
    t, _, _ = cute.arch.block_idx()
    slot = mSlot[t]
    if slot >= 0:
        rK = cute.make_rmem_tensor((mKey.shape[0],), mKey.element_type)
        rV = cute.make_rmem_tensor((mVal.shape[0],), mVal.element_type)
        for i in range(tid, mKey.shape[1], threads):
            # Both loads are issued before either store: two 16-byte requests in flight per thread.
            cute.autovec_copy(mKey[None, i, t], rK)
            cute.autovec_copy(mVal[None, i, t], rV)
            cute.autovec_copy(rK, mKc[None, i, slot])
            cute.autovec_copy(rV, mVc[None, i, slot])


@cute.jit
def _write(
    pKey: cute.Pointer,
    pVal: cute.Pointer,
    pKc: cute.Pointer,
    pVc: cute.Pointer,
    pSlot: cute.Pointer,
    tokens: cutlass.Int32,
    cache_rows: cutlass.Int32,
    row: cutlass.Constexpr,
    vec: cutlass.Constexpr,
    stream: cuda.CUstream,
):
    nv = row // vec
    io = cute.make_layout((vec, nv, tokens), stride=(1, vec, row))
    cache = cute.make_layout((vec, nv, cache_rows), stride=(1, vec, row))
    threads = min(MAX_THREADS, (nv + 31) // 32 * 32)
    _write_kernel(
        cute.make_tensor(pKey, io),
        cute.make_tensor(pVal, io),
        cute.make_tensor(pKc, cache),
        cute.make_tensor(pVc, cache),
        cute.make_tensor(pSlot, cute.make_layout((tokens,))),
        threads,
    ).launch(grid=(tokens, 1, 1), block=(threads, 1, 1), stream=stream)


@functools.cache
def _compiled(dtype, row, arch):
    vec = 16 // dtype.itemsize
    if row % vec:
        raise ValueError(f"row of {row} elements is not a whole number of 16-byte vectors")
    fake = fake_ptr(dtype, 16)
    return compile_kernel(_write, fake, fake, fake, fake, fake_ptr(torch.int64, 8), cutlass.Int32(1),
                          cutlass.Int32(1), row, vec, arch=arch)


def solve(key, value, key_cache, value_cache, slot_mapping):
    tokens, kv_heads, head_dim = key.shape
    row = kv_heads * head_dim
    cache_rows = key_cache.shape[0] * key_cache.shape[1]
    if not all(t.is_contiguous() for t in (key, value, key_cache, value_cache)):
        raise ValueError("paged_kv_write cute: keys, values and caches must be contiguous")
    kernel = _compiled(key.dtype, row, gpu_arch(key.device))
    kernel(gmem_ptr(key, 16), gmem_ptr(value, 16), gmem_ptr(key_cache, 16), gmem_ptr(value_cache, 16),
           gmem_ptr(slot_mapping.to(torch.int64), 8), tokens, cache_rows, stream_of(key))
    return key_cache, value_cache


def compile_for(arch: str, sizes: list[dict]) -> None:
    """One kernel per row width (KV heads x head dim); token count and cache size are dynamic."""
    for row in {dims["kv_heads"] * dims["head_dim"] for dims in sizes}:
        _compiled(torch.bfloat16, row, arch)
