"""Residual RMSNorm backward in CuTe DSL, two kernels. The row kernel gives each CTA a block of rows and each thread a
fixed run of 8 columns (one 16-byte load of gradients, two of normalized values per row), two rows per step: per
row a CTA-wide dot product, then grad_x written twice, while the thread's fp32 column sums of g * normalized
accumulate over the block into one partial row per CTA. The column kernel adds the partial rows in fp64."""
import functools

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from metakernelbench.suite.kits.common import gpu_arch, require_int32_indexing
from metakernelbench.suite.kits.cute import compile_kernel, fake_ptr, gmem_ptr, stream_of, vector_copy

VEC = 8  # columns per thread
HALF = 4  # fp32 values per 16-byte access
MAX_ROWS_PER_CTA = 128  # rows per partial sum: short fp32 chains; 4 096 CTAs (many waves) at full size
CTAS_PER_SM = 4  # the grid aims at this many CTAs per SM before the row blocks shrink below the maximum
COLUMN_THREADS = 1024  # column kernel: 32 columns x 32 slices of the partial rows
COLUMN_LOADS = 8  # partial rows each column-kernel thread loads at once


class _RowBackward:
    def __init__(self, hidden: int):
        self.hidden = hidden
        self.chunks = hidden // VEC
        self.threads = -(-self.chunks // 32) * 32
        self.warps = self.threads // 32

    @cute.jit
    def __call__(self, pG: cute.Pointer, pN: cute.Pointer, pR: cute.Pointer, pW: cute.Pointer,
                 pDH: cute.Pointer, pDR: cute.Pointer, pP: cute.Pointer, rows: cutlass.Int32,
                 rows_per_cta: cutlass.Int32, stream: cuda.CUstream):
        grid = (rows + rows_per_cta - 1) // rows_per_cta
        matrix = cute.make_layout((rows, self.hidden), stride=(self.hidden, 1))
        mG, mN, mDH, mDR = [cute.make_tensor(p, matrix) for p in (pG, pN, pDH, pDR)]
        mR = cute.make_tensor(pR, cute.make_layout((rows,)))
        mW = cute.make_tensor(pW, cute.make_layout((self.hidden,)))
        mP = cute.make_tensor(pP, cute.make_layout((grid, self.hidden), stride=(self.hidden, 1)))
        self.kernel(mG, mN, mR, mW, mDH, mDR, mP, rows_per_cta).launch(
            grid=(grid, 1, 1), block=(self.threads, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mG: cute.Tensor, mN: cute.Tensor, mR: cute.Tensor, mW: cute.Tensor, mDH: cute.Tensor,
               mDR: cute.Tensor, mP: cute.Tensor, rows_per_cta: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        warp, lane = tidx // 32, tidx % 32
        live = tidx < self.chunks  # thread t owns columns 8t .. 8t + 7
        copy_g = vector_copy(mG.element_type, VEC)
        copy_n = vector_copy(cutlass.Float32, HALF)
        first = bidx * rows_per_cta
        end = cutlass.min(first + rows_per_cta, mG.shape[0])

        rW = cute.make_rmem_tensor((VEC,), cutlass.Float32)
        rW.fill(0)
        if live:
            gW = cute.zipped_divide(mW, (HALF,))
            for h in cutlass.range_constexpr(2):
                cute.copy(copy_n, gW[None, 2 * tidx + h], cute.zipped_divide(rW, (HALF,))[None, h])
        w = rW.load()
        acc = cute.make_rmem_tensor((VEC,), cutlass.Float32)
        acc.fill(0)
        # Per-warp partial dot products of the step's two rows, double-buffered by step parity: a warp that races
        # ahead writes the other buffer while slower warps still read this one.
        partials = cutlass.memory.SmemAllocator().allocate_tensor(
            cutlass.Float32, cute.make_layout((2, 2, self.warps)), byte_alignment=16)

        for k in cutlass.range(first, end, 2):
            parity = ((k - first) // 2) % 2
            rG = cute.make_rmem_tensor((VEC, 2), mG.element_type)
            rN = cute.make_rmem_tensor((VEC, 2), cutlass.Float32)
            rG.fill(0)  # a missing second row is zero: it adds nothing to the dot product or the column sums
            rN.fill(0)
            rstd0 = mR[k]
            rstd1 = mR[cutlass.min(k + 1, end - 1)]  # only used for a second row that exists
            for r in cutlass.range_constexpr(2):
                if live and k + r < end:
                    cute.copy(copy_g, cute.zipped_divide(mG[k + r, None], (VEC,))[None, tidx], rG[None, r])
                    gN = cute.zipped_divide(mN[k + r, None], (HALF,))
                    for h in cutlass.range_constexpr(2):
                        cute.copy(copy_n, gN[None, 2 * tidx + h], cute.zipped_divide(rN[None, r], (HALF,))[None, h])
            g0, g1 = rG[None, 0].load().to(cutlass.Float32), rG[None, 1].load().to(cutlass.Float32)
            n0, n1 = rN[None, 0].load(), rN[None, 1].load()
            acc.store(acc.load() + g0 * n0 + g1 * n1)
            gn0, gn1 = g0 * w, g1 * w
            dot0 = cute.arch.warp_reduction_sum((gn0 * n0).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), 0))
            dot1 = cute.arch.warp_reduction_sum((gn1 * n1).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), 0))
            if lane == 0:
                partials[parity, 0, warp] = dot0
                partials[parity, 1, warp] = dot1
            cute.arch.barrier()
            total0, total1 = cutlass.Float32(0.0), cutlass.Float32(0.0)
            for v in cutlass.range_constexpr(self.warps):
                total0 = total0 + partials[parity, 0, v]
                total1 = total1 + partials[parity, 1, v]
            rO = cute.make_rmem_tensor((VEC, 2), mDH.element_type)
            rO[None, 0].store((rstd0 * (gn0 - n0 * (total0 / self.hidden))).to(mDH.element_type))
            rO[None, 1].store((rstd1 * (gn1 - n1 * (total1 / self.hidden))).to(mDH.element_type))
            for r in cutlass.range_constexpr(2):
                if live and k + r < end:
                    cute.copy(copy_g, rO[None, r], cute.zipped_divide(mDH[k + r, None], (VEC,))[None, tidx])
                    cute.copy(copy_g, rO[None, r], cute.zipped_divide(mDR[k + r, None], (VEC,))[None, tidx])

        if live:
            gP = cute.zipped_divide(mP[bidx, None], (HALF,))
            for h in cutlass.range_constexpr(2):
                cute.copy(copy_n, cute.zipped_divide(acc, (HALF,))[None, h], gP[None, 2 * tidx + h])


