"""GroupNorm in TIRx: one CTA per (sample, group), whose C/32 channels are one contiguous run of fp32; the run is read
once into registers with 16-byte loads, its mean and then its centred sum of squares reduced over the CTA (two exact
passes over registers), and written once, normalised and scaled by its channel's weight and bias."""
import functools

import torch
from tvm_tirx.script import tirx as T

from metakernelbench.suite.kits.common import gpu_arch, require_int32_indexing
from metakernelbench.suite.kits.tirx import NO_FAST_MATH, build_cpu, build_cuda, nvcc_build

NUM_GROUPS = 32
CPU_PATH = True  # a host (llvm) build too: CI grades it on the CPU
_MAX_VECTORS_PER_THREAD = 16  # registers hold the whole group: refuse groups that would spill


def _plan(group_len):
    """Elements per vector (16 bytes where the group allows), threads per CTA (a power of two, about five vectors
    each) and vectors per thread."""
    vec = next(v for v in (4, 2, 1) if group_len % v == 0)
    nvec = group_len // vec
    threads = 32
    while threads < 1024 and threads * 8 < nvec:
        threads *= 2
    iters = -(-nvec // threads)
    if iters > _MAX_VECTORS_PER_THREAD:
        raise ValueError(f"groupnorm tirx: a group of {group_len} values does not fit one CTA's registers")
    return vec, threads, iters


def _lanes(start, vec):
    """Index of `vec` consecutive elements from `start`: a Ramp, or the plain index when vec is 1 (a Ramp needs
    two lanes or more)."""
    return T.Ramp(start, 1, vec) if vec > 1 else start


def _kernel(channels, spatial):
    group_channels = channels // NUM_GROUPS
    group_len = group_channels * spatial
    vec, threads, iters = _plan(group_len)
    nvec = group_len // vec
    warps = threads // 32
    ng = T.dynamic("ng")

    @T.function
    def groupnorm(
        X: T.Tensor((ng, group_len), T.float32, align=4 * vec),
        W: T.Tensor((channels,), T.float32, align=4),
        B: T.Tensor((channels,), T.float32, align=4),
        O: T.Tensor((ng, group_len), T.float32, align=4 * vec),
        eps: T.float32,
    ):
        # IEEE division and square root, as the reference's (x - mean) / sqrt(var + eps).
        T.device_entry(launch=T.cuda.LaunchConfig(grid=ng, block=threads), backend_config=NO_FAST_MATH)
        row = T.cuda.block_idx("x")  # sample n's group g is row n * 32 + g: NCHW keeps it contiguous
        tx = T.cuda.thread_idx("x")
        first_channel = (row % NUM_GROUPS) * group_channels
        xv = T.alloc_local((iters * vec,), T.float32)
        ov = T.alloc_local((vec,), T.float32)
        scratch_sum = T.alloc_shared((warps,), T.float32)
        scratch_squares = T.alloc_shared((warps,), T.float32)
        # Vector c = it * threads + tx: each load instruction of the CTA covers one contiguous run.
        total: T.float32 = 0.0
        for it in T.unroll(iters):
            c = it * threads + tx
            if c < nvec:
                xv[_lanes(it * vec, vec)] = X[row, _lanes(c * vec, vec)]
                for j in T.unroll(vec):
                    total = total + xv[it * vec + j]
        mean = T.cuda.cta_sum(total, warps, scratch_sum.data) / T.float32(group_len)
        squares: T.float32 = 0.0
        for it in T.unroll(iters):
            if it * threads + tx < nvec:
                for j in T.unroll(vec):
                    squares = squares + (xv[it * vec + j] - mean) * (xv[it * vec + j] - mean)
        std = T.sqrt(T.cuda.cta_sum(squares, warps, scratch_squares.data) / T.float32(group_len) + eps)
        for it in T.unroll(iters):
            c = it * threads + tx
            if c < nvec:  # past the end a channel index would leave weight and bias
                for j in T.unroll(vec):
                    channel = first_channel + (c * vec + j) // spatial
                    ov[j] = (xv[it * vec + j] - mean) / std * W[channel] + B[channel]
                O[row, _lanes(c * vec, vec)] = ov[_lanes(0, vec)]

    return groupnorm


def _cpu_kernel(channels, spatial):
    """Host (llvm) kernel: one parallel iteration per (sample, group), three passes over the group."""
    group_channels = channels // NUM_GROUPS
    group_len = group_channels * spatial
    ng = T.dynamic("ng")

    @T.function
    def groupnorm_cpu(
        X: T.Tensor((ng, group_len), T.float32),
        W: T.Tensor((channels,), T.float32),
        B: T.Tensor((channels,), T.float32),
        O: T.Tensor((ng, group_len), T.float32),
        eps: T.float32,
    ):
        for row in T.parallel(ng):
            st = T.alloc_local((3,), T.float32)
            st[0] = T.float32(0)
            for j in range(group_len):
                st[0] = st[0] + X[row, j]
            st[1] = st[0] / T.float32(group_len)
            st[0] = T.float32(0)
            for j in range(group_len):
                st[0] = st[0] + (X[row, j] - st[1]) * (X[row, j] - st[1])
            st[2] = T.sqrt(st[0] / T.float32(group_len) + eps)
            for j in range(group_len):
                channel = (row % NUM_GROUPS) * group_channels + j // spatial
                O[row, j] = (X[row, j] - st[1]) / st[2] * W[channel] + B[channel]

    return groupnorm_cpu


@functools.cache
def _compiled(channels, spatial, arch):
    if arch:
        return build_cuda(_kernel(channels, spatial), arch)
    return build_cpu(_cpu_kernel(channels, spatial))


def solve(x, weight, bias, eps):
    if not (x.dtype == weight.dtype == bias.dtype == torch.float32):
        raise TypeError("groupnorm tirx kernel takes fp32 x, weight and bias")
    if x.dim() != 4 or x.shape[1] % NUM_GROUPS or weight.shape != x.shape[1:2] or bias.shape != x.shape[1:2]:
        raise ValueError(f"groupnorm tirx kernel takes x [N, C, H, W] with C a multiple of {NUM_GROUPS}, "
                         "weight and bias [C]")
    batch, channels, height, width = x.shape
    rows = x.contiguous().view(batch * NUM_GROUPS, -1)
    require_int32_indexing(rows)
    out = torch.empty_like(rows)
    if rows.numel() > 0:
        kernel = _compiled(channels, height * width, gpu_arch(x.device) if x.is_cuda else None)
        kernel(rows, weight.contiguous(), bias.contiguous(), out, eps)
    return out.view(x.shape)


def compile_for(arch: str, sizes: list[dict]) -> None:
    for channels, spatial in {(d["channels"], d["height"] * d["width"]) for d in sizes}:  # the batch is dynamic
        nvcc_build(_compiled(channels, spatial, arch), f"channels={channels}, spatial={spatial}")
