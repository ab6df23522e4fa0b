"""MLA cache gather + dequantise in CuTe DSL: a thread per 16 codes of an output row, 16-byte loads and stores."""
import functools

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from metakernelbench.suite.kits.common import gathered_rows, gpu_arch, require_int32_indexing
from metakernelbench.suite.kits.cute import compile_kernel, fake_ptr, gmem_ptr, request_of, stream_of, vector_copy

CODES = 16  # e4m3 codes per thread: one 16-byte load, 64 bytes of fp32 out
THREADS = 256


class _GatherDequant:
    def __init__(self, entry: int, block_size: int):
        self.entry, self.block_size = entry, block_size
        self.chunks = entry // CODES  # threads per output row

    @cute.jit
    def __call__(self, pCache: cute.Pointer, pTable: cute.Pointer, pLens: cute.Pointer, pOut: cute.Pointer,
                 scale: cutlass.Float32, slots: cutlass.Int32, requests: cutlass.Int32, table_width: cutlass.Int32,
                 rows: cutlass.Int32, stream: cuda.CUstream):
        # The cache is viewed as one entry per slot (block * block_size + offset); rows, requests, the table width
        # and the pool size are runtime values: one compile per (entry, block_size).
        mCache = cute.make_tensor(pCache, cute.make_layout((slots, self.entry), stride=(self.entry, 1)))
        mTable = cute.make_tensor(pTable, cute.make_layout((requests, table_width), stride=(table_width, 1)))
        mLens = cute.make_tensor(pLens, cute.make_layout((requests,)))
        mOut = cute.make_tensor(pOut, cute.make_layout((rows, self.entry), stride=(self.entry, 1)))
        threads = rows * self.chunks
        self.kernel(mCache, mTable, mLens, mOut, scale).launch(
            grid=((threads + THREADS - 1) // THREADS, 1, 1), block=(THREADS, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mCache: cute.Tensor, mTable: cute.Tensor, mLens: cute.Tensor, mOut: cute.Tensor,
               scale: cutlass.Float32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gid = bidx * THREADS + tidx
        row = gid // self.chunks
        chunk = gid % self.chunks
        if row < mOut.shape[0]:
            request, start = request_of(mLens, row)
            position = row - start
            block = mTable[request, position // self.block_size]
            slot = block * self.block_size + position % self.block_size
            rC = cute.make_rmem_tensor((CODES,), mCache.element_type)
            cute.copy(vector_copy(mCache.element_type, CODES),
                      cute.zipped_divide(mCache[slot, None], (CODES,))[None, chunk], rC)
            rO = cute.make_rmem_tensor((CODES,), mOut.element_type)
            # e4m3 -> fp32 is exact; the product is the contract's single fp32 multiply.
            rO.store(rC.load().to(cutlass.Float32) * scale)
            gOut = cute.zipped_divide(mOut[row, None], (4,))
            vO = cute.zipped_divide(rO, (4,))
            for j in cutlass.range_constexpr(CODES // 4):
                cute.copy(vector_copy(mOut.element_type, 4), vO[None, j], gOut[None, chunk * (CODES // 4) + j])


@functools.cache
def _compiled(entry, block_size, arch):
    """Compile once per entry width and block size; everything else is a runtime argument."""
    if entry % CODES:
        raise ValueError(f"mla_cache_gather cute: an entry of {entry} bytes is not a whole number of 16-byte vectors")
    return compile_kernel(_GatherDequant(entry, block_size), fake_ptr(torch.float8_e4m3fn, 16),
                          fake_ptr(torch.int32, 4), fake_ptr(torch.int32, 4), fake_ptr(torch.float32, 16),
                          cutlass.Float32(1.0), cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1),
                          cutlass.Int32(1), arch=arch)


def solve(src_cache, block_table, seq_lens, scale):
    if src_cache.dtype != torch.uint8 or src_cache.dim() != 3:
        raise TypeError("mla_cache_gather cute: src_cache must be uint8 [num_blocks, block_size, entry] (e4m3 bits)")
    if block_table.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        raise TypeError("mla_cache_gather cute: block_table and seq_lens must be int32")
    num_blocks, block_size, entry = src_cache.shape
    rows = gathered_rows(seq_lens)
    out = torch.empty((rows, entry), dtype=torch.float32, device=src_cache.device)
    if rows == 0:
        return out
    cache, table, lens = src_cache.contiguous(), block_table.contiguous(), seq_lens.contiguous()
    require_int32_indexing(cache, out)
    kernel = _compiled(entry, block_size, gpu_arch(cache.device))
    kernel(gmem_ptr(cache.view(torch.float8_e4m3fn), 16), gmem_ptr(table, 4), gmem_ptr(lens, 4), gmem_ptr(out, 16),
           float(scale), num_blocks * block_size, lens.numel(), table.shape[1], rows, stream_of(cache))
    return out


def compile_for(arch: str, sizes: list[dict]) -> None:
    for dims in {(d["kv_lora_rank"] + d["rope_dim"], d["block_size"]) for d in sizes}:
        _compiled(*dims, arch)
