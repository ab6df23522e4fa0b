"""Mixed-layout FP8 cache gather + bf16 upconvert in CuTe DSL: a warp per token, 16-byte loads and stores throughout.

Lane l of a token's warp turns codes [16 l, 16 l + 16) into bf16 with scale l // 8 (one 16-byte load, two 16-byte
stores); lanes 0-7 also copy 16 bytes of the rope each. The cache is read through three typed views of one pointer.
"""
import functools

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from metakernelbench.suite.kits.common import gathered_rows, gpu_arch, require_int32_indexing
from metakernelbench.suite.kits.cute import compile_kernel, fake_ptr, gmem_ptr, request_of, stream_of, vector_copy

NOPE_DIM = 512
ROPE_DIM = 64
GROUP_SIZE = 128
ENTRY_BYTES = 656
SCALES_AT = NOPE_DIM // 4  # the scales' first fp32 word in an entry
ROPE_AT = (NOPE_DIM + 16) // 2  # the rope's first bf16 in an entry
CODES = 16  # codes per lane: one 16-byte load
ROPE_VEC = 8  # bf16 per 16-byte rope copy
TOKENS_PER_CTA = 4
THREADS = 32 * TOKENS_PER_CTA


class _GatherUpconvert:
    def __init__(self, block_size: int):
        self.block_size = block_size

    @cute.jit
    def __call__(self, pCodes: cute.Pointer, pScales: cute.Pointer, pRope: cute.Pointer, pTable: cute.Pointer,
                 pLens: cute.Pointer, pOut: cute.Pointer, slots: cutlass.Int32, requests: cutlass.Int32,
                 table_width: cutlass.Int32, rows: cutlass.Int32, stream: cuda.CUstream):
        # One entry per slot (block * block_size + offset), seen as bytes, fp32 words and bf16 halves.
        mCodes = cute.make_tensor(pCodes, cute.make_layout((slots, ENTRY_BYTES), stride=(ENTRY_BYTES, 1)))
        mScales = cute.make_tensor(pScales, cute.make_layout((slots, ENTRY_BYTES // 4), stride=(ENTRY_BYTES // 4, 1)))
        mRope = cute.make_tensor(pRope, cute.make_layout((slots, ENTRY_BYTES // 2), stride=(ENTRY_BYTES // 2, 1)))
        mTable = cute.make_tensor(pTable, cute.make_layout((requests, table_width), stride=(table_width, 1)))
        mLens = cute.make_tensor(pLens, cute.make_layout((requests,)))
        width = NOPE_DIM + ROPE_DIM
        mOut = cute.make_tensor(pOut, cute.make_layout((rows, width), stride=(width, 1)))
        self.kernel(mCodes, mScales, mRope, mTable, mLens, mOut).launch(
            grid=((rows + TOKENS_PER_CTA - 1) // TOKENS_PER_CTA, 1, 1), block=(THREADS, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mCodes: cute.Tensor, mScales: cute.Tensor, mRope: cute.Tensor, mTable: cute.Tensor,
               mLens: cute.Tensor, mOut: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        row = bidx * TOKENS_PER_CTA + tidx // 32
        lane = tidx % 32
        if row < mOut.shape[0]:
            request, start = request_of(mLens, row)
            position = row - start
            block = mTable[request, position // self.block_size]
            slot = block * self.block_size + position % self.block_size
            rC = cute.make_rmem_tensor((CODES,), mCodes.element_type)
            cute.copy(vector_copy(mCodes.element_type, CODES),
                      cute.zipped_divide(mCodes[slot, None], (CODES,))[None, lane], rC)
            scale = mScales[slot, SCALES_AT + lane * CODES // GROUP_SIZE]
            rR = cute.make_rmem_tensor((ROPE_VEC,), mRope.element_type)
            if lane < ROPE_DIM // ROPE_VEC:
                cute.copy(vector_copy(mRope.element_type, ROPE_VEC),
                          cute.zipped_divide(mRope[slot, None], (ROPE_VEC,))[None, ROPE_AT // ROPE_VEC + lane], rR)
            # e4m3 -> fp32 is exact; the fp32 product is rounded once to bf16, as the contract says.
            rO = cute.make_rmem_tensor((CODES,), mOut.element_type)
            rO.store((rC.load().to(cutlass.Float32) * scale).to(mOut.element_type))
            gOut = cute.zipped_divide(mOut[row, None], (ROPE_VEC,))
            vO = cute.zipped_divide(rO, (ROPE_VEC,))
            store = vector_copy(mOut.element_type, ROPE_VEC)
            for j in cutlass.range_constexpr(CODES // ROPE_VEC):
                cute.copy(store, vO[None, j], gOut[None, lane * (CODES // ROPE_VEC) + j])
            if lane < ROPE_DIM // ROPE_VEC:
                cute.copy(store, rR, gOut[None, NOPE_DIM // ROPE_VEC + lane])


@functools.cache
def _compiled(block_size, arch):
    """Compile once per block size; pool size, requests, table width and rows are runtime arguments."""
    return compile_kernel(_GatherUpconvert(block_size), fake_ptr(torch.float8_e4m3fn, 16), fake_ptr(torch.float32, 16),
                          fake_ptr(torch.bfloat16, 16), fake_ptr(torch.int32, 4), fake_ptr(torch.int32, 4),
                          fake_ptr(torch.bfloat16, 16), cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1),
                          cutlass.Int32(1), arch=arch)


def solve(cache, block_table, seq_lens):
    if cache.dtype != torch.uint8 or cache.dim() != 3 or cache.shape[2] != ENTRY_BYTES:
        raise TypeError(f"cp_gather_upconvert cute: cache must be uint8 [num_blocks, block_size, {ENTRY_BYTES}]")
    if block_table.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        raise TypeError("cp_gather_upconvert cute: block_table and seq_lens must be int32")
    num_blocks, block_size, _ = cache.shape
    rows = gathered_rows(seq_lens)
    out = torch.empty((rows, NOPE_DIM + ROPE_DIM), dtype=torch.bfloat16, device=cache.device)
    if rows == 0:
        return out
    cache, table, lens = cache.contiguous(), block_table.contiguous(), seq_lens.contiguous()
    require_int32_indexing(cache, out)
    kernel = _compiled(block_size, gpu_arch(cache.device))
    # Three views of the same bytes: e4m3 codes, fp32 scale words, bf16 rope halves (656 = 41 x 16 bytes).
    kernel(gmem_ptr(cache.view(torch.float8_e4m3fn), 16), gmem_ptr(cache.view(torch.float32), 16),
           gmem_ptr(cache.view(torch.bfloat16), 16), gmem_ptr(table, 4), gmem_ptr(lens, 4), gmem_ptr(out, 16),
           num_blocks * block_size, lens.numel(), table.shape[1], rows, stream_of(cache))
    return out


def compile_for(arch: str, sizes: list[dict]) -> None:
    for block_size in {d["block_size"] for d in sizes}:
        _compiled(block_size, arch)
