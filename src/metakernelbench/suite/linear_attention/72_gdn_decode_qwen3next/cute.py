"""Gated delta decode: each CTA keeps a column block of the fp32 state in registers, one 16-byte load/store per 4."""
import functools

import torch

import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass.cute.runtime import make_fake_stream, make_ptr

THREADS = 128
WARPS = THREADS // 32
VEC = 4  # fp32 state elements per 16-byte access
L2_EPS = 1e-6


@cute.kernel
def _step_kernel(
    mQ: cute.Tensor,  # (E, dk/E, Hk, B) bf16, E = dk/32 elements per lane
    mK: cute.Tensor,
    mV: cute.Tensor,  # (VEC, dv/VEC, Hv, B)
    mG: cute.Tensor,  # (Hv, B)
    mBeta: cute.Tensor,
    mS: cute.Tensor,  # (VEC, dv/VEC, dk, Hv, B) fp32
    mO: cute.Tensor,  # (VEC, dv/VEC, Hv, B)
    mN: cute.Tensor,  # like mS: the new state
    CL: cutlass.Constexpr,  # lanes across the columns of one row
    scale: cutlass.Constexpr,
):
    dk = mS.shape[2]
    RS = THREADS // CL  # rows read concurrently by the CTA
    NR = dk // RS  # rows per thread
    tid, _, _ = cute.arch.thread_idx()
    jb, h, b = cute.arch.block_idx()
    hk = h // (mS.shape[3] // mQ.shape[2])
    bl = cutlass.Int64(b)  # state offsets can pass 2^31 elements
    c = tid % CL
    rs = tid // CL
    jv = jb * CL + c
    warp = tid // 32
    lane = tid % 32

    # The state loads go out first; everything up to their first use overlaps with them.
    rS = cute.make_rmem_tensor((VEC, NR), cutlass.Float32)
    for m in cutlass.range_constexpr(NR):
        cute.autovec_copy(mS[None, jv, rs + RS * m, h, bl], rS[None, m])
    rV = cute.make_rmem_tensor((VEC,), mV.element_type)
    cute.autovec_copy(mV[None, jv, h, b], rV)
    g = mG[h, b]
    beta = mBeta[h, b]

    sQ = cute.make_tensor(cute.arch.alloc_smem(cutlass.Float32, dk, 16), cute.make_layout((dk,)))
    sK = cute.make_tensor(cute.arch.alloc_smem(cutlass.Float32, dk, 16), cute.make_layout((dk,)))
    sQK = cute.make_tensor(cute.arch.alloc_smem(cutlass.Float32, 1, 4), cute.make_layout((1,)))
    sA = cute.make_tensor(
        cute.arch.alloc_smem(cutlass.Float32, WARPS * CL * VEC, 16), cute.make_layout((VEC, CL, WARPS))
    )
    sB = cute.make_tensor(
        cute.arch.alloc_smem(cutlass.Float32, WARPS * CL * VEC, 16), cute.make_layout((VEC, CL, WARPS))
    )

    if warp == 0:
        E = mQ.shape[0]
        rIn = cute.make_rmem_tensor((E,), mQ.element_type)
        cute.autovec_copy(mQ[None, lane, hk, b], rIn)
        q = rIn.load().to(cutlass.Float32)
        cute.autovec_copy(mK[None, lane, hk, b], rIn)
        k = rIn.load().to(cutlass.Float32)
        ssq_q = cute.arch.warp_reduction_sum((q * q).reduce(cute.ReductionOp.ADD, 0.0, 0))
        ssq_k = cute.arch.warp_reduction_sum((k * k).reduce(cute.ReductionOp.ADD, 0.0, 0))
        dot = cute.arch.warp_reduction_sum((q * k).reduce(cute.ReductionOp.ADD, 0.0, 0))
        rq = cute.math.rsqrt(ssq_q + L2_EPS) * scale
        rk = cute.math.rsqrt(ssq_k + L2_EPS)
        for e in cutlass.range_constexpr(E):
            sQ[lane * E + e] = q[e] * rq
            sK[lane * E + e] = k[e] * rk
        if lane == 0:
            sQK[0] = dot * rq * rk
    cute.arch.sync_threads()

    # Partial kᵀS and qᵀS over this thread's rows, then over the row slots of the warp and of the CTA.
    a = cute.make_rmem_tensor((VEC,), cutlass.Float32)
    bq = cute.make_rmem_tensor((VEC,), cutlass.Float32)
    a.fill(0.0)
    bq.fill(0.0)
    for m in cutlass.range_constexpr(NR):
        ki = sK[rs + RS * m]
        qi = sQ[rs + RS * m]
        for e in cutlass.range_constexpr(VEC):
            a[e] = a[e] + ki * rS[e, m]
            bq[e] = bq[e] + qi * rS[e, m]
    for e in cutlass.range_constexpr(VEC):
        for i in cutlass.range_constexpr(6 - CL.bit_length()):  # xor offsets CL, 2·CL, ..., 16
            a[e] = a[e] + cute.arch.shuffle_sync_bfly(a[e], offset=CL << i)
            bq[e] = bq[e] + cute.arch.shuffle_sync_bfly(bq[e], offset=CL << i)
    if lane < CL:
        sA[None, c, warp].store(a.load())
        sB[None, c, warp].store(bq.load())
    cute.arch.sync_threads()
    a.store(sA[None, c, 0].load())
    bq.store(sB[None, c, 0].load())
    for w in cutlass.range_constexpr(1, WARPS):
        a.store(a.load() + sA[None, c, w].load())
        bq.store(bq.load() + sB[None, c, w].load())

    # S' = d·S + k ⊗ u with u = beta·(v − d·kᵀS);  o = qᵀS' = d·qᵀS + (q·k)·u  (q already carries the scale).
    decay = cute.math.exp(g)
    u = (rV.load().to(cutlass.Float32) - a.load() * decay) * beta
    if rs == 0:
        rO = cute.make_rmem_tensor((VEC,), mO.element_type)
        rO.store((bq.load() * decay + u * sQK[0]).to(mO.element_type))
        cute.autovec_copy(rO, mO[None, jv, h, b])
    for m in cutlass.range_constexpr(NR):
        rS[None, m].store(rS[None, m].load() * decay + u * sK[rs + RS * m])
        cute.autovec_copy(rS[None, m], mN[None, jv, rs + RS * m, h, bl])


