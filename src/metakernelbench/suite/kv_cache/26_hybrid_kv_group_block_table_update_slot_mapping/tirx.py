"""Hybrid KV-group block tables in TIRx, one launch: a CTA per request row. Warp g applies the row's staged writes of
group g in write order (the lanes store a write's ids side by side), then the CTA maps the tokens of the batches that
run this request through the updated row; the tokens past the last batch get -1, spread over the CTAs.

A request's writes and its slot lookups touch only its own table rows, so the CTA barrier between the two phases is
the only ordering the problem needs. The write and batch lists are staged in shared memory a tile at a time, so the
ordered scans read shared memory, not global. On the host (llvm) one parallel iteration per request row runs the same
two phases, and a last loop pads the tail."""
import functools

import torch
from tvm_tirx.script import tirx as T

from metakernelbench.suite.kits.common import gpu_arch, require_int32_indexing
from metakernelbench.suite.kits.tirx import build_cpu, build_cuda, nvcc_build

CPU_PATH = True
BLOCK_SIZES = (16, 32, 8)
KERNEL_BLOCK_SIZES = (16, 16, 8)
_GROUPS = len(BLOCK_SIZES)
_EXPANSION = tuple(b // k for b, k in zip(BLOCK_SIZES, KERNEL_BLOCK_SIZES))
_THREADS = 128  # warps 0..2 write the tables, all four map tokens
_TILE = _THREADS  # list entries staged per pass, one per thread


def _kernel():
    reqs, w0, w1, w2 = T.dynamic("reqs"), T.dynamic("w0"), T.dynamic("w1"), T.dynamic("w2")
    writes, capacity = T.dynamic("writes"), T.dynamic("capacity")
    batch, tokens = T.dynamic("batch"), T.dynamic("tokens")
    e0, e1, e2 = _EXPANSION
    k0, k1, k2 = KERNEL_BLOCK_SIZES

    @T.function
    def block_table_update(block_table_0: T.Tensor((reqs, w0), "int32"), block_table_1: T.Tensor((reqs, w1), "int32"),
                           block_table_2: T.Tensor((reqs, w2), "int32"),
                           num_blocks: T.Tensor((_GROUPS, reqs), "int32"),
                           write_requests: T.Tensor((writes,), "int32"), overwrite: T.Tensor((writes,), "uint8"),
                           staged_ids: T.Tensor((_GROUPS, writes, capacity), "int32"),
                           staged_counts: T.Tensor((_GROUPS, writes), "int32"),
                           idx_mapping: T.Tensor((batch,), "int32"),
                           query_start_loc: T.Tensor((batch + 1,), "int32"),
                           positions: T.Tensor((tokens,), "int64"),
                           slot_mappings: T.Tensor((_GROUPS, tokens), "int64")):
        T.device_entry(launch=T.cuda.LaunchConfig(grid=reqs, block=_THREADS))
        r = T.cuda.block_idx("x")
        tid = T.cuda.thread_idx("x")
        warp = tid // 32
        lane = tid % 32
        s_list = T.alloc_shared((_TILE,), "int32")
        count = T.alloc_local((1,), "int32")
        # Phase 1: warp g replays the write list in order; every lane keeps the row's count of group g.
        count[0] = 0
        if warp < _GROUPS:
            count[0] = num_blocks[warp, r]
        for tile in range(T.ceildiv(writes, _TILE)):
            T.cuda.cta_sync()  # the previous tile is consumed
            if tile * _TILE + tid < writes:
                s_list[tid] = write_requests[tile * _TILE + tid]
            T.cuda.cta_sync()
            for j in range(T.min(_TILE, writes - tile * _TILE)):
                if s_list[j] == r:
                    w = tile * _TILE + j
                    if warp == 0:
                        start = T.if_then_else(overwrite[w] != T.uint8(0), 0, count[0])
                        n = staged_counts[0, w] * e0
                        for it in range(T.ceildiv(n, 32)):
                            if it * 32 + lane < n:
                                e = it * 32 + lane
                                block_table_0[r, start + e] = staged_ids[0, w, e // e0] * e0 + e % e0
                        T.cuda.warp_sync()  # a later write of the row may store the same entries from other lanes
                        count[0] = start + n
                    if warp == 1:
                        start = T.if_then_else(overwrite[w] != T.uint8(0), 0, count[0])
                        n = staged_counts[1, w] * e1
                        for it in range(T.ceildiv(n, 32)):
                            if it * 32 + lane < n:
                                e = it * 32 + lane
                                block_table_1[r, start + e] = staged_ids[1, w, e // e1] * e1 + e % e1
                        T.cuda.warp_sync()  # a later write of the row may store the same entries from other lanes
                        count[0] = start + n
                    if warp == 2:
                        start = T.if_then_else(overwrite[w] != T.uint8(0), 0, count[0])
                        n = staged_counts[2, w] * e2
                        for it in range(T.ceildiv(n, 32)):
                            if it * 32 + lane < n:
                                e = it * 32 + lane
                                block_table_2[r, start + e] = staged_ids[2, w, e // e2] * e2 + e % e2
                        T.cuda.warp_sync()  # a later write of the row may store the same entries from other lanes
                        count[0] = start + n
        if warp < _GROUPS and lane == 0:
            num_blocks[warp, r] = count[0]
        # Phase 2: the tokens of every batch that runs request r, through the rows just written.
        for tile in range(T.ceildiv(batch, _TILE)):
            T.cuda.cta_sync()  # phase 1's table stores (first tile) or the previous tile's reads are done
            if tile * _TILE + tid < batch:
                s_list[tid] = idx_mapping[tile * _TILE + tid]
            T.cuda.cta_sync()
            for j in range(T.min(_TILE, batch - tile * _TILE)):
                if s_list[j] == r:
                    first = query_start_loc[tile * _TILE + j]
                    end = query_start_loc[tile * _TILE + j + 1]
                    for it in range(T.ceildiv(T.max(end - first, 0), _THREADS)):
                        if first + it * _THREADS + tid < end:
                            i = first + it * _THREADS + tid
                            p = positions[i]
                            slot_mappings[0, i] = T.int64(block_table_0[r, T.Cast("int32", p // k0)]) * k0 + p % k0
                            slot_mappings[1, i] = T.int64(block_table_1[r, T.Cast("int32", p // k1)]) * k1 + p % k1
                            slot_mappings[2, i] = T.int64(block_table_2[r, T.Cast("int32", p // k2)]) * k2 + p % k2
        # Tokens past the last batch: -1, grid-strided.
        tail = query_start_loc[batch]
        for it in range(T.ceildiv(T.max(tokens - tail, 0), reqs * _THREADS)):
            if tail + (it * reqs + r) * _THREADS + tid < tokens:
                for g in T.unroll(_GROUPS):
                    slot_mappings[g, tail + (it * reqs + r) * _THREADS + tid] = T.int64(-1)

    return block_table_update


def _cpu_kernel():
    """Host (llvm) kernel: one parallel iteration per request row runs both phases for it; then the tail."""
    reqs, w0, w1, w2 = T.dynamic("reqs"), T.dynamic("w0"), T.dynamic("w1"), T.dynamic("w2")
    writes, capacity = T.dynamic("writes"), T.dynamic("capacity")
    batch, tokens = T.dynamic("batch"), T.dynamic("tokens")
    e0, e1, e2 = _EXPANSION
    k0, k1, k2 = KERNEL_BLOCK_SIZES

    @T.function
    def block_table_update_cpu(block_table_0: T.Tensor((reqs, w0), "int32"),
                               block_table_1: T.Tensor((reqs, w1), "int32"),
                               block_table_2: T.Tensor((reqs, w2), "int32"),
                               num_blocks: T.Tensor((_GROUPS, reqs), "int32"),
                               write_requests: T.Tensor((writes,), "int32"), overwrite: T.Tensor((writes,), "uint8"),
                               staged_ids: T.Tensor((_GROUPS, writes, capacity), "int32"),
                               staged_counts: T.Tensor((_GROUPS, writes), "int32"),
                               idx_mapping: T.Tensor((batch,), "int32"),
                               query_start_loc: T.Tensor((batch + 1,), "int32"),
                               positions: T.Tensor((tokens,), "int64"),
                               slot_mappings: T.Tensor((_GROUPS, tokens), "int64")):
        for r in T.parallel(reqs):
            count = T.alloc_local((_GROUPS,), "int32")
            for g in range(_GROUPS):
                count[g] = num_blocks[g, r]
            for w in range(writes):
                if write_requests[w] == r:
                    for g in range(_GROUPS):
                        if overwrite[w] != T.uint8(0):
                            count[g] = 0
                    for e in range(staged_counts[0, w] * e0):
                        block_table_0[r, count[0] + e] = staged_ids[0, w, e // e0] * e0 + e % e0
                    count[0] = count[0] + staged_counts[0, w] * e0
                    for e in range(staged_counts[1, w] * e1):
                        block_table_1[r, count[1] + e] = staged_ids[1, w, e // e1] * e1 + e % e1
                    count[1] = count[1] + staged_counts[1, w] * e1
                    for e in range(staged_counts[2, w] * e2):
                        block_table_2[r, count[2] + e] = staged_ids[2, w, e // e2] * e2 + e % e2
                    count[2] = count[2] + staged_counts[2, w] * e2
            for g in range(_GROUPS):
                num_blocks[g, r] = count[g]
            for b in range(batch):
                if idx_mapping[b] == r:
                    for i in range(query_start_loc[b], query_start_loc[b + 1]):
                        p = positions[i]
                        slot_mappings[0, i] = T.int64(block_table_0[r, T.Cast("int32", p // k0)]) * k0 + p % k0
                        slot_mappings[1, i] = T.int64(block_table_1[r, T.Cast("int32", p // k1)]) * k1 + p % k1
                        slot_mappings[2, i] = T.int64(block_table_2[r, T.Cast("int32", p // k2)]) * k2 + p % k2
        for i in range(query_start_loc[batch], tokens):
            for g in range(_GROUPS):
                slot_mappings[g, i] = T.int64(-1)

    return block_table_update_cpu


@functools.cache
def _compiled(arch):
    """Every size is dynamic: one kernel per target."""
    return build_cuda(_kernel(), arch) if arch else build_cpu(_cpu_kernel())


def solve(block_table_0, block_table_1, block_table_2, num_blocks, write_requests, overwrite, staged_ids,
          staged_counts, idx_mapping, query_start_loc, positions):
    tables = (block_table_0, block_table_1, block_table_2)
    int32_inputs = (*tables, num_blocks, write_requests, staged_ids, staged_counts, idx_mapping, query_start_loc)
    if any(t.dtype != torch.int32 for t in int32_inputs) or overwrite.dtype != torch.bool \
            or positions.dtype != torch.int64:
        raise TypeError("block_table_update tirx: int32 tables, counts and lists, bool overwrite, int64 positions")
    if not all(t.is_contiguous() for t in (*tables, num_blocks)):
        raise ValueError("block_table_update tirx: tables and num_blocks must be contiguous (updated in place)")
    if block_table_0.shape[0] == 0:
        raise ValueError("block_table_update tirx: the tables have no request rows")
    slot_mappings = torch.empty((_GROUPS, positions.numel()), dtype=torch.int64, device=positions.device)
    require_int32_indexing(*tables, staged_ids, slot_mappings)
    lists = [t.contiguous() for t in (write_requests, overwrite.view(torch.uint8), staged_ids, staged_counts,
                                      idx_mapping, query_start_loc, positions.reshape(-1))]
    _compiled(gpu_arch(positions.device) if positions.is_cuda else None)(*tables, num_blocks, *lists, slot_mappings)
    return (*tables, num_blocks, slot_mappings)


def compile_for(arch: str, sizes: list[dict]) -> None:
    nvcc_build(_compiled(arch), "block_table_update")
