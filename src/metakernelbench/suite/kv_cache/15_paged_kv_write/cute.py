"""Paged KV write: one CTA per token scatters its key/value rows to the slot with 16-byte copies; slot -1 skipped."""
import functools

import torch

import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass.cute.runtime import make_fake_stream, make_ptr

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
    stream: cuda.CUstream,
    row: cutlass.Constexpr,
    vec: cutlass.Constexpr,
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


_DTYPES = {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16, torch.float32: cutlass.Float32}


@functools.lru_cache(maxsize=None)
def _compiled(dtype, row, arch):
    vec = 16 // dtype.itemsize
    if row % vec:
        raise ValueError(f"row of {row} elements is not a whole number of 16-byte vectors")
    el = _DTYPES[dtype]
    fake = make_ptr(el, 0, cute.AddressSpace.gmem, assumed_align=16)
    slots = make_ptr(cutlass.Int64, 0, cute.AddressSpace.gmem, assumed_align=8)
    return cute.compile(
        _write, fake, fake, fake, fake, slots, cutlass.Int32(1), cutlass.Int32(1), make_fake_stream(), row, vec,
        options=f"--gpu-arch {arch}",
    )


@functools.lru_cache(maxsize=None)
def _arch(device):
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _ptr(t, dtype, align):
    if not t.is_contiguous() or t.data_ptr() % align:
        raise ValueError(f"expected a contiguous tensor aligned to {align} bytes, got shape {tuple(t.shape)}")
    return make_ptr(dtype, t.data_ptr(), cute.AddressSpace.gmem, assumed_align=align)


def solve(key, value, key_cache, value_cache, slot_mapping):
    tokens, kv_heads, head_dim = key.shape
    row = kv_heads * head_dim
    cache_rows = key_cache.shape[0] * key_cache.shape[1]
    el = _DTYPES[key.dtype]
    kernel = _compiled(key.dtype, row, _arch(key.device))
    kernel(
        _ptr(key, el, 16), _ptr(value, el, 16), _ptr(key_cache, el, 16), _ptr(value_cache, el, 16),
        _ptr(slot_mapping.to(torch.int64), cutlass.Int64, 8), tokens, cache_rows,
        cuda.CUstream(torch.cuda.current_stream(key.device).cuda_stream),
    )
    return key_cache, value_cache


def compile_for(arch: str) -> None:
    """Compile the scatter kernel for the "full" and "odd" sizes (both have 8 KV heads x 128 dims per row)."""
    _compiled(torch.bfloat16, 8 * 128, arch)
