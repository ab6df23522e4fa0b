"""Residual RMSNorm backward in TIRx, two kernels. The row kernel gives each CTA a block of rows and each thread a
fixed run of 8 columns (one 16-byte load of gradients, two of normalized values per row), two rows per step: per
row a CTA-wide dot product, then grad_x written twice, while the thread's fp32 column sums of g * normalized
accumulate over the block into one partial row per CTA. The column kernel adds the partial rows in fp64."""
import functools

import torch
from tvm_tirx.script import tirx as T

from metakernelbench.suite.kits.common import gpu_arch, require_int32_indexing
from metakernelbench.suite.kits.tirx import NO_FAST_MATH, build_cpu, build_cuda, nvcc_build

CPU_PATH = True  # a host (llvm) build too: CI grades it on the CPU
_VEC = 8  # columns per thread
_MAX_ROWS_PER_CTA = 128  # rows per partial sum: short fp32 chains; 4 096 CTAs (many waves) at full size
_CTAS_PER_SM = 4  # the grid aims at this many CTAs per SM before the row blocks shrink below the maximum
_COLUMN_THREADS = 1024  # column kernel: 32 columns x 32 slices of the partial rows
_COLUMN_LOADS = 8  # partial rows each column-kernel thread loads at once


def _row_kernel(hidden):
    chunks = hidden // _VEC
    threads = -(-chunks // 32) * 32
    warps = threads // 32
    m = T.dynamic("m")
    parts = T.dynamic("parts")

    @T.function
    def rmsnorm_backward_rows(
        G: T.Tensor((m, hidden), T.bfloat16, align=16),
        N: T.Tensor((m, hidden), T.float32, align=16),
        R: T.Tensor((m,), T.float32, align=4),
        W: T.Tensor((hidden,), T.float32, align=16),
        DH: T.Tensor((m, hidden), T.bfloat16, align=16),
        DR: T.Tensor((m, hidden), T.bfloat16, align=16),
        P: T.Tensor((parts, hidden), T.float32, align=16),
        rows_per_cta: T.int32,
    ):
        T.device_entry(launch=T.cuda.LaunchConfig(grid=parts, block=threads), backend_config=NO_FAST_MATH)
        tx = T.cuda.thread_idx("x")
        warp = tx // 32
        lane = tx % 32
        live = tx < chunks
        c = T.min(tx, chunks - 1) * _VEC  # this thread's first column (threads past the row clamp, store nothing)
        first = T.cuda.block_idx("x") * rows_per_cta
        end = T.min(first + rows_per_cta, m)
        wv = T.alloc_local((_VEC,), T.float32)
        acc = T.alloc_local((_VEC,), T.float32)
        gv = T.alloc_local((2 * _VEC,), T.bfloat16)
        nv = T.alloc_local((2 * _VEC,), T.float32)
        gn = T.alloc_local((2 * _VEC,), T.float32)
        ov = T.alloc_local((_VEC,), T.bfloat16)
        rs = T.alloc_local((2,), T.float32)
        dots = T.alloc_local((2,), T.float32)
        totals = T.alloc_local((2,), T.float32)
        # Per-warp partial dot products of the step's two rows, double-buffered by step parity: a warp that races
        # ahead writes the other buffer while slower warps still read this one.
        partials = T.alloc_shared((2 * 2 * warps,), T.float32)
        wv[0:4] = W[T.Ramp(c, 1, 4)]
        wv[4:8] = W[T.Ramp(c + 4, 1, 4)]
        for j in T.unroll(_VEC):
            acc[j] = T.float32(0)
        for step in range((end - first + 1) // 2):
            k = first + 2 * step
            second = T.min(k + 1, end - 1)  # a missing second row reloads the first: it is neither summed nor stored
            parity = step % 2
            gv[0:8] = G[k, T.Ramp(c, 1, 8)]
            nv[0:4] = N[k, T.Ramp(c, 1, 4)]
            nv[4:8] = N[k, T.Ramp(c + 4, 1, 4)]
            gv[8:16] = G[second, T.Ramp(c, 1, 8)]
            nv[8:12] = N[second, T.Ramp(c, 1, 4)]
            nv[12:16] = N[second, T.Ramp(c + 4, 1, 4)]
            rs[0] = R[k]
            rs[1] = R[second]
            for r in T.unroll(2):
                dots[r] = T.float32(0)
                for j in T.unroll(_VEC):
                    gn[r * _VEC + j] = T.float32(gv[r * _VEC + j]) * wv[j]
                    dots[r] = dots[r] + gn[r * _VEC + j] * nv[r * _VEC + j]
                dots[r] = T.cuda.warp_sum(T.if_then_else(live, dots[r], T.float32(0)), 32)
            for j in T.unroll(_VEC):
                acc[j] = acc[j] + T.float32(gv[j]) * nv[j]
            if k + 1 < end:
                for j in T.unroll(_VEC):
                    acc[j] = acc[j] + T.float32(gv[_VEC + j]) * nv[_VEC + j]
            if lane == 0:
                partials[(parity * 2) * warps + warp] = dots[0]
                partials[(parity * 2 + 1) * warps + warp] = dots[1]
            T.cuda.cta_sync()
            for r in T.unroll(2):
                totals[r] = T.float32(0)
                for v in T.unroll(warps):
                    totals[r] = totals[r] + partials[(parity * 2 + r) * warps + v]
            if live:
                for r in T.unroll(2):
                    if r == 0 or k + 1 < end:
                        for j in T.unroll(_VEC):
                            ov[j] = T.bfloat16(rs[r] * (gn[r * _VEC + j]
                                                        - nv[r * _VEC + j] * (totals[r] / T.float32(hidden))))
                        DH[k + r, T.Ramp(c, 1, 8)] = ov[T.Ramp(0, 1, 8)]
                        DR[k + r, T.Ramp(c, 1, 8)] = ov[T.Ramp(0, 1, 8)]
        if live:
            P[T.cuda.block_idx("x"), T.Ramp(c, 1, 4)] = acc[T.Ramp(0, 1, 4)]
            P[T.cuda.block_idx("x"), T.Ramp(c + 4, 1, 4)] = acc[T.Ramp(4, 1, 4)]

    return rmsnorm_backward_rows


def _column_kernel(hidden):
    slices = _COLUMN_THREADS // 32
    per_step = slices * _COLUMN_LOADS
    parts = T.dynamic("parts")

    @T.function
    def rmsnorm_backward_columns(
        P: T.Tensor((parts, hidden), T.float32, align=4),
        DW: T.Tensor((hidden,), T.float32, align=4),
    ):
        T.device_entry(launch=T.cuda.LaunchConfig(grid=T.ceildiv(hidden, 32), block=_COLUMN_THREADS),
                       backend_config=NO_FAST_MATH)
        tx = T.cuda.thread_idx("x")
        lane = tx % 32
        part = tx // 32  # this thread's slice: partial rows part, part + 32, ...
        column = T.cuda.block_idx("x") * 32 + lane
        clamped = T.min(column, hidden - 1)  # loads stay in bounds; only real columns are stored
        values = T.alloc_local((_COLUMN_LOADS,), T.float32)
        total = T.alloc_local((1,), T.float64)
        column_total = T.alloc_local((1,), T.float64)
        sums = T.alloc_shared((slices * 32,), T.float64)
        total[0] = T.float64(0)
        for step in range(T.ceildiv(parts, per_step)):
            # _COLUMN_LOADS independent loads in flight (clamped rows, so no branch between them), then the adds.
            for u in T.unroll(_COLUMN_LOADS):
                values[u] = P[T.min(step * per_step + u * slices + part, parts - 1), clamped]
            for u in T.unroll(_COLUMN_LOADS):
                total[0] = total[0] + T.if_then_else(step * per_step + u * slices + part < parts,
                                                     T.float64(values[u]), T.float64(0))
        sums[part * 32 + lane] = total[0]
        T.cuda.cta_sync()
        if part == 0 and column < hidden:
            column_total[0] = T.float64(0)
            for s in T.unroll(slices):
                column_total[0] = column_total[0] + sums[s * 32 + lane]
            DW[column] = T.float32(column_total[0])

    return rmsnorm_backward_columns


def _cpu_kernel(hidden):
    """Host (llvm) kernel: one parallel iteration per row for grad_x, then one per column for grad_weight (fp64)."""
    m = T.dynamic("m")

    @T.function
    def rmsnorm_backward_cpu(
        G: T.Tensor((m, hidden), T.bfloat16),
        N: T.Tensor((m, hidden), T.float32),
        R: T.Tensor((m,), T.float32),
        W: T.Tensor((hidden,), T.float32),
        DH: T.Tensor((m, hidden), T.bfloat16),
        DR: T.Tensor((m, hidden), T.bfloat16),
        DW: T.Tensor((hidden,), T.float32),
    ):
        for row in T.parallel(m):
            st = T.alloc_local((2,), T.float32)
            st[0] = T.float32(0)
            for j in range(hidden):
                st[0] = st[0] + T.float32(G[row, j]) * W[j] * N[row, j]
            st[1] = st[0] / T.float32(hidden)
            for j in range(hidden):
                DH[row, j] = T.bfloat16(R[row] * (T.float32(G[row, j]) * W[j] - N[row, j] * st[1]))
                DR[row, j] = T.bfloat16(R[row] * (T.float32(G[row, j]) * W[j] - N[row, j] * st[1]))
        for j in T.parallel(hidden):
            acc = T.alloc_local((1,), T.float64)
            acc[0] = T.float64(0)
            for row in range(m):
                acc[0] = acc[0] + T.float64(T.float32(G[row, j]) * N[row, j])
            DW[j] = T.float32(acc[0])

    return rmsnorm_backward_cpu


@functools.cache
def _compiled(hidden, arch):
    if arch:
        return build_cuda(_row_kernel(hidden), arch), build_cuda(_column_kernel(hidden), arch)
    return build_cpu(_cpu_kernel(hidden))


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _rows_per_cta(rows: int, device: torch.device) -> int:
    """An even number of rows per CTA (whole two-row steps), at most _MAX_ROWS_PER_CTA, so that small inputs still
    spread over every SM."""
    target = -(-rows // (_CTAS_PER_SM * _sm_count(device)))
    return min(_MAX_ROWS_PER_CTA, max(2, target + target % 2))


def solve(grad_output, normalized, rstd, weight):
    if grad_output.dtype != torch.bfloat16 or not (normalized.dtype == rstd.dtype == weight.dtype == torch.float32):
        raise TypeError("residual rmsnorm backward tirx kernel takes bf16 grad_output and fp32 normalized, rstd, "
                        "weight")
    hidden = grad_output.shape[-1]
    if (normalized.shape != grad_output.shape or rstd.shape != grad_output.shape[:-1] + (1,)
            or weight.shape != (hidden,) or hidden % _VEC):
        raise ValueError(f"residual rmsnorm backward tirx kernel takes grad_output and normalized [..., H], rstd "
                         f"[..., 1] and weight [H] with H a multiple of {_VEC}")
    g = grad_output.contiguous().view(-1, hidden)
    n = normalized.contiguous().view(-1, hidden)
    r = rstd.contiguous().view(-1)
    w = weight.contiguous()
    require_int32_indexing(n)
    grad_hidden, grad_residual = torch.empty_like(g), torch.empty_like(g)
    rows = g.shape[0]
    if rows == 0:
        grad_weight = torch.zeros(hidden, dtype=torch.float32, device=g.device)
    elif not g.is_cuda:
        grad_weight = torch.empty(hidden, dtype=torch.float32, device=g.device)
        _compiled(hidden, None)(g, n, r, w, grad_hidden, grad_residual, grad_weight)
    else:
        grad_weight = torch.empty(hidden, dtype=torch.float32, device=g.device)
        rows_per_cta = _rows_per_cta(rows, g.device)
        partials = torch.empty((-(-rows // rows_per_cta), hidden), dtype=torch.float32, device=g.device)
        row_kernel, column_kernel = _compiled(hidden, gpu_arch(g.device))
        row_kernel(g, n, r, w, grad_hidden, grad_residual, partials, rows_per_cta)
        column_kernel(partials, grad_weight)
    shape = grad_output.shape
    return grad_hidden.view(shape), grad_residual.view(shape), grad_weight


def compile_for(arch: str, sizes: list[dict]) -> None:
    for hidden in {dims["hidden"] for dims in sizes}:  # the row count is dynamic
        for kernel in _compiled(hidden, arch):
            nvcc_build(kernel, f"hidden={hidden}")
