"""Gated delta decode, k-last state, in CuTe DSL: eight lanes per state row (one V index, K contiguous), 16-byte
loads and stores, the two K-dot products by 3-step shuffles; one CTA covers 32 rows of one (batch, V head)."""
import functools

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from metakernelbench.suite.kits.common import gpu_arch
from metakernelbench.suite.kits.cute import compile_kernel, fake_ptr, gmem_ptr, lanes_sum, stream_of

THREADS = 128
LANES = 8  # lanes per state row: K = 128 fp32 are 32 16-byte chunks, four per lane
VEC = 4  # fp32 per 16-byte chunk
ROWS = 2  # rows per lane group: both rows' loads are in flight before any math
ROWS_PER_CTA = THREADS // LANES * ROWS


@cute.kernel
def _step_kernel(
    mQ: cute.Tensor,  # (VEC, K/VEC, Hk, B) bf16
    mK: cute.Tensor,
    mV: cute.Tensor,  # (V, Hv, B) bf16
    mALog: cute.Tensor,  # (Hv,) fp32
    mA: cute.Tensor,  # (Hv, B) bf16
    mDtBias: cute.Tensor,  # (Hv,) fp32
    mB: cute.Tensor,  # (Hv, B) bf16
    mS: cute.Tensor,  # (VEC, K/VEC, V, Hv, B) fp32: state[b, h, v, k]
    mO: cute.Tensor,  # (V, Hv, B) bf16
    mN: cute.Tensor,  # like mS: the new state
    scale: cutlass.Float32,
):
    NC = mS.shape[1] // LANES  # chunks per lane
    tid, _, _ = cute.arch.thread_idx()
    rb, h, b = cute.arch.block_idx()
    hk = h // (mS.shape[3] // mQ.shape[2])
    lane = tid % LANES
    first = rb * ROWS_PER_CTA + (tid // LANES) * ROWS
    bl = cutlass.Int64(b)

    # The state rows go out first; the gates and q/k loads overlap with them.
    rS = cute.make_rmem_tensor((VEC, NC, ROWS), cutlass.Float32)
    for r in cutlass.range_constexpr(ROWS):
        for i in cutlass.range_constexpr(NC):
            cute.autovec_copy(mS[None, lane + LANES * i, first + r, h, bl], rS[None, i, r])
    rQ = cute.make_rmem_tensor((VEC, NC), mQ.element_type)
    rK = cute.make_rmem_tensor((VEC, NC), mK.element_type)
    for i in cutlass.range_constexpr(NC):
        cute.autovec_copy(mQ[None, lane + LANES * i, hk, b], rQ[None, i])
        cute.autovec_copy(mK[None, lane + LANES * i, hk, b], rK[None, i])
    q = rQ.load().to(cutlass.Float32)
    k = rK.load().to(cutlass.Float32)

    # g = exp(-exp(A_log) * softplus(a + dt_bias)) and beta = sigmoid(b), as torch computes them in fp32.
    x = mA[h, b].to(cutlass.Float32) + mDtBias[h]
    softplus = x
    if x <= cutlass.Float32(20.0):
        softplus = cute.math.log1p(cute.math.exp(x))
    g = cute.math.exp(-cute.math.exp(mALog[h]) * softplus)
    beta = cutlass.Float32(1.0) / (cutlass.Float32(1.0) + cute.math.exp(-mB[h, b].to(cutlass.Float32)))

    for r in cutlass.range_constexpr(ROWS):
        row = first + r
        gs = rS[None, None, r].load() * g
        old_v = lanes_sum((k * gs).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), [0, 1]), LANES)
        new_v = beta * mV[row, h, b].to(cutlass.Float32) + (cutlass.Float32(1.0) - beta) * old_v
        s1 = gs - k * old_v + k * new_v
        rS[None, None, r].store(s1)
        o = lanes_sum((q * s1).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), [0, 1]), LANES)
        if lane == 0:
            mO[row, h, b] = (o * scale).to(mO.element_type)
        for i in cutlass.range_constexpr(NC):
            cute.autovec_copy(rS[None, i, r], mN[None, lane + LANES * i, row, h, bl])