class _ColumnSum:
    def __init__(self, hidden: int):
        self.hidden = hidden

    @cute.jit
    def __call__(self, pP: cute.Pointer, pDW: cute.Pointer, parts: cutlass.Int32, stream: cuda.CUstream):
        mP = cute.make_tensor(pP, cute.make_layout((parts, self.hidden), stride=(self.hidden, 1)))
        mDW = cute.make_tensor(pDW, cute.make_layout((self.hidden,)))
        self.kernel(mP, mDW).launch(grid=(-(-self.hidden // 32), 1, 1), block=(COLUMN_THREADS, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mP: cute.Tensor, mDW: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane, slice_ = tidx % 32, tidx // 32
        slices = COLUMN_THREADS // 32
        column = bidx * 32 + lane
        clamped = cutlass.min(column, self.hidden - 1)  # loads stay in bounds; only real columns are stored
        parts = mP.shape[0]
        total = cutlass.Float64(0.0)
        for base in cutlass.range(slice_, parts, slices * COLUMN_LOADS):
            # COLUMN_LOADS independent loads in flight (clamped rows, so no branch between them), then the adds.
            values = [mP[cutlass.min(base + u * slices, parts - 1), clamped] for u in range(COLUMN_LOADS)]
            for u in cutlass.range_constexpr(COLUMN_LOADS):
                total = total + cutlass.select_(base + u * slices < parts, values[u].to(cutlass.Float64),
                                                cutlass.Float64(0.0))
        sums = cutlass.memory.SmemAllocator().allocate_tensor(
            cutlass.Float64, cute.make_layout((slices, 32), stride=(32, 1)), byte_alignment=16)
        sums[slice_, lane] = total
        cute.arch.barrier()
        if slice_ == 0 and column < self.hidden:
            column_total = cutlass.Float64(0.0)
            for s in cutlass.range_constexpr(slices):
                column_total = column_total + sums[s, lane]
            mDW[column] = column_total.to(cutlass.Float32)


@functools.cache
def _compiled(hidden, arch):
    """Compile once per hidden size and arch; the row count and the rows per CTA stay dynamic."""
    g, n, s = fake_ptr(torch.bfloat16, 16), fake_ptr(torch.float32, 16), fake_ptr(torch.float32, 4)
    rows = compile_kernel(_RowBackward(hidden), g, n, s, n, g, g, n, cutlass.Int32(1), cutlass.Int32(2), arch=arch)
    columns = compile_kernel(_ColumnSum(hidden), s, s, cutlass.Int32(1), arch=arch)
    return rows, columns


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _rows_per_cta(rows: int, device: torch.device) -> int:
    """An even number of rows per CTA (whole two-row steps), at most MAX_ROWS_PER_CTA, so that small inputs still
    spread over every SM."""
    target = -(-rows // (CTAS_PER_SM * _sm_count(device)))
    return min(MAX_ROWS_PER_CTA, max(2, target + target % 2))


def solve(grad_output, normalized, rstd, weight):
    if grad_output.dtype != torch.bfloat16 or not (normalized.dtype == rstd.dtype == weight.dtype == torch.float32):
        raise TypeError("residual rmsnorm backward cute kernel takes bf16 grad_output and fp32 normalized, rstd, weight")
    hidden = grad_output.shape[-1]
    if (normalized.shape != grad_output.shape or rstd.shape != grad_output.shape[:-1] + (1,)
            or weight.shape != (hidden,) or hidden % VEC):
        raise ValueError(f"residual rmsnorm backward cute kernel takes grad_output and normalized [..., H], rstd "
                         f"[..., 1] and weight [H] with H a multiple of {VEC}")
    g, n, r, w = grad_output.contiguous(), normalized.contiguous(), rstd.contiguous(), weight.contiguous()
    grad_hidden, grad_residual = torch.empty_like(g), torch.empty_like(g)
    rows = g.numel() // hidden
    if rows == 0:
        return grad_hidden, grad_residual, torch.zeros(hidden, dtype=torch.float32, device=g.device)
    require_int32_indexing(n)
    grad_weight = torch.empty(hidden, dtype=torch.float32, device=g.device)
    rows_per_cta = _rows_per_cta(rows, g.device)
    partials = torch.empty((-(-rows // rows_per_cta), hidden), dtype=torch.float32, device=g.device)
    row_kernel, column_kernel = _compiled(hidden, gpu_arch(g.device))
    stream = stream_of(g)
    row_kernel(gmem_ptr(g, 16), gmem_ptr(n, 16), gmem_ptr(r, 4), gmem_ptr(w, 16), gmem_ptr(grad_hidden, 16),
               gmem_ptr(grad_residual, 16), gmem_ptr(partials, 16), rows, rows_per_cta, stream)
    column_kernel(gmem_ptr(partials, 4), gmem_ptr(grad_weight, 4), partials.shape[0], stream)
    return grad_hidden, grad_residual, grad_weight


def compile_for(arch: str, sizes: list[dict]) -> None:
    for hidden in {dims["hidden"] for dims in sizes}:  # the row count is dynamic
        _compiled(hidden, arch)
