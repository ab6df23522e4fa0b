"""Gated delta decode, k-last state, in TIRx: eight lanes per state row (one V index, K contiguous), 16-byte loads and
stores, the two K-dot products by 8-lane shuffles; one CTA covers 32 rows of one (batch, V head). On the host (llvm)
one parallel iteration per row does the same arithmetic."""
import functools

import torch
from tvm_tirx.script import tirx as T

from metakernelbench.suite.kits.common import gpu_arch
from metakernelbench.suite.kits.tirx import NO_FAST_MATH, build_cpu, build_cuda, nvcc_build

CPU_PATH = True
_THREADS = 128
_LANES = 8  # lanes per state row: K = 128 fp32 are 32 16-byte chunks, four per lane
_VEC = 4  # fp32 per 16-byte chunk
_ROWS = 2  # rows per lane group: both rows' loads are in flight before any math
_ROWS_PER_CTA = _THREADS // _LANES * _ROWS


def _gates(x_a, dt, a_log, x_b):
    """(g, beta) as torch computes them in fp32: softplus with threshold 20, then exp(-exp(A_log) * softplus)."""
    x = T.float32(x_a) + dt
    softplus = T.if_then_else(x > T.float32(20.0), x, T.log1p(T.exp(x)))
    return T.exp(-T.exp(a_log) * softplus), T.float32(1.0) / (T.float32(1.0) + T.exp(-T.float32(x_b)))