@cute.jit
def _step(pQ: cute.Pointer, pK: cute.Pointer, pV: cute.Pointer, pALog: cute.Pointer, pA: cute.Pointer,
          pDtBias: cute.Pointer, pB: cute.Pointer, pS: cute.Pointer, pO: cute.Pointer, pN: cute.Pointer,
          batch: cutlass.Int32, scale: cutlass.Float32, Hk: cutlass.Constexpr, Hv: cutlass.Constexpr,
          D: cutlass.Constexpr, stream: cuda.CUstream):
    qk = cute.make_layout((VEC, D // VEC, Hk, batch), stride=(1, VEC, D, Hk * D))
    vo = cute.make_layout((D, Hv, batch), stride=(1, D, Hv * D))
    gates = cute.make_layout((Hv, batch), stride=(1, Hv))
    state = cute.make_layout((VEC, D // VEC, D, Hv, batch), stride=(1, VEC, D, D * D, Hv * D * D))
    _step_kernel(
        cute.make_tensor(pQ, qk), cute.make_tensor(pK, qk), cute.make_tensor(pV, vo),
        cute.make_tensor(pALog, cute.make_layout((Hv,))), cute.make_tensor(pA, gates),
        cute.make_tensor(pDtBias, cute.make_layout((Hv,))), cute.make_tensor(pB, gates),
        cute.make_tensor(pS, state), cute.make_tensor(pO, vo), cute.make_tensor(pN, state), scale,
    ).launch(grid=(D // ROWS_PER_CTA, Hv, batch), block=(THREADS, 1, 1), stream=stream)


@functools.cache
def _compiled(qk_heads, v_heads, head, arch):
    """One compile per head layout; the batch and the scale are runtime arguments."""
    if head % (LANES * VEC) or head % ROWS_PER_CTA or v_heads % qk_heads:
        raise ValueError(f"gdn_decode cute: head size {head} must be a multiple of {ROWS_PER_CTA}, and V heads "
                         f"({v_heads}) a multiple of QK heads ({qk_heads})")
    bf16, fp32 = fake_ptr(torch.bfloat16, 8), fake_ptr(torch.float32, 16)
    return compile_kernel(_step, bf16, bf16, fake_ptr(torch.bfloat16, 2), fake_ptr(torch.float32, 4),
                          fake_ptr(torch.bfloat16, 2), fake_ptr(torch.float32, 4), fake_ptr(torch.bfloat16, 2), fp32,
                          fake_ptr(torch.bfloat16, 2), fp32, cutlass.Int32(1), cutlass.Float32(1.0), qk_heads, v_heads,
                          head, arch=arch)


def solve(q, k, v, state, A_log, a, dt_bias, b, scale):
    batch, _, qk_heads, head = q.shape
    v_heads = v.shape[2]
    if q.dtype != torch.bfloat16 or state.dtype != torch.float32 or v.shape[3] != head:
        raise ValueError("gdn_decode cute: bf16 q/k/v with K = V and an fp32 state")
    q, k, v, state = q.contiguous(), k.contiguous(), v.contiguous(), state.contiguous()
    a, b, A_log, dt_bias = a.contiguous(), b.contiguous(), A_log.contiguous(), dt_bias.contiguous()
    output = torch.empty_like(v)
    new_state = torch.empty_like(state)
    if batch == 0:
        return output, new_state
    kernel = _compiled(qk_heads, v_heads, head, gpu_arch(q.device))
    kernel(gmem_ptr(q, 8), gmem_ptr(k, 8), gmem_ptr(v, 2), gmem_ptr(A_log, 4), gmem_ptr(a, 2), gmem_ptr(dt_bias, 4),
           gmem_ptr(b, 2), gmem_ptr(state, 16), gmem_ptr(output, 2), gmem_ptr(new_state, 16), batch, float(scale),
           stream_of(q))
    return output, new_state


def compile_for(arch: str, sizes: list[dict]) -> None:
    for s in sizes:
        _compiled(s["qk_heads"], s["v_heads"], s["head"], arch)
