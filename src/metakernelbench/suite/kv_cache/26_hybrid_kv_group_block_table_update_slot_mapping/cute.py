"""Hybrid KV-group block tables in CuTe DSL, one launch: a CTA per request row. Warp g applies the row's staged writes
of group g in write order (the lanes store a write's ids side by side), then the CTA maps the tokens of the batches
that run this request through the updated row; the tokens past the last batch get -1, spread over the CTAs.

A request's writes and its slot lookups touch only its own table rows, so the CTA barrier between the two phases is
the only ordering the problem needs. The write and batch lists are staged in shared memory a tile at a time, so the
ordered scans read shared memory, not global."""
import functools

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from metakernelbench.suite.kits.common import gpu_arch, require_int32_indexing
from metakernelbench.suite.kits.cute import compile_kernel, fake_ptr, gmem_ptr, stream_of

BLOCK_SIZES = (16, 32, 8)
KERNEL_BLOCK_SIZES = (16, 16, 8)
GROUPS = len(BLOCK_SIZES)
THREADS = 128  # warps 0..2 write the tables, all four map tokens
TILE = THREADS  # list entries staged per pass, one per thread


class _BlockTables:
    @cute.jit
    def __call__(self, pT0: cute.Pointer, pT1: cute.Pointer, pT2: cute.Pointer, pCounts: cute.Pointer,
                 pRequests: cute.Pointer, pOverwrite: cute.Pointer, pIds: cute.Pointer, pStaged: cute.Pointer,
                 pIdx: cute.Pointer, pStarts: cute.Pointer, pPositions: cute.Pointer, pSlots: cute.Pointer,
                 reqs: cutlass.Int32, width0: cutlass.Int32, width1: cutlass.Int32, width2: cutlass.Int32,
                 writes: cutlass.Int32, capacity: cutlass.Int32, batch: cutlass.Int32, tokens: cutlass.Int32,
                 stream: cuda.CUstream):
        tables = [cute.make_tensor(p, cute.make_layout((reqs, w), stride=(w, 1)))
                  for p, w in ((pT0, width0), (pT1, width1), (pT2, width2))]
        mCounts = cute.make_tensor(pCounts, cute.make_layout((GROUPS, reqs), stride=(reqs, 1)))
        mRequests = cute.make_tensor(pRequests, cute.make_layout((writes,)))
        mOverwrite = cute.make_tensor(pOverwrite, cute.make_layout((writes,)))
        mIds = cute.make_tensor(pIds, cute.make_layout((GROUPS, writes, capacity),
                                                       stride=(writes * capacity, capacity, 1)))
        mStaged = cute.make_tensor(pStaged, cute.make_layout((GROUPS, writes), stride=(writes, 1)))
        mIdx = cute.make_tensor(pIdx, cute.make_layout((batch,)))
        mStarts = cute.make_tensor(pStarts, cute.make_layout((batch + 1,)))
        mPositions = cute.make_tensor(pPositions, cute.make_layout((tokens,)))
        mSlots = cute.make_tensor(pSlots, cute.make_layout((GROUPS, tokens), stride=(tokens, 1)))
        self.kernel(tables[0], tables[1], tables[2], mCounts, mRequests, mOverwrite, mIds, mStaged, mIdx, mStarts,
                    mPositions, mSlots).launch(grid=(reqs, 1, 1), block=(THREADS, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mT0: cute.Tensor, mT1: cute.Tensor, mT2: cute.Tensor, mCounts: cute.Tensor,
               mRequests: cute.Tensor, mOverwrite: cute.Tensor, mIds: cute.Tensor, mStaged: cute.Tensor,
               mIdx: cute.Tensor, mStarts: cute.Tensor, mPositions: cute.Tensor, mSlots: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        r, _, _ = cute.arch.block_idx()
        reqs, _, _ = cute.arch.grid_dim()
        warp, lane = tidx // 32, tidx % 32
        tables = (mT0, mT1, mT2)
        sList = cute.make_tensor(cute.arch.alloc_smem(cutlass.Int32, TILE, 16), cute.make_layout((TILE,)))
        writes = mRequests.shape[0]

        # Phase 1: warp g replays the write list in order; every lane keeps the row's count of group g.
        count = cutlass.Int32(0)
        if warp < GROUPS:
            count = mCounts[warp, r]
        for base in cutlass.range(0, writes, TILE):
            cute.arch.barrier()  # the previous tile is consumed
            if base + tidx < writes:
                sList[tidx] = mRequests[base + tidx]
            cute.arch.barrier()
            for g in cutlass.range_constexpr(GROUPS):
                if warp == g:
                    expansion = BLOCK_SIZES[g] // KERNEL_BLOCK_SIZES[g]
                    for j in cutlass.range(cutlass.min(TILE, writes - base)):
                        if sList[j] == r:
                            w = base + j
                            start = cutlass.select_(mOverwrite[w] != 0, cutlass.Int32(0), count)
                            n = mStaged[g, w] * expansion
                            for e in cutlass.range(lane, n, 32):
                                tables[g][r, start + e] = mIds[g, w, e // expansion] * expansion + e % expansion
                            # A later write of the row may store the same entries from other lanes: order them.
                            cute.arch.sync_warp()
                            count = start + n
        if warp < GROUPS:
            if lane == 0:
                mCounts[warp, r] = count

        # Phase 2: the tokens of every batch that runs request r, through the rows just written.
        batch = mIdx.shape[0]
        for base in cutlass.range(0, batch, TILE):
            cute.arch.barrier()  # phase 1's table stores (first tile) or the previous tile's reads are done
            if base + tidx < batch:
                sList[tidx] = mIdx[base + tidx]
            cute.arch.barrier()
            for j in cutlass.range(cutlass.min(TILE, batch - base)):
                if sList[j] == r:
                    for i in cutlass.range(mStarts[base + j] + tidx, mStarts[base + j + 1], THREADS):
                        p = mPositions[i]
                        for g in cutlass.range_constexpr(GROUPS):
                            size = KERNEL_BLOCK_SIZES[g]
                            block = tables[g][r, cutlass.Int32(p // size)]
                            mSlots[g, i] = cutlass.Int64(block) * size + p % size

        # Tokens past the last batch: -1, grid-strided.
        for i in cutlass.range(mStarts[batch] + r * THREADS + tidx, mSlots.shape[1], reqs * THREADS):
            for g in cutlass.range_constexpr(GROUPS):
                mSlots[g, i] = cutlass.Int64(-1)


@functools.cache
def _compiled(arch):
    """Every size is dynamic: one kernel."""
    i32, i64 = fake_ptr(torch.int32, 4), fake_ptr(torch.int64, 8)
    one = cutlass.Int32(1)
    return compile_kernel(_BlockTables(), i32, i32, i32, i32, i32, fake_ptr(torch.uint8, 1), i32, i32, i32, i32,
                          i64, i64, one, one, one, one, one, one, one, one, arch=arch)


def solve(block_table_0, block_table_1, block_table_2, num_blocks, write_requests, overwrite, staged_ids,
          staged_counts, idx_mapping, query_start_loc, positions):
    tables = (block_table_0, block_table_1, block_table_2)
    int32_inputs = (*tables, num_blocks, write_requests, staged_ids, staged_counts, idx_mapping, query_start_loc)
    if any(t.dtype != torch.int32 for t in int32_inputs) or overwrite.dtype != torch.bool \
            or positions.dtype != torch.int64:
        raise TypeError("block_table_update cute: int32 tables, counts and lists, bool overwrite, int64 positions")
    if not all(t.is_contiguous() for t in (*tables, num_blocks)):
        raise ValueError("block_table_update cute: tables and num_blocks must be contiguous (updated in place)")
    reqs = block_table_0.shape[0]
    writes, capacity = staged_ids.shape[1], staged_ids.shape[2]
    tokens, batch = positions.numel(), idx_mapping.numel()
    if reqs == 0:
        raise ValueError("block_table_update cute: the tables have no request rows")
    slot_mappings = torch.empty((GROUPS, tokens), dtype=torch.int64, device=positions.device)
    require_int32_indexing(*tables, staged_ids, slot_mappings)
    lists = [t.contiguous() for t in (write_requests, overwrite.view(torch.uint8), staged_ids, staged_counts,
                                      idx_mapping, query_start_loc, positions)]
    kernel = _compiled(gpu_arch(positions.device))
    kernel(*(gmem_ptr(t, t.element_size()) for t in (*tables, num_blocks, *lists, slot_mappings)),
           reqs, *(t.shape[1] for t in tables), writes, capacity, batch, tokens, stream_of(positions))
    return (*tables, num_blocks, slot_mappings)


def compile_for(arch: str, sizes: list[dict]) -> None:
    _compiled(arch)