@cute.jit
def _step(
    pQ: cute.Pointer,
    pK: cute.Pointer,
    pV: cute.Pointer,
    pG: cute.Pointer,
    pBeta: cute.Pointer,
    pS: cute.Pointer,
    pO: cute.Pointer,
    pN: cute.Pointer,
    batch: cutlass.Int32,
    stream: cuda.CUstream,
    Hk: cutlass.Constexpr,
    Hv: cutlass.Constexpr,
    dk: cutlass.Constexpr,
    dv: cutlass.Constexpr,
):
    E = dk // 32
    CL = min(16, dv // VEC)
    nvec = dv // VEC
    qk = cute.make_layout((E, 32, Hk, batch), stride=(1, E, dk, Hk * dk))
    vo = cute.make_layout((VEC, nvec, Hv, batch), stride=(1, VEC, dv, Hv * dv))
    st = cute.make_layout((VEC, nvec, dk, Hv, batch), stride=(1, VEC, dv, dk * dv, Hv * dk * dv))
    gb = cute.make_layout((Hv, batch), stride=(1, Hv))
    _step_kernel(
        cute.make_tensor(pQ, qk),
        cute.make_tensor(pK, qk),
        cute.make_tensor(pV, vo),
        cute.make_tensor(pG, gb),
        cute.make_tensor(pBeta, gb),
        cute.make_tensor(pS, st),
        cute.make_tensor(pO, vo),
        cute.make_tensor(pN, st),
        CL,
        dk ** -0.5,
    ).launch(grid=(nvec // CL, Hv, batch), block=(THREADS, 1, 1), stream=stream)


_DTYPES = {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16}


@functools.lru_cache(maxsize=None)
def _compiled(dtype, qk_heads, v_heads, dk, dv, arch):
    cl = min(16, dv // VEC)
    e = dk // 32
    if dk % 32 or e & (e - 1) or dv % VEC or 32 % cl or (dv // VEC) % cl or dk % (THREADS // cl) \
            or v_heads % qk_heads:
        raise ValueError(f"unsupported dk={dk}, dv={dv}, qk_heads={qk_heads}, v_heads={v_heads}")
    el = _DTYPES[dtype]

    def ptr(t, align):
        return make_ptr(t, 0, cute.AddressSpace.gmem, assumed_align=align)

    in_align = 2 * (dk // 32)
    return cute.compile(
        _step,
        ptr(el, in_align), ptr(el, in_align), ptr(el, 8), ptr(cutlass.Float32, 4), ptr(cutlass.Float32, 4),
        ptr(cutlass.Float32, 16), ptr(el, 8), ptr(cutlass.Float32, 16),
        cutlass.Int32(1), make_fake_stream(), qk_heads, v_heads, dk, dv,
        options=f"--gpu-arch {arch}",
    )


@functools.lru_cache(maxsize=None)
def _arch(device):
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _ptr(t, dtype, align):
    if not t.is_contiguous() or t.data_ptr() % align:
        raise ValueError(f"expected a contiguous tensor aligned to {align} bytes, got shape {tuple(t.shape)}")
    return make_ptr(dtype, t.data_ptr(), cute.AddressSpace.gmem, assumed_align=align)


def solve(q, k, v, g, beta, state):
    batch, qk_heads, dk = q.shape
    v_heads, dv = v.shape[1], v.shape[2]
    el = _DTYPES[q.dtype]
    g = g.to(torch.float32)
    beta = beta.to(torch.float32)
    if state.dtype != torch.float32:
        raise ValueError(f"state must be float32, got {state.dtype}")
    o = torch.empty_like(v)
    new_state = torch.empty_like(state)
    kernel = _compiled(q.dtype, qk_heads, v_heads, dk, dv, _arch(q.device))
    in_align = 2 * (dk // 32)
    kernel(
        _ptr(q, el, in_align), _ptr(k, el, in_align), _ptr(v, el, 8), _ptr(g, cutlass.Float32, 4),
        _ptr(beta, cutlass.Float32, 4), _ptr(state, cutlass.Float32, 16), _ptr(o, el, 8),
        _ptr(new_state, cutlass.Float32, 16), batch,
        cuda.CUstream(torch.cuda.current_stream(q.device).cuda_stream),
    )
    return o, new_state


def compile_for(arch: str, sizes: list[dict]) -> None:
    """Compile the step kernel for every GPU size (the batch is dynamic)."""
    for s in sizes:
        _compiled(torch.bfloat16, s["qk_heads"], s["v_heads"], s["dk"], s["dv"], arch)
