"""RMSNorm of 128-wide rows in TIRx: 16 lanes per row (one 16-byte vector each), the row's sum of squares by a
16-lane butterfly, four rows per thread with every load issued before the first use."""
import functools

import torch
from tvm_tirx.script import tirx as T

from metakernelbench.suite.kits.common import gpu_arch, require_int32_indexing
from metakernelbench.suite.kits.tirx import NO_FAST_MATH, build_cpu, build_cuda, fp32, nvcc_build

EPS = 1e-6
CPU_PATH = True  # a host (llvm) build too: CI grades it on the CPU
_THREADS = 256
_ROWS_PER_THREAD = 4  # four independent 16-byte loads in flight per thread


def _plan(hidden):
    """Elements per 16-byte vector, lanes per row (a power of two up to a warp) and vectors per lane."""
    if hidden % 8:
        raise ValueError(f"hidden={hidden}: the kernel moves rows in 16-byte vectors of eight bf16")
    nvec = hidden // 8
    lanes = next(n for n in (32, 16, 8, 4, 2, 1) if nvec % n == 0)
    return 8, lanes, nvec // lanes


def _kernel(hidden):
    vec, lanes, per_lane = _plan(hidden)
    rows_per_pass = _THREADS // lanes
    rows_per_cta = rows_per_pass * _ROWS_PER_THREAD
    width = per_lane * vec  # elements of one row a thread holds
    inv_hidden = 1.0 / hidden  # torch's mean multiplies the fp32 sum by 1/N
    eps = fp32(EPS)
    m = T.dynamic("m")

    @T.function
    def rmsnorm(
        X: T.Tensor((m, hidden), T.bfloat16, align=16),
        W: T.Tensor((hidden,), T.bfloat16, align=16),
        O: T.Tensor((m, hidden), T.bfloat16, align=16),
    ):
        T.device_entry(launch=T.cuda.LaunchConfig(grid=T.ceildiv(m, rows_per_cta), block=_THREADS),
                       backend_config=NO_FAST_MATH)
        tx = T.cuda.thread_idx("x")
        lane = tx % lanes
        first = T.cuda.block_idx("x") * rows_per_cta + tx // lanes  # pass i covers rows first + i * rows_per_pass
        xv = T.alloc_local((_ROWS_PER_THREAD * width,), T.bfloat16)
        wv = T.alloc_local((width,), T.bfloat16)
        ov = T.alloc_local((vec,), T.bfloat16)
        total = T.alloc_local((_ROWS_PER_THREAD,), T.float32)
        for k in T.unroll(per_lane):
            wv[k * vec : k * vec + vec] = W[T.Ramp((lane + k * lanes) * vec, 1, vec)]
        # Lane l takes vectors l, l + lanes, ...: each load instruction of a row's lanes covers one contiguous run.
        # Rows past the end load the last row (their lanes still join the full-warp shuffles) and store nothing.
        for i in T.unroll(_ROWS_PER_THREAD):
            row = T.min(first + i * rows_per_pass, m - 1)
            for k in T.unroll(per_lane):
                xv[i * width + k * vec : i * width + k * vec + vec] = X[row, T.Ramp((lane + k * lanes) * vec, 1, vec)]
        for i in T.unroll(_ROWS_PER_THREAD):
            total[i] = T.float32(0)
            for j in T.unroll(width):
                total[i] = total[i] + T.float32(xv[i * width + j]) * T.float32(xv[i * width + j])
            total[i] = T.cuda.warp_sum(total[i], lanes)
        for i in T.unroll(_ROWS_PER_THREAD):
            row = first + i * rows_per_pass
            rstd = T.rsqrt(total[i] * T.float32(inv_hidden) + T.float32(eps))
            if row < m:
                for k in T.unroll(per_lane):
                    for j in T.unroll(vec):
                        ov[j] = T.bfloat16(T.float32(xv[i * width + k * vec + j]) * rstd
                                           * T.float32(wv[k * vec + j]))
                    O[row, T.Ramp((lane + k * lanes) * vec, 1, vec)] = ov[T.Ramp(0, 1, vec)]

    return rmsnorm


def _cpu_kernel(hidden):
    """Host (llvm) kernel: one parallel iteration per row. Its products round once, to bf16, as the GPU's do."""
    inv_hidden = 1.0 / hidden
    eps = fp32(EPS)
    m = T.dynamic("m")

    @T.function
    def rmsnorm_cpu(
        X: T.Tensor((m, hidden), T.bfloat16),
        W: T.Tensor((hidden,), T.bfloat16),
        O: T.Tensor((m, hidden), T.bfloat16),
    ):
        for row in T.parallel(m):
            st = T.alloc_local((2,), T.float32)
            st[0] = T.float32(0)
            for j in range(hidden):
                st[0] = st[0] + T.float32(X[row, j]) * T.float32(X[row, j])
            st[1] = T.rsqrt(st[0] * T.float32(inv_hidden) + T.float32(eps))
            for j in range(hidden):
                O[row, j] = T.bfloat16(T.float32(X[row, j]) * st[1] * T.float32(W[j]))

    return rmsnorm_cpu


@functools.cache
def _compiled(hidden, arch):
    return build_cuda(_kernel(hidden), arch) if arch else build_cpu(_cpu_kernel(hidden))


def solve(hidden_states, weight):
    if not (hidden_states.dtype == weight.dtype == torch.bfloat16):
        raise TypeError("rmsnorm tirx kernel takes bf16 hidden_states and weight")
    if hidden_states.dim() != 2 or weight.shape != hidden_states.shape[-1:]:
        raise ValueError("rmsnorm tirx kernel takes hidden_states [rows, hidden] and weight [hidden]")
    x = hidden_states.contiguous()
    require_int32_indexing(x)
    out = torch.empty_like(x)
    if x.shape[0] > 0:
        _compiled(x.shape[1], gpu_arch(x.device) if x.is_cuda else None)(x, weight.contiguous(), out)
    return out


def compile_for(arch: str, sizes: list[dict]) -> None:
    for hidden in {dims["hidden"] for dims in sizes}:  # the row count is dynamic
        nvcc_build(_compiled(hidden, arch), f"hidden={hidden}")