def _kernel(hk, hv, d):
    if d % (_LANES * _VEC) or d % _ROWS_PER_CTA or hv % hk:
        raise ValueError(f"gdn_decode tirx: head size {d} must be a multiple of {_ROWS_PER_CTA}, and V heads ({hv}) "
                         f"a multiple of QK heads ({hk})")
    batch = T.dynamic("batch")
    nc = d // (_LANES * _VEC)  # chunks per lane
    group = hv // hk

    @T.function
    def gdn_decode(q: T.Tensor((batch, 1, hk, d), "bfloat16", data_alignment=8),
                   k: T.Tensor((batch, 1, hk, d), "bfloat16", data_alignment=8),
                   v: T.Tensor((batch, 1, hv, d), "bfloat16"), state: T.Tensor((batch, hv, d, d), "float32",
                                                                              data_alignment=16),
                   A_log: T.Tensor((hv,), "float32"), a: T.Tensor((batch, 1, hv), "bfloat16"),
                   dt_bias: T.Tensor((hv,), "float32"), b: T.Tensor((batch, 1, hv), "bfloat16"), scale: T.float32,
                   output: T.Tensor((batch, 1, hv, d), "bfloat16"),
                   new_state: T.Tensor((batch, hv, d, d), "float32", data_alignment=16)):
        T.device_entry(launch=T.cuda.LaunchConfig(grid=(d // _ROWS_PER_CTA, hv, batch), block=_THREADS),
                       backend_config=NO_FAST_MATH)
        h = T.cuda.block_idx("y")
        bi = T.cuda.block_idx("z")
        tid = T.cuda.thread_idx("x")
        lane = tid % _LANES
        first = T.cuda.block_idx("x") * _ROWS_PER_CTA + (tid // _LANES) * _ROWS
        s = T.alloc_local((_ROWS * nc * _VEC,), "float32")
        qraw = T.alloc_local((nc * _VEC,), "bfloat16")
        kraw = T.alloc_local((nc * _VEC,), "bfloat16")
        qf = T.alloc_local((nc * _VEC,), "float32")
        kf = T.alloc_local((nc * _VEC,), "float32")
        acc = T.alloc_local((2,), "float32")
        # The state rows go out first (int64 offsets: the state outgrows int32 at large batches); then q and k.
        for r in T.unroll(_ROWS):
            for i in T.unroll(nc):
                s[(r * nc + i) * _VEC:(r * nc + i) * _VEC + _VEC] = state[
                    T.int64(bi), h, first + r, T.Ramp(T.int64((lane + _LANES * i) * _VEC), 1, _VEC)]
        for i in T.unroll(nc):
            qraw[i * _VEC:i * _VEC + _VEC] = q[bi, 0, h // group, T.Ramp((lane + _LANES * i) * _VEC, 1, _VEC)]
            kraw[i * _VEC:i * _VEC + _VEC] = k[bi, 0, h // group, T.Ramp((lane + _LANES * i) * _VEC, 1, _VEC)]
        for e in T.unroll(nc * _VEC):
            qf[e] = T.float32(qraw[e])
            kf[e] = T.float32(kraw[e])
        g, beta = _gates(a[bi, 0, h], dt_bias[h], A_log[h], b[bi, 0, h])
        for r in T.unroll(_ROWS):
            acc[0] = T.float32(0)
            for e in T.unroll(nc * _VEC):
                s[r * nc * _VEC + e] = g * s[r * nc * _VEC + e]
                acc[0] = acc[0] + kf[e] * s[r * nc * _VEC + e]
            old_v = T.cuda.warp_reduce(acc[0], "sum", _LANES)
            new_v = beta * T.float32(v[bi, 0, h, first + r]) + (T.float32(1.0) - beta) * old_v
            acc[1] = T.float32(0)
            for e in T.unroll(nc * _VEC):
                s[r * nc * _VEC + e] = s[r * nc * _VEC + e] - kf[e] * old_v + kf[e] * new_v
                acc[1] = acc[1] + qf[e] * s[r * nc * _VEC + e]
            o = T.cuda.warp_reduce(acc[1], "sum", _LANES)
            if lane == 0:
                output[bi, 0, h, first + r] = T.bfloat16(scale * o)
            for i in T.unroll(nc):
                new_state[T.int64(bi), h, first + r, T.Ramp(T.int64((lane + _LANES * i) * _VEC), 1, _VEC)] = s[
                    T.Ramp((r * nc + i) * _VEC, 1, _VEC)]

    return gdn_decode


def _cpu_kernel(hk, hv, d):
    batch = T.dynamic("batch")
    group = hv // hk

    @T.function
    def gdn_decode_cpu(q: T.Tensor((batch, 1, hk, d), "bfloat16"), k: T.Tensor((batch, 1, hk, d), "bfloat16"),
                       v: T.Tensor((batch, 1, hv, d), "bfloat16"), state: T.Tensor((batch, hv, d, d), "float32"),
                       A_log: T.Tensor((hv,), "float32"), a: T.Tensor((batch, 1, hv), "bfloat16"),
                       dt_bias: T.Tensor((hv,), "float32"), b: T.Tensor((batch, 1, hv), "bfloat16"),
                       scale: T.float32, output: T.Tensor((batch, 1, hv, d), "bfloat16"),
                       new_state: T.Tensor((batch, hv, d, d), "float32")):
        for row in T.parallel(batch * hv * d):
            bi = row // (hv * d)
            h = row // d % hv
            vi = row % d
            # st: g, beta, old_v, new_v, o
            st = T.alloc_local((5,), "float32")
            st[0], st[1] = _gates(a[bi, 0, h], dt_bias[h], A_log[h], b[bi, 0, h])
            st[2] = T.float32(0)
            for e in range(d):
                new_state[bi, h, vi, e] = st[0] * state[bi, h, vi, e]
                st[2] = st[2] + T.float32(k[bi, 0, h // group, e]) * new_state[bi, h, vi, e]
            st[3] = st[1] * T.float32(v[bi, 0, h, vi]) + (T.float32(1.0) - st[1]) * st[2]
            st[4] = T.float32(0)
            for e in range(d):
                new_state[bi, h, vi, e] = (new_state[bi, h, vi, e] - T.float32(k[bi, 0, h // group, e]) * st[2]
                                           + T.float32(k[bi, 0, h // group, e]) * st[3])
                st[4] = st[4] + T.float32(q[bi, 0, h // group, e]) * new_state[bi, h, vi, e]
            output[bi, 0, h, vi] = T.bfloat16(scale * st[4])

    return gdn_decode_cpu


@functools.cache
def _compiled(hk, hv, d, arch):
    return build_cuda(_kernel(hk, hv, d), arch) if arch else build_cpu(_cpu_kernel(hk, hv, d))


def solve(q, k, v, state, A_log, a, dt_bias, b, scale):
    batch, _, hk, d = q.shape
    hv = v.shape[2]
    if q.dtype != torch.bfloat16 or state.dtype != torch.float32 or v.shape[3] != d:
        raise ValueError("gdn_decode tirx: bf16 q/k/v with K = V and an fp32 state")
    q, k, v, state = q.contiguous(), k.contiguous(), v.contiguous(), state.contiguous()
    output = torch.empty_like(v)
    new_state = torch.empty_like(state)
    if batch:
        _compiled(hk, hv, d, gpu_arch(q.device) if q.is_cuda else None)(
            q, k, v, state, A_log.contiguous(), a.contiguous(), dt_bias.contiguous(), b.contiguous(), float(scale),
            output, new_state)
    return output, new_state


def compile_for(arch: str, sizes: list[dict]) -> None:
    for s in sizes:
        nvcc_build(_compiled(s["qk_heads"], s["v_heads"], s["head"], arch), f"head={s['head']}")
