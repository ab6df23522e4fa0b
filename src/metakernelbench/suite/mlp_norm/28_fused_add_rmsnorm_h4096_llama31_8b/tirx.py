"""Fused add+RMSNorm in TIRx: one CTA per row holds the fp32 sum in registers between the two passes."""
import functools

import torch
from tvm_tirx.script import tirx as T

from metakernelbench.suite.kits.common import gpu_arch, require_int32_indexing
from metakernelbench.suite.kits.tirx import NO_FAST_MATH, build_cpu, build_cuda, fp32, nvcc_build

EPS = 1e-5
CPU_PATH = True  # a host (llvm) build too: `mkb demo` and CI grade it on the CPU


def _plan(hidden):
    """Vector width (elements per 16-byte access), threads per CTA and vectors per thread for one row."""
    if hidden % 2:
        raise ValueError(f"hidden={hidden}: the kernel moves rows in vectors of at least two bf16")
    vec = next(v for v in (8, 4, 2) if hidden % v == 0)
    nvec = hidden // vec
    # About two vectors per thread: enough loads in flight per SM without starving occupancy.
    threads = 32
    while threads < 1024 and threads * 2 < nvec:
        threads *= 2
    return vec, threads, -(-nvec // threads)


def _kernel(hidden):
    vec, threads, iters = _plan(hidden)
    warps = threads // 32
    inv_hidden = 1.0 / hidden  # torch's mean also multiplies the fp32 sum by 1/N
    eps = fp32(EPS)
    m = T.dynamic("m")

    @T.function
    def fused_add_rmsnorm(
        X: T.Tensor((m, hidden), T.bfloat16, align=16),
        R: T.Tensor((m, hidden), T.bfloat16, align=16),
        W: T.Tensor((hidden,), T.bfloat16, align=16),
        O: T.Tensor((m, hidden), T.bfloat16, align=16),
    ):
        T.device_entry(launch=T.cuda.LaunchConfig(grid=m, block=threads), backend_config=NO_FAST_MATH)
        row = T.cuda.block_idx("x")
        tx = T.cuda.thread_idx("x")
        xv = T.alloc_local((iters * vec,), T.bfloat16)
        rv = T.alloc_local((iters * vec,), T.bfloat16)
        wv = T.alloc_local((iters * vec,), T.bfloat16)
        ov = T.alloc_local((vec,), T.bfloat16)
        h = T.alloc_local((iters * vec,), T.float32)
        scratch = T.alloc_shared((warps,), T.float32)
        # Issue every load of the row (and the weight, an L2 hit) before any arithmetic.
        for it in T.unroll(iters):
            c = (it * threads + tx) * vec
            if c < hidden:
                xv[it * vec : it * vec + vec] = X[row, T.Ramp(c, 1, vec)]
                rv[it * vec : it * vec + vec] = R[row, T.Ramp(c, 1, vec)]
                wv[it * vec : it * vec + vec] = W[T.Ramp(c, 1, vec)]
        ss: T.float32 = 0.0
        for it in T.unroll(iters):
            c = (it * threads + tx) * vec
            if c < hidden:
                for j in T.unroll(vec):
                    # The sum stays in fp32: the norm is taken over it unrounded.
                    h[it * vec + j] = T.float32(xv[it * vec + j]) + T.float32(rv[it * vec + j])
                    ss = ss + h[it * vec + j] * h[it * vec + j]
        total = T.cuda.cta_sum(ss, warps, scratch.data)
        rstd = T.rsqrt(total * T.float32(inv_hidden) + T.float32(eps))
        for it in T.unroll(iters):
            c = (it * threads + tx) * vec
            if c < hidden:
                for j in T.unroll(vec):
                    ov[j] = T.bfloat16(h[it * vec + j] * rstd * T.float32(wv[it * vec + j]))
                O[row, T.Ramp(c, 1, vec)] = ov[T.Ramp(0, 1, vec)]

    return fused_add_rmsnorm


def _cpu_kernel(hidden):
    """Host (llvm) kernel: one parallel iteration per row, the fp32 sum recomputed in the second pass."""
    inv_hidden = 1.0 / hidden
    eps = fp32(EPS)
    m = T.dynamic("m")

    @T.function
    def fused_add_rmsnorm_cpu(
        X: T.Tensor((m, hidden), T.bfloat16),
        R: T.Tensor((m, hidden), T.bfloat16),
        W: T.Tensor((hidden,), T.bfloat16),
        O: T.Tensor((m, hidden), T.bfloat16),
    ):
        for row in T.parallel(m):
            st = T.alloc_local((2,), T.float32)
            st[0] = T.float32(0)
            for j in range(hidden):
                st[0] = st[0] + (T.float32(X[row, j]) + T.float32(R[row, j])) * (
                    T.float32(X[row, j]) + T.float32(R[row, j]))
            st[1] = T.rsqrt(st[0] * T.float32(inv_hidden) + T.float32(eps))
            for j in range(hidden):
                O[row, j] = T.bfloat16((T.float32(X[row, j]) + T.float32(R[row, j])) * st[1] * T.float32(W[j]))

    return fused_add_rmsnorm_cpu


@functools.cache
def _compiled(hidden, arch):
    return build_cuda(_kernel(hidden), arch) if arch else build_cpu(_cpu_kernel(hidden))


def solve(hidden_states, residual, weight):
    if not (hidden_states.dtype == residual.dtype == weight.dtype == torch.bfloat16):
        raise TypeError("fused_add_rmsnorm tirx kernel takes bf16 hidden_states, residual and weight")
    hidden = hidden_states.shape[-1]
    x = hidden_states.reshape(-1, hidden).contiguous()
    r = residual.reshape(-1, hidden).contiguous()
    require_int32_indexing(x)
    out = torch.empty_like(x)
    if x.shape[0] > 0:
        arch = gpu_arch(x.device) if x.is_cuda else None
        _compiled(hidden, arch)(x, r, weight.contiguous(), out)
    return out.view(hidden_states.shape)


def compile_for(arch: str, sizes: list[dict]) -> None:
    for hidden in {dims["hidden"] for dims in sizes}:  # the token count is dynamic
        nvcc_build(_compiled(hidden, arch), f"hidden={hidden}")
