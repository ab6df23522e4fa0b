"""GroupNorm in CuTe DSL: one CTA per (sample, group), whose C/32 channels are one contiguous run of fp32; the run is
read once into registers with 16-byte loads, its mean and then its centred sum of squares reduced over the CTA (two
exact passes over registers), and written once, normalised and scaled by its channel's weight and bias."""
import functools

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from metakernelbench.suite.kits.common import gpu_arch, require_int32_indexing, vector_width
from metakernelbench.suite.kits.cute import block_sum, compile_kernel, fake_ptr, gmem_ptr, stream_of, vector_copy

NUM_GROUPS = 32
MAX_VECTORS_PER_THREAD = 16  # registers hold the whole group: refuse groups that would spill


def _plan(group_len: int, vec: int):
    """Threads per CTA (a power of two, about five vectors each) and vectors per thread."""
    nvec = group_len // vec
    threads = 32
    while threads < 1024 and threads * 8 < nvec:
        threads *= 2
    iters = -(-nvec // threads)
    if iters > MAX_VECTORS_PER_THREAD:
        raise ValueError(f"groupnorm cute: a group of {group_len} values does not fit one CTA's registers")
    return threads, iters


class _GroupNorm:
    def __init__(self, channels: int, spatial: int, vec: int):
        self.channels, self.spatial, self.vec = channels, spatial, vec
        self.group_channels = channels // NUM_GROUPS
        self.group_len = self.group_channels * spatial
        self.nvec = self.group_len // vec
        self.threads, self.iters = _plan(self.group_len, vec)

    @cute.jit
    def __call__(self, pX: cute.Pointer, pW: cute.Pointer, pB: cute.Pointer, pO: cute.Pointer,
                 groups: cutlass.Int32, eps: cutlass.Float32, stream: cuda.CUstream):
        # Sample n's group g is row n * 32 + g of the (groups, group_len) view of x: NCHW keeps it contiguous.
        rows = cute.make_layout((groups, self.group_len), stride=(self.group_len, 1))
        mX, mO = cute.make_tensor(pX, rows), cute.make_tensor(pO, rows)
        per_channel = cute.make_layout((self.channels,))
        mW, mB = cute.make_tensor(pW, per_channel), cute.make_tensor(pB, per_channel)
        self.kernel(mX, mW, mB, mO, eps).launch(grid=(groups, 1, 1), block=(self.threads, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mB: cute.Tensor, mO: cute.Tensor, eps: cutlass.Float32):
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        V, T, n = self.vec, self.threads, self.iters
        copy = vector_copy(mX.element_type, V)
        first_channel = (row % NUM_GROUPS) * self.group_channels
        # (V, nvec) views: column c is one aligned vector of the group; thread t owns c = t, t + T, ...
        gX = cute.zipped_divide(mX[row, None], (V,))
        gO = cute.zipped_divide(mO[row, None], (V,))
        rX = cute.make_rmem_tensor((V, n), cutlass.Float32)
        rX.fill(0)  # vectors past the group's end stay zero and add nothing to the sum
        for i in cutlass.range_constexpr(n):
            if i * T + tidx < self.nvec:
                cute.copy(copy, gX[None, i * T + tidx], rX[None, i])
        mean = block_sum(rX.load().reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), 0), T) / self.group_len
        # Only a thread's last vector can lie past the end (n = ceil(nvec / T)): it joins the sum of squared
        # deviations only where it exists.
        squares = cutlass.Float32(0.0)
        for i in cutlass.range_constexpr(n):
            d = rX[None, i].load() - mean
            part = (d * d).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), 0)
            if cutlass.const_expr((i + 1) * T <= self.nvec):
                squares = squares + part
            else:
                squares = squares + cutlass.select_(i * T + tidx < self.nvec, part, cutlass.Float32(0.0))
        std = cute.math.sqrt(block_sum(squares, T) / self.group_len + eps)

        rO = cute.make_rmem_tensor((V, n), cutlass.Float32)
        for i in cutlass.range_constexpr(n):
            if i * T + tidx < self.nvec:  # past the end a channel index would leave weight and bias
                first = (i * T + tidx) * V  # the vector's first element within the group
                if cutlass.const_expr(self.spatial % V == 0):  # a vector never straddles two channels
                    channel = first_channel + first // self.spatial
                    rO[None, i].store((rX[None, i].load() - mean) / std * mW[channel] + mB[channel])
                else:
                    for j in cutlass.range_constexpr(V):
                        channel = first_channel + (first + j) // self.spatial
                        rO[j, i] = (rX[j, i] - mean) / std * mW[channel] + mB[channel]
                cute.copy(copy, rO[None, i], gO[None, i * T + tidx])


@functools.cache
def _compiled(channels, spatial, vec, arch):
    """Compile once per channel count, H * W, vector width and arch; the batch stays dynamic."""
    x, p = fake_ptr(torch.float32, vec * 4), fake_ptr(torch.float32, 4)
    return compile_kernel(_GroupNorm(channels, spatial, vec), x, p, p, x, cutlass.Int32(1), cutlass.Float32(1e-5),
                          arch=arch)


def solve(x, weight, bias, eps):
    if not (x.dtype == weight.dtype == bias.dtype == torch.float32):
        raise TypeError("groupnorm cute kernel takes fp32 x, weight and bias")
    if x.dim() != 4 or x.shape[1] % NUM_GROUPS or weight.shape != x.shape[1:2] or bias.shape != x.shape[1:2]:
        raise ValueError(f"groupnorm cute kernel takes x [N, C, H, W] with C a multiple of {NUM_GROUPS}, "
                         "weight and bias [C]")
    batch, channels, height, width = x.shape
    x, w, b = x.contiguous(), weight.contiguous(), bias.contiguous()
    out = torch.empty_like(x)
    if x.numel() == 0:
        return out
    require_int32_indexing(x)
    spatial = height * width
    vec = vector_width(4, channels // NUM_GROUPS * spatial, (x.data_ptr(), out.data_ptr()))
    _compiled(channels, spatial, vec, gpu_arch(x.device))(
        gmem_ptr(x, vec * 4), gmem_ptr(w, 4), gmem_ptr(b, 4), gmem_ptr(out, vec * 4), batch * NUM_GROUPS, eps,
        stream_of(x))
    return out


def compile_for(arch: str, sizes: list[dict]) -> None:
    for channels, spatial in {(d["channels"], d["height"] * d["width"]) for d in sizes}:  # the batch is dynamic
        _compiled(channels, spatial, vector_width(4, channels // NUM_GROUPS * spatial), arch)
