"""Fused add+RMSNorm in TIRx: one CTA per row holds the bf16-rounded sum in registers between the two passes."""
import functools

import torch
import tvm_tirx
from tvm_tirx.backend.config import parse_backend_config
from tvm_tirx.backend.cuda.compiler import compile_source
from tvm_tirx.script import tirx as T

EPS = 1e-5
# Plain IEEE fp32 (no flush-to-zero): the default build would pass --use_fast_math.
_NO_FAST_MATH = {"cuda": {"nvcc": [], "nvrtc": []}}


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
    eps = float(torch.tensor(EPS, dtype=torch.float32))  # the fp32 value the reference adds
    m = T.dynamic("m")

    @T.function
    def fused_add_rmsnorm(
        X: T.Tensor((m, hidden), T.bfloat16, align=16),
        R: T.Tensor((m, hidden), T.bfloat16, align=16),
        W: T.Tensor((hidden,), T.bfloat16, align=16),
        O: T.Tensor((m, hidden), T.bfloat16, align=16),
        RO: T.Tensor((m, hidden), T.bfloat16, align=16),
    ):
        T.device_entry(launch=T.cuda.LaunchConfig(grid=m, block=threads), backend_config=_NO_FAST_MATH)
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
                    # Round the sum to bf16 first: the norm is taken over the stored residual.
                    ov[j] = T.bfloat16(T.float32(xv[it * vec + j]) + T.float32(rv[it * vec + j]))
                    h[it * vec + j] = T.float32(ov[j])
                    ss = ss + h[it * vec + j] * h[it * vec + j]
                RO[row, T.Ramp(c, 1, vec)] = ov[T.Ramp(0, 1, vec)]
        total = T.cuda.cta_sum(ss, warps, scratch.data)
        rstd = T.rsqrt(total * T.float32(inv_hidden) + T.float32(eps))
        for it in T.unroll(iters):
            c = (it * threads + tx) * vec
            if c < hidden:
                for j in T.unroll(vec):
                    ov[j] = T.bfloat16(h[it * vec + j] * rstd * T.float32(wv[it * vec + j]))
                O[row, T.Ramp(c, 1, vec)] = ov[T.Ramp(0, 1, vec)]

    return fused_add_rmsnorm


@functools.cache
def _compiled(hidden, arch):
    return tvm_tirx.tirx.compile(_kernel(hidden), target=tvm_tirx.target.Target({"kind": "cuda", "arch": arch}))


def _arch(device):
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


@functools.cache
def _cpu_compiled(hidden):
    """Host (llvm) kernel: one parallel iteration per row. Local bf16 is not rounded on llvm (BF16ComputeLegalize),
    so the norm reads the rounded sum back from the stored residual_out."""
    inv_hidden = 1.0 / hidden
    eps = float(torch.tensor(EPS, dtype=torch.float32))
    m = T.dynamic("m")

    @T.function
    def fused_add_rmsnorm_cpu(
        X: T.Tensor((m, hidden), T.bfloat16),
        R: T.Tensor((m, hidden), T.bfloat16),
        W: T.Tensor((hidden,), T.bfloat16),
        O: T.Tensor((m, hidden), T.bfloat16),
        RO: T.Tensor((m, hidden), T.bfloat16),
    ):
        for row in T.parallel(m):
            st = T.alloc_local((2,), T.float32)
            st[0] = T.float32(0)
            for j in range(hidden):
                RO[row, j] = T.bfloat16(T.float32(X[row, j]) + T.float32(R[row, j]))
            for j in range(hidden):
                st[0] = st[0] + T.float32(RO[row, j]) * T.float32(RO[row, j])
            st[1] = T.rsqrt(st[0] * T.float32(inv_hidden) + T.float32(eps))
            for j in range(hidden):
                O[row, j] = T.bfloat16(T.float32(RO[row, j]) * st[1] * T.float32(W[j]))

    return tvm_tirx.tirx.compile(fused_add_rmsnorm_cpu, target="llvm")


def _solve_cpu(x, residual, weight):
    if x.dtype != torch.bfloat16 or residual.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16:
        raise TypeError("fused_add_rmsnorm tirx kernel takes bf16 x, residual and weight")
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden).contiguous()
    r2 = residual.reshape(-1, hidden).contiguous()
    out = torch.empty_like(x2)
    residual_out = torch.empty_like(x2)
    if x2.shape[0] > 0:
        _cpu_compiled(hidden)(x2, r2, weight.contiguous(), out, residual_out)
    return out.view(x.shape), residual_out.view(x.shape)


def solve(x, residual, weight):
    if not x.is_cuda:
        return _solve_cpu(x, residual, weight)
    if x.dtype != torch.bfloat16 or residual.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16:
        raise TypeError("fused_add_rmsnorm tirx kernel takes bf16 x, residual and weight")
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden).contiguous()
    r2 = residual.reshape(-1, hidden).contiguous()
    w = weight.contiguous()
    if x2.numel() >= 2**31:
        raise ValueError("tensor too large for the kernel's 32-bit indexing")
    out = torch.empty_like(x2)
    residual_out = torch.empty_like(x2)
    if x2.shape[0] > 0:
        _compiled(hidden, _arch(x.device))(x2, r2, w, out, residual_out)
    return out.view(x.shape), residual_out.view(x.shape)


def _nvcc_build(ex, what):
    """Build the device code of `ex` now with nvcc (solve's NVRTC build happens lazily at the first launch)."""
    for mod in ex.mod.imports:
        config = parse_backend_config(mod.inspect_source("backend_config"))
        config["cuda"]["compiler"] = "nvcc"
        if not compile_source(mod.inspect_source("cuda"), config).binary:
            raise RuntimeError(f"nvcc produced no device binary for {what}")


def compile_for(arch: str) -> None:
    """Compile the kernel solve launches at the full and odd sizes (both hidden 4096) to a device binary for `arch`."""
    _nvcc_build(_compiled(4096, arch), "hidden=4096")
