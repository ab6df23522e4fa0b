"""Mixed-layout FP8 cache gather + bf16 upconvert in TIRx: a warp per token, 16-byte loads and stores throughout.

Lane l of a token's warp turns codes [16 l, 16 l + 16) into bf16 with scale l // 8 (one 16-byte load, two 16-byte
stores); lanes 0-7 also copy 16 bytes of the rope each. The cache is read through three typed views of its bytes.
"""
import functools

import torch
from tvm_tirx.script import tirx as T

from metakernelbench.suite.kits.common import gathered_rows, gpu_arch, require_int32_indexing
from metakernelbench.suite.kits.tirx import NO_FAST_MATH, build_cpu, build_cuda, e4m3_value, nvcc_build

CPU_PATH = True
NOPE_DIM = 512
ROPE_DIM = 64
GROUP_SIZE = 128
ENTRY_BYTES = 656
SCALES_AT = NOPE_DIM // 4  # the scales' first fp32 word in an entry
ROPE_AT = (NOPE_DIM + 16) // 2  # the rope's first bf16 in an entry
_CODES = 16  # codes per lane: one 16-byte load
_VEC = 8  # bf16 per 16-byte store
_TOKENS_PER_CTA = 4
_THREADS = 32 * _TOKENS_PER_CTA


def _kernel(block_size):
    rows = T.dynamic("rows")
    slots = T.dynamic("slots")
    requests = T.dynamic("requests")
    width = T.dynamic("width")
    out_width = NOPE_DIM + ROPE_DIM

    @T.function
    def cp_gather_upconvert(
        codes: T.Tensor((slots, ENTRY_BYTES), T.float8_e4m3fn, align=16),
        scales: T.Tensor((slots, ENTRY_BYTES // 4), T.float32, align=16),
        rope: T.Tensor((slots, ENTRY_BYTES // 2), T.bfloat16, align=16),
        block_table: T.Tensor((requests, width), T.int32),
        seq_lens: T.Tensor((requests,), T.int32),
        out: T.Tensor((rows, out_width), T.bfloat16, align=16),
    ):
        T.device_entry(launch=T.cuda.LaunchConfig(grid=T.ceildiv(rows, _TOKENS_PER_CTA), block=_THREADS),
                       backend_config=NO_FAST_MATH)
        row = T.cuda.block_idx("x") * _TOKENS_PER_CTA + T.cuda.thread_idx("x") // 32
        lane = T.cuda.thread_idx("x") % 32
        cv = T.alloc_local((_CODES,), T.float8_e4m3fn)
        rv = T.alloc_local((_VEC,), T.bfloat16)
        ov = T.alloc_local((_CODES,), T.bfloat16)
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
            slot = T.Cast("int64", block_table[request, position // block_size]) * block_size + position % block_size
            cv[0:_CODES] = codes[slot, T.Ramp(T.int64(lane * _CODES), 1, _CODES)]
            scale = scales[slot, SCALES_AT + lane * _CODES // GROUP_SIZE]
            if lane < ROPE_DIM // _VEC:
                rv[0:_VEC] = rope[slot, T.Ramp(T.int64(ROPE_AT + lane * _VEC), 1, _VEC)]
            for i in T.unroll(_CODES):
                ov[i] = T.bfloat16(T.float32(cv[i]) * scale)  # exact e4m3 -> fp32, one fp32 product, one rounding
            for j in T.unroll(_CODES // _VEC):
                out[row, T.Ramp(lane * _CODES + j * _VEC, 1, _VEC)] = ov[T.Ramp(j * _VEC, 1, _VEC)]
            if lane < ROPE_DIM // _VEC:
                out[row, T.Ramp(NOPE_DIM + lane * _VEC, 1, _VEC)] = rv[T.Ramp(0, 1, _VEC)]

    return cp_gather_upconvert


def _cpu_kernel(block_size):
    """Host (llvm) kernel: one parallel iteration per output row; codes are decoded from their bits and the rope
    moves as 16-bit integers (bit for bit)."""
    rows = T.dynamic("rows")
    slots = T.dynamic("slots")
    requests = T.dynamic("requests")
    width = T.dynamic("width")
    out_width = NOPE_DIM + ROPE_DIM

    @T.function
    def cp_gather_upconvert_cpu(
        codes: T.Tensor((slots, ENTRY_BYTES), T.uint8),
        scales: T.Tensor((slots, ENTRY_BYTES // 4), T.float32),
        rope: T.Tensor((slots, ENTRY_BYTES // 2), T.int16),
        block_table: T.Tensor((requests, width), T.int32),
        seq_lens: T.Tensor((requests,), T.int32),
        out: T.Tensor((rows, out_width), T.bfloat16),
        out_bits: T.Tensor((rows, out_width), T.int16),
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
            for i in range(NOPE_DIM):
                out[row, i] = T.bfloat16(e4m3_value(codes[slot, i]) * scales[slot, SCALES_AT + i // GROUP_SIZE])
            for i in range(ROPE_DIM):
                out_bits[row, NOPE_DIM + i] = rope[slot, ROPE_AT + i]

    return cp_gather_upconvert_cpu


@functools.cache
def _compiled(block_size, arch):
    return build_cuda(_kernel(block_size), arch) if arch else build_cpu(_cpu_kernel(block_size))


def solve(cache, block_table, seq_lens):
    if cache.dtype != torch.uint8 or cache.dim() != 3 or cache.shape[2] != ENTRY_BYTES:
        raise TypeError(f"cp_gather_upconvert tirx: cache must be uint8 [num_blocks, block_size, {ENTRY_BYTES}]")
    if block_table.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        raise TypeError("cp_gather_upconvert tirx: block_table and seq_lens must be int32")
    num_blocks, block_size, _ = cache.shape
    rows = gathered_rows(seq_lens)
    out = torch.empty((rows, NOPE_DIM + ROPE_DIM), dtype=torch.bfloat16, device=cache.device)
    if rows == 0:
        return out
    entries = cache.contiguous().view(num_blocks * block_size, ENTRY_BYTES)
    require_int32_indexing(out)
    # Three views of the same bytes: e4m3 codes, fp32 scale words, bf16 rope halves (656 = 41 x 16 bytes).
    table, lens = block_table.contiguous(), seq_lens.contiguous()
    if cache.is_cuda:
        _compiled(block_size, gpu_arch(cache.device))(
            entries.view(torch.float8_e4m3fn), entries.view(torch.float32), entries.view(torch.bfloat16), table,
            lens, out)
    else:
        _compiled(block_size, None)(entries, entries.view(torch.float32), entries.view(torch.int16), table, lens,
                                    out, out.view(torch.int16))
    return out


def compile_for(arch: str, sizes: list[dict]) -> None:
    for block_size in {d["block_size"] for d in sizes}:
        nvcc_build(_compiled(block_size, arch), f"block_size={block_size}")
