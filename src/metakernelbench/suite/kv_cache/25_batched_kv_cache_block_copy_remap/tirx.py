"""Block copy remap in TIRx: a CTA per (mapping pair, piece of a block) copies that piece of the K and the V block with
16-byte vectors, every load issued before the first store; block offsets are 64-bit."""
import functools

import torch
from tvm_tirx.script import tirx as T

from metakernelbench.suite.kits.common import gpu_arch, vector_width
from metakernelbench.suite.kits.tirx import TIRX_DTYPES, build_cpu, build_cuda, nvcc_build

CPU_PATH = True
_THREADS = 256
_ITERS = 4  # vectors per thread and pool: 2 x 4 x 16 bytes in flight per thread, 32 KB per CTA
# Pools move as words (torch view dtype, TIRx dtype, words per vector): a 16-byte vector is four int32, one
# LDG.128 / STG.128; integer words copy every bit pattern exactly.
_WORDS = {16: (torch.int32, "int32", 4), 8: (torch.int32, "int32", 2), 4: (torch.int32, "int32", 1),
          2: (torch.int16, "int16", 1), 1: (torch.uint8, "uint8", 1)}


def _at(start, lanes):
    """Index of a `lanes`-word vector at `start`: a ramp, or the scalar index itself for one word (TIRx has no
    one-lane ramp)."""
    return T.Ramp(start, 1, lanes) if lanes > 1 else start


def _kernel(row, word, lanes, align, map_dtype):
    """row: words per block; lanes: words per vector of `align` bytes."""
    blocks = T.dynamic("blocks")
    m = T.dynamic("m")
    per_cta = _THREADS * _ITERS * lanes
    pieces = -(-row // per_cta)

    @T.function
    def block_copy(src_k: T.Tensor((blocks, row), word, data_alignment=align),
                   src_v: T.Tensor((blocks, row), word, data_alignment=align),
                   dst_k: T.Tensor((blocks, row), word, data_alignment=align),
                   dst_v: T.Tensor((blocks, row), word, data_alignment=align),
                   block_mapping: T.Tensor((m, 2), map_dtype)):
        T.device_entry(launch=T.cuda.LaunchConfig(grid=(m, pieces), block=_THREADS))
        pair = T.cuda.block_idx("x")
        first = T.cuda.block_idx("y") * per_cta + T.cuda.thread_idx("x") * lanes
        # int64 block ids: block * row can pass 2**31 in real pools.
        src = T.Cast("int64", block_mapping[pair, 0])
        dst = T.Cast("int64", block_mapping[pair, 1])
        k = T.alloc_local((_ITERS * lanes,), word)
        v = T.alloc_local((_ITERS * lanes,), word)
        for i in T.unroll(_ITERS):
            c = first + i * _THREADS * lanes
            if c < row:
                k[_at(i * lanes, lanes)] = src_k[src, _at(T.int64(c), lanes)]
                v[_at(i * lanes, lanes)] = src_v[src, _at(T.int64(c), lanes)]
        for i in T.unroll(_ITERS):
            c = first + i * _THREADS * lanes
            if c < row:
                dst_k[dst, _at(T.int64(c), lanes)] = k[_at(i * lanes, lanes)]
                dst_v[dst, _at(T.int64(c), lanes)] = v[_at(i * lanes, lanes)]

    return block_copy


@functools.cache
def _compiled(row, word, lanes, align, map_dtype, arch):
    return build_cuda(_kernel(row, word, lanes, align, map_dtype), arch)


@functools.cache
def _cpu_compiled(row, map_dtype):
    """Host (llvm) kernel: one parallel iteration per pair copies its K and V block byte by byte."""
    blocks = T.dynamic("blocks")
    m = T.dynamic("m")

    @T.function
    def block_copy_cpu(src_k: T.Tensor((blocks, row), "uint8"), src_v: T.Tensor((blocks, row), "uint8"),
                       dst_k: T.Tensor((blocks, row), "uint8"), dst_v: T.Tensor((blocks, row), "uint8"),
                       block_mapping: T.Tensor((m, 2), map_dtype)):
        for pair in T.parallel(m):
            src = T.Cast("int64", block_mapping[pair, 0])
            dst = T.Cast("int64", block_mapping[pair, 1])
            for c in range(row):
                dst_k[dst, c] = src_k[src, c]
                dst_v[dst, c] = src_v[src, c]

    return build_cpu(block_copy_cpu)


def _plan(block_bytes, addresses):
    """The widest vector the block size and pool addresses allow, as (torch view dtype, words per block, TIRx word
    dtype, words per vector, vector bytes)."""
    vec = vector_width(1, block_bytes, addresses)
    view, word, lanes = _WORDS[vec]
    return view, block_bytes // (vec // lanes), word, lanes, vec


def solve(src_k, src_v, dst_k, dst_v, block_mapping):
    pools = (src_k, src_v, dst_k, dst_v)
    if any(p.shape != src_k.shape or p.dtype != src_k.dtype for p in pools):
        raise ValueError("block_copy_remap tirx: the four pools must share one shape and dtype")
    if not all(p.is_contiguous() for p in pools):
        raise ValueError("block_copy_remap tirx: the pools must be contiguous (the copy is in place)")
    if block_mapping.dtype not in (torch.int32, torch.int64) or block_mapping.shape[-1:] != (2,):
        raise TypeError("block_copy_remap tirx: block_mapping must be int32 or int64 of shape [num_mappings, 2]")
    mappings, blocks = block_mapping.shape[0], src_k.shape[0]
    if mappings == 0 or src_k.numel() == 0:
        return dst_k, dst_v
    block_bytes = src_k[0].numel() * src_k.element_size()
    block_mapping = block_mapping.contiguous()
    map_dtype = TIRX_DTYPES[block_mapping.dtype]
    if not src_k.is_cuda:
        _cpu_compiled(block_bytes, map_dtype)(*(p.view(torch.uint8).view(blocks, block_bytes) for p in pools),
                                              block_mapping)
        return dst_k, dst_v
    view, row, word, lanes, vec = _plan(block_bytes, [p.data_ptr() for p in pools])
    kernel = _compiled(row, word, lanes, vec, map_dtype, gpu_arch(src_k.device))
    kernel(*(p.view(torch.uint8).view(blocks, block_bytes).view(view) for p in pools), block_mapping)
    return dst_k, dst_v


def compile_for(arch: str, sizes: list[dict]) -> None:
    for dims in sizes:
        block_bytes = dims["block_size"] * dims["num_heads"] * dims["head_dim"]
        _, row, word, lanes, vec = _plan(block_bytes, ())
        nvcc_build(_compiled(row, word, lanes, vec, "int64", arch), f"block={block_bytes} bytes")
