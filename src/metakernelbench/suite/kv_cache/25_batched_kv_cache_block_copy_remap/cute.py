"""Block copy remap in CuTe DSL: a CTA per (mapping pair, piece of a block) copies that piece of the K and the V
block with 16-byte vectors, every load issued before the first store; block offsets are 64-bit."""
import functools

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from metakernelbench.suite.kits.common import gpu_arch, vector_width
from metakernelbench.suite.kits.cute import compile_kernel, fake_ptr, gmem_ptr, stream_of, vector_copy

THREADS = 256
ITERS = 4  # vectors per thread and pool: 2 x 4 x 16 bytes in flight per thread, 32 KB per CTA


class _BlockCopy:
    def __init__(self, block_bytes: int, vec: int):
        self.block_bytes, self.vec = block_bytes, vec
        self.nvec = block_bytes // vec
        self.per_cta = THREADS * ITERS
        self.pieces = -(-self.nvec // self.per_cta)

    @cute.jit
    def __call__(self, pSK: cute.Pointer, pSV: cute.Pointer, pDK: cute.Pointer, pDV: cute.Pointer,
                 pMap: cute.Pointer, mappings: cutlass.Int32, stream: cuda.CUstream):
        mMap = cute.make_tensor(pMap, cute.make_layout((mappings, 2), stride=(2, 1)))
        self.kernel(pSK, pSV, pDK, pDV, mMap).launch(grid=(mappings, self.pieces, 1), block=(THREADS, 1, 1),
                                                     stream=stream)

    def _block(self, pool: cute.Pointer, block):
        """Block `block` of a pool as (vec, nvec) vectors; the byte offset is 64-bit (pools may pass 2 GiB)."""
        base = pool + cute.assume(cutlass.Int64(block) * self.block_bytes, divby=self.vec)
        return cute.make_tensor(base, cute.make_layout((self.vec, self.nvec), stride=(1, self.vec)))

    @cute.kernel
    def kernel(self, pSK: cute.Pointer, pSV: cute.Pointer, pDK: cute.Pointer, pDV: cute.Pointer, mMap: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        pair, piece, _ = cute.arch.block_idx()
        src, dst = mMap[pair, 0], mMap[pair, 1]
        gSK, gSV, gDK, gDV = self._block(pSK, src), self._block(pSV, src), self._block(pDK, dst), self._block(pDV, dst)
        copy = vector_copy(cutlass.Uint8, self.vec)
        rK = cute.make_rmem_tensor((self.vec, ITERS), cutlass.Uint8)
        rV = cute.make_rmem_tensor((self.vec, ITERS), cutlass.Uint8)
        first = piece * self.per_cta + tidx
        if cutlass.const_expr(self.nvec % self.per_cta == 0):  # every vector of every piece exists: no predicates
            for i in cutlass.range_constexpr(ITERS):
                cute.copy(copy, gSK[None, first + i * THREADS], rK[None, i])
                cute.copy(copy, gSV[None, first + i * THREADS], rV[None, i])
            for i in cutlass.range_constexpr(ITERS):
                cute.copy(copy, rK[None, i], gDK[None, first + i * THREADS])
                cute.copy(copy, rV[None, i], gDV[None, first + i * THREADS])
        else:
            for i in cutlass.range_constexpr(ITERS):
                if first + i * THREADS < self.nvec:
                    cute.copy(copy, gSK[None, first + i * THREADS], rK[None, i])
                    cute.copy(copy, gSV[None, first + i * THREADS], rV[None, i])
            for i in cutlass.range_constexpr(ITERS):
                if first + i * THREADS < self.nvec:
                    cute.copy(copy, rK[None, i], gDK[None, first + i * THREADS])
                    cute.copy(copy, rV[None, i], gDV[None, first + i * THREADS])


@functools.cache
def _compiled(block_bytes, vec, map_dtype, arch):
    """One kernel per block size in bytes, vector width and mapping dtype; pool sizes and pair count are dynamic."""
    pool = fake_ptr(torch.uint8, vec)
    mapping = fake_ptr(map_dtype, map_dtype.itemsize)
    return compile_kernel(_BlockCopy(block_bytes, vec), pool, pool, pool, pool, mapping, cutlass.Int32(1), arch=arch)


def solve(src_k, src_v, dst_k, dst_v, block_mapping):
    pools = (src_k, src_v, dst_k, dst_v)
    if any(p.shape != src_k.shape or p.dtype != src_k.dtype for p in pools):
        raise ValueError("block_copy_remap cute: the four pools must share one shape and dtype")
    if not all(p.is_contiguous() for p in pools):
        raise ValueError("block_copy_remap cute: the pools must be contiguous (the copy is in place)")
    if block_mapping.dtype not in (torch.int32, torch.int64) or block_mapping.shape[-1:] != (2,):
        raise TypeError("block_copy_remap cute: block_mapping must be int32 or int64 of shape [num_mappings, 2]")
    mappings = block_mapping.shape[0]
    if mappings == 0 or src_k.numel() == 0:
        return dst_k, dst_v
    block_bytes = src_k[0].numel() * src_k.element_size()
    vec = vector_width(1, block_bytes, [p.data_ptr() for p in pools])
    block_mapping = block_mapping.contiguous()
    kernel = _compiled(block_bytes, vec, block_mapping.dtype, gpu_arch(src_k.device))
    kernel(*(gmem_ptr(p.view(torch.uint8), vec) for p in pools), gmem_ptr(block_mapping, block_mapping.element_size()),
           mappings, stream_of(src_k))
    return dst_k, dst_v


def compile_for(arch: str, sizes: list[dict]) -> None:
    for dims in sizes:
        block_bytes = dims["block_size"] * dims["num_heads"] * dims["head_dim"]
        _compiled(block_bytes, vector_width(1, block_bytes), torch.int64, arch)
