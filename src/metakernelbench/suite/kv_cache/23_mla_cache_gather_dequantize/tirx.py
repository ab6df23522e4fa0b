"""MLA cache gather + dequantise in TIRx: a thread per 16 codes of an output row, 16-byte loads and stores."""
import functools

import torch
from tvm_tirx.script import tirx as T

from metakernelbench.suite.kits.common import gathered_rows, gpu_arch, require_int32_indexing
from metakernelbench.suite.kits.tirx import NO_FAST_MATH, build_cpu, build_cuda, e4m3_value, nvcc_build

CPU_PATH = True
_THREADS = 256
_CODES = 16  # e4m3 codes per thread: one 16-byte load
_OUT_VEC = 4  # fp32 per 16-byte store


def _kernel(entry, block_size):
    if entry % _CODES:
        raise ValueError(f"mla_cache_gather tirx: an entry of {entry} bytes is not a whole number of 16-byte vectors")
    chunks = entry // _CODES  # threads per output row
    rows = T.dynamic("rows")
    slots = T.dynamic("slots")
    requests = T.dynamic("requests")
    width = T.dynamic("width")

    @T.function
    def mla_cache_gather(
        cache: T.Tensor((slots, entry), T.float8_e4m3fn, align=16),
        block_table: T.Tensor((requests, width), T.int32),
        seq_lens: T.Tensor((requests,), T.int32),
        scale: T.float32,
        out: T.Tensor((rows, entry), T.float32, align=16),
    ):
        T.device_entry(launch=T.cuda.LaunchConfig(grid=T.ceildiv(rows * chunks, _THREADS), block=_THREADS),
                       backend_config=NO_FAST_MATH)
        gid = T.cuda.block_idx("x") * _THREADS + T.cuda.thread_idx("x")
        row = gid // chunks
        col = (gid % chunks) * _CODES
        codes = T.alloc_local((_CODES,), T.float8_e4m3fn)
        values = T.alloc_local((_CODES,), T.float32)
        if row < rows:
            # The request owning this row and its first row: a scan over the lengths (the same few cache lines for
            # every thread); requests of no tokens are skipped.
            request: T.int32 = 0
            start: T.int32 = 0
            end: T.int32 = 0
            for r in range(requests):
                end = end + seq_lens[r]
                if end <= row:
                    request = request + 1
                    start = end
            position = row - start
            block = block_table[request, position // block_size]
            slot = T.Cast("int64", block) * block_size + position % block_size
            codes[0:_CODES] = cache[slot, T.Ramp(T.int64(col), 1, _CODES)]
            for i in T.unroll(_CODES):
                values[i] = T.float32(codes[i]) * scale  # e4m3 -> fp32 is exact; one fp32 multiply
            for j in T.unroll(_CODES // _OUT_VEC):
                out[row, T.Ramp(col + j * _OUT_VEC, 1, _OUT_VEC)] = values[T.Ramp(j * _OUT_VEC, 1, _OUT_VEC)]

    return mla_cache_gather


def _cpu_kernel(entry, block_size):
    """Host (llvm) kernel: one parallel iteration per output row; codes are decoded from their bits."""
    rows = T.dynamic("rows")
    slots = T.dynamic("slots")
    requests = T.dynamic("requests")
    width = T.dynamic("width")

    @T.function
    def mla_cache_gather_cpu(
        cache: T.Tensor((slots, entry), T.uint8),
        block_table: T.Tensor((requests, width), T.int32),
        seq_lens: T.Tensor((requests,), T.int32),
        scale: T.float32,
        out: T.Tensor((rows, entry), T.float32),
    ):
        for row in T.parallel(rows):
            st = T.alloc_local((3,), T.int32)  # request, its first row, the running end
            st[0] = 0
            st[1] = 0
            st[2] = 0
            for r in range(requests):
                st[2] = st[2] + seq_lens[r]
                if st[2] <= row:
                    st[0] = st[0] + 1
                    st[1] = st[2]
            position = row - st[1]
            slot = T.Cast("int64", block_table[st[0], position // block_size]) * block_size + position % block_size
            for c in range(entry):
                out[row, c] = e4m3_value(cache[slot, c]) * scale

    return mla_cache_gather_cpu


@functools.cache
def _compiled(entry, block_size, arch):
    return build_cuda(_kernel(entry, block_size), arch) if arch else build_cpu(_cpu_kernel(entry, block_size))


def solve(src_cache, block_table, seq_lens, scale):
    if src_cache.dtype != torch.uint8 or src_cache.dim() != 3:
        raise TypeError("mla_cache_gather tirx: src_cache must be uint8 [num_blocks, block_size, entry] (e4m3 bits)")
    if block_table.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        raise TypeError("mla_cache_gather tirx: block_table and seq_lens must be int32")
    num_blocks, block_size, entry = src_cache.shape
    rows = gathered_rows(seq_lens)
    out = torch.empty((rows, entry), dtype=torch.float32, device=src_cache.device)
    if rows == 0:
        return out
    cache = src_cache.contiguous().view(num_blocks * block_size, entry)
    require_int32_indexing(out)
    if cache.is_cuda:  # the device kernel reads the bytes as e4m3, the host kernel decodes them itself
        cache, arch = cache.view(torch.float8_e4m3fn), gpu_arch(cache.device)
    else:
        arch = None
    _compiled(entry, block_size, arch)(cache, block_table.contiguous(), seq_lens.contiguous(), float(scale), out)
    return out


def compile_for(arch: str, sizes: list[dict]) -> None:
    for entry, block_size in {(d["kv_lora_rank"] + d["rope_dim"], d["block_size"]) for d in sizes}:
        nvcc_build(_compiled(entry, block_size, arch), f"entry={entry} block_size={block_size}")
