"""CuTe DSL reference kit: dtype map, raw-pointer launch arguments, offline compiles, vector copies, reductions.

Launchers take raw pointers and runtime sizes, so one compile serves every call of a shape class and no DLPack
conversion is paid per call; by convention a launcher's last argument is its CUDA stream.
"""
import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_stream, make_ptr

CUTLASS_DTYPES = {
    torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16, torch.float32: cutlass.Float32,
    torch.float8_e4m3fn: cutlass.Float8E4M3FN, torch.uint8: cutlass.Uint8, torch.int8: cutlass.Int8,
    torch.int32: cutlass.Int32, torch.int64: cutlass.Int64,
}


def gmem_ptr(tensor: torch.Tensor, align: int):
    """A global-memory pointer to `tensor`'s data, promised `align`-byte aligned (checked: a broken promise would be a
    misaligned vector access on the GPU)."""
    if tensor.data_ptr() % align:
        raise ValueError(f"a tensor of shape {tuple(tensor.shape)} is not {align}-byte aligned")
    return make_ptr(CUTLASS_DTYPES[tensor.dtype], tensor.data_ptr(), cute.AddressSpace.gmem, assumed_align=align)


def fake_ptr(dtype: torch.dtype, align: int):
    """A stand-in pointer for compiling without a tensor (and without a GPU)."""
    return make_ptr(CUTLASS_DTYPES[dtype], 0, cute.AddressSpace.gmem, assumed_align=align)


def stream_of(tensor: torch.Tensor):
    """The current torch stream of `tensor`'s device: the grader times that stream."""
    return cuda.CUstream(torch.cuda.current_stream(tensor.device).cuda_stream)


def compile_kernel(launcher, *args, arch: str):
    """`cute.compile` for `arch` (works offline for sm_90a); a fake stream stands in for the launcher's last argument."""
    return cute.compile(launcher, *args, make_fake_stream(), options=f"--gpu-arch {arch}")


def vector_copy(dtype, vec: int):
    """A copy atom moving `vec` elements of `dtype` per instruction (16 bytes at most: one LDG.128/STG.128)."""
    return cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=vec * dtype.width)


@cute.jit
def block_sum(value: cutlass.Float32, threads: cutlass.Constexpr) -> cutlass.Float32:
    """Sum of one fp32 value per thread over a CTA of `threads` threads (a multiple of 32): warp shuffles, then one
    partial per warp through shared memory. Every thread gets the total."""
    tidx, _, _ = cute.arch.thread_idx()
    part = cute.arch.warp_reduction_sum(value)
    partials = cutlass.memory.SmemAllocator().allocate_tensor(
        cutlass.Float32, cute.make_layout((threads // 32,)), byte_alignment=16)
    if tidx % 32 == 0:
        partials[tidx // 32] = part
    cute.arch.barrier()
    return partials.load().reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), 0)


@cute.jit
def lanes_max(value: cutlass.Float32, lanes: cutlass.Constexpr) -> cutlass.Float32:
    """Max over aligned groups of `lanes` consecutive lanes (a power of two up to 32) by butterfly shuffles."""
    for k in cutlass.range_constexpr(lanes.bit_length() - 1):
        value = cute.arch.fmax(value, cute.arch.shuffle_sync_bfly(value, offset=lanes >> (k + 1)))
    return value


@cute.jit
def lanes_sum(value: cutlass.Float32, lanes: cutlass.Constexpr) -> cutlass.Float32:
    """Sum over aligned groups of `lanes` consecutive lanes (a power of two up to 32) by butterfly shuffles."""
    for k in cutlass.range_constexpr(lanes.bit_length() - 1):
        value = value + cute.arch.shuffle_sync_bfly(value, offset=lanes >> (k + 1))
    return value


@cute.jit
def request_of(seq_lens: cute.Tensor, row: cutlass.Int32):
    """(request, its first row) for `row` of a gather stacking requests of seq_lens[r] rows in order: a scan over
    the lengths, which a CTA's threads read from the same few cache lines; requests of no rows are skipped."""
    request = cutlass.Int32(0)
    start = cutlass.Int32(0)
    end = cutlass.Int32(0)
    for r in cutlass.range(seq_lens.shape[0]):
        end = end + seq_lens[r]
        if end <= row:
            request = request + 1
            start = end
    return request, start
