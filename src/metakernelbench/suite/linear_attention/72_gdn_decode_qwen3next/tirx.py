"""Gated delta decode: a CTA per (sequence, v head, dv block) holds its fp32 state slice in registers for the update."""
import functools

import torch
import tvm_tirx
from tvm_tirx.backend.config import parse_backend_config
from tvm_tirx.backend.cuda.compiler import compile_source
from tvm_tirx.script import tirx as T

_THREADS = 128
_WARPS = _THREADS // 32
_EPS = 1e-6
_NRED = 3  # per-CTA scalars reduced beside the columns: q·q, k·k, q·k
_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
CPU_PATH = True


def _layout(dk, dv):
    # cpt columns per thread (one 16-byte fp32 vector), tpr threads across a row, rpw rows per warp, rp rows per
    # CTA pass, rpt rows per thread. Lanes sharing columns are adjacent so the dk reduction is a width-rpw shuffle.
    cpt = 4 if dv % 4 == 0 else (2 if dv % 2 == 0 else 1)
    tpr = 8
    while (dv // cpt) % tpr:
        tpr //= 2
    rpw = 32 // tpr
    rp = _THREADS // tpr
    return cpt, tpr, rpw, rp, -(-dk // rp)


def _kernel(hk, hv, dk, dv, in_dtype, gb_dtype):
    batch = T.dynamic("batch")
    cpt, tpr, rpw, rp, rpt = _layout(dk, dv)
    dvb = cpt * tpr
    nblk = dv // dvb
    group = hv // hk
    nval = 2 * cpt + _NRED
    scale = dk ** -0.5

    @T.function
    def gated_delta_decode(q: T.Tensor((batch, hk, dk), in_dtype), k: T.Tensor((batch, hk, dk), in_dtype),
                           v: T.Tensor((batch, hv, dv), in_dtype), g: T.Tensor((batch, hv), gb_dtype),
                           beta: T.Tensor((batch, hv), gb_dtype),
                           state: T.Tensor((batch, hv, dk, dv), "float32", data_alignment=4 * cpt),
                           o: T.Tensor((batch, hv, dv), in_dtype),
                           new_state: T.Tensor((batch, hv, dk, dv), "float32", data_alignment=4 * cpt)):
        T.device_entry(launch=T.cuda.LaunchConfig(grid=(batch * hv, nblk), block=_THREADS))
        bh = T.cuda.block_idx("x")
        b = bh // hv
        h = bh % hv
        hq = h // group
        tid = T.cuda.thread_idx("x")
        w = tid // 32
        lane = tid % 32
        c = lane // rpw
        r = w * rpw + lane % rpw
        col = T.cuda.block_idx("y") * dvb + c * cpt
        s_reg = T.alloc_local((rpt * cpt,), "float32")
        qk_reg = T.alloc_local((2 * rpt,), "float32")
        part = T.alloc_local((nval,), "float32")
        tot = T.alloc_local((nval,), "float32")
        red = T.alloc_shared((_WARPS, tpr, nval), "float32")
        # All state loads first: rpt 16-byte loads in flight per thread before any arithmetic.
        for i in T.unroll(rpt):
            if r + rp * i < dk:
                # int64 offsets: batch x hv x dk x dv outgrows int32 at large decode batches.
                s_reg[i * cpt:i * cpt + cpt] = state[T.int64(b), h, r + rp * i, T.Ramp(T.int64(col), 1, cpt)]
                qk_reg[2 * i] = T.float32(q[b, hq, r + rp * i])
                qk_reg[2 * i + 1] = T.float32(k[b, hq, r + rp * i])
            else:
                for j in T.unroll(cpt):
                    s_reg[i * cpt + j] = T.float32(0)
                qk_reg[2 * i] = T.float32(0)
                qk_reg[2 * i + 1] = T.float32(0)
        for j in T.unroll(nval):
            part[j] = T.float32(0)
        # Raw (unnormalised) q and k: the norms are reduced in the same pass and applied afterwards.
        for i in T.unroll(rpt):
            for j in T.unroll(cpt):
                part[j] = part[j] + s_reg[i * cpt + j] * qk_reg[2 * i + 1]
                part[cpt + j] = part[cpt + j] + s_reg[i * cpt + j] * qk_reg[2 * i]
            part[2 * cpt] = part[2 * cpt] + qk_reg[2 * i] * qk_reg[2 * i]
            part[2 * cpt + 1] = part[2 * cpt + 1] + qk_reg[2 * i + 1] * qk_reg[2 * i + 1]
            part[2 * cpt + 2] = part[2 * cpt + 2] + qk_reg[2 * i] * qk_reg[2 * i + 1]
        for j in T.unroll(nval):
            part[j] = T.cuda.warp_reduce(part[j], "sum", rpw)
        if lane % rpw == 0:
            for j in T.unroll(nval):
                red[w, c, j] = part[j]
        T.cuda.cta_sync()
        for j in T.unroll(nval):
            tot[j] = T.float32(0)
            for ww in T.unroll(_WARPS):
                tot[j] = tot[j] + red[ww, c, j]
        inv_q = T.rsqrt(tot[2 * cpt] + T.float32(_EPS))
        inv_k = T.rsqrt(tot[2 * cpt + 1] + T.float32(_EPS))
        decay = T.exp(T.float32(g[b, h]))
        bt = T.float32(beta[b, h])
        qk_hat = tot[2 * cpt + 2] * inv_q * inv_k
        for j in T.unroll(cpt):
            # u = beta (v - (decay S)ᵀ k̂);  o = scale ((decay S)ᵀ q̂ + (q̂·k̂) u)
            u = bt * (T.float32(v[b, h, col + j]) - decay * inv_k * tot[j])
            tot[j] = u
            tot[cpt + j] = T.float32(scale) * (decay * inv_q * tot[cpt + j] + qk_hat * u)
        if r == 0:
            for j in T.unroll(cpt):
                o[b, h, col + j] = T.cast(tot[cpt + j], in_dtype)
        for i in T.unroll(rpt):
            if r + rp * i < dk:
                kh = qk_reg[2 * i + 1] * inv_k
                for j in T.unroll(cpt):
                    s_reg[i * cpt + j] = decay * s_reg[i * cpt + j] + kh * tot[j]
                new_state[T.int64(b), h, r + rp * i, T.Ramp(T.int64(col), 1, cpt)] = s_reg[T.Ramp(i * cpt, 1, cpt)]

    return gated_delta_decode


def _target(arch):
    # Precise expf/rsqrtf and IEEE division: new_state is compared in fp32.
    cuda = {"nvrtc": [], "nvcc": []}
    return tvm_tirx.target.Target({"kind": "cuda", "arch": arch, "backend_config": {"cuda": cuda}})


@functools.cache
def _compiled(hk, hv, dk, dv, in_dtype, gb_dtype, arch):
    return tvm_tirx.tirx.compile(_kernel(hk, hv, dk, dv, in_dtype, gb_dtype), target=_target(arch))


@functools.cache
def _device_arch(index):
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


@functools.cache
def _cpu_compiled(hk, hv, dk, dv, in_dtype, gb_dtype):
    """Host (llvm) kernel: one parallel iteration per (sequence, v head), the same algebra as the CUDA kernel."""
    batch = T.dynamic("batch")
    group = hv // hk
    scale = dk ** -0.5

    @T.function
    def gated_delta_decode_cpu(q: T.Tensor((batch, hk, dk), in_dtype), k: T.Tensor((batch, hk, dk), in_dtype),
                               v: T.Tensor((batch, hv, dv), in_dtype), g: T.Tensor((batch, hv), gb_dtype),
                               beta: T.Tensor((batch, hv), gb_dtype),
                               state: T.Tensor((batch, hv, dk, dv), "float32"),
                               o: T.Tensor((batch, hv, dv), in_dtype),
                               new_state: T.Tensor((batch, hv, dk, dv), "float32")):
        for bh in T.parallel(batch * hv):
            b = bh // hv
            h = bh % hv
            hq = h // group
            # red: q·q, k·k, q·k, Sᵀk, Sᵀq (raw q and k); sc: 1/|q|, 1/|k|, decay, beta, q̂·k̂, u
            red = T.alloc_local((5,), "float32")
            sc = T.alloc_local((6,), "float32")
            for j in range(3):
                red[j] = T.float32(0)
            for i in range(dk):
                red[0] = red[0] + T.float32(q[b, hq, i]) * T.float32(q[b, hq, i])
                red[1] = red[1] + T.float32(k[b, hq, i]) * T.float32(k[b, hq, i])
                red[2] = red[2] + T.float32(q[b, hq, i]) * T.float32(k[b, hq, i])
            sc[0] = T.rsqrt(red[0] + T.float32(_EPS))
            sc[1] = T.rsqrt(red[1] + T.float32(_EPS))
            sc[2] = T.exp(T.float32(g[b, h]))
            sc[3] = T.float32(beta[b, h])
            sc[4] = red[2] * sc[0] * sc[1]
            for j in range(dv):
                red[3] = T.float32(0)
                red[4] = T.float32(0)
                for i in range(dk):
                    red[3] = red[3] + state[b, h, i, j] * T.float32(k[b, hq, i])
                    red[4] = red[4] + state[b, h, i, j] * T.float32(q[b, hq, i])
                # u = beta (v - (decay S)ᵀ k̂);  o = scale ((decay S)ᵀ q̂ + (q̂·k̂) u)
                sc[5] = sc[3] * (T.float32(v[b, h, j]) - sc[2] * sc[1] * red[3])
                o[b, h, j] = T.cast(T.float32(scale) * (sc[2] * sc[0] * red[4] + sc[4] * sc[5]), in_dtype)
                for i in range(dk):
                    new_state[b, h, i, j] = sc[2] * state[b, h, i, j] + T.float32(k[b, hq, i]) * sc[1] * sc[5]

    return tvm_tirx.tirx.compile(gated_delta_decode_cpu, target="llvm")


def _solve_cpu(q, k, v, g, beta, state):
    batch, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    state = state.contiguous()
    o = torch.empty((batch, hv, dv), dtype=v.dtype, device=v.device)
    new_state = torch.empty_like(state)
    ex = _cpu_compiled(hk, hv, dk, dv, _DTYPES[q.dtype], _DTYPES[g.dtype])
    ex(q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(), state, o, new_state)
    return o, new_state


def solve(q, k, v, g, beta, state):
    if not q.is_cuda:
        return _solve_cpu(q, k, v, g, beta, state)
    batch, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    state = state.contiguous()
    o = torch.empty((batch, hv, dv), dtype=v.dtype, device=v.device)
    new_state = torch.empty_like(state)
    ex = _compiled(hk, hv, dk, dv, _DTYPES[q.dtype], _DTYPES[g.dtype], _device_arch(q.device.index or 0))
    ex(q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(), state, o, new_state)
    return o, new_state


def compile_for(arch: str, sizes: list[dict]) -> None:
    """Compile the kernel (batch is dynamic) solve launches at every GPU size for `arch` with nvcc."""
    for mod in [m for s in sizes for m in _compiled(s["qk_heads"], s["v_heads"], s["dk"], s["dv"], "bfloat16",
                                                    "float32", arch).mod.imports]:  # device code is otherwise built lazily at first launch
        config = parse_backend_config(mod.inspect_source("backend_config"))
        config["cuda"]["compiler"] = "nvcc"
        if not compile_source(mod.inspect_source("cuda"), config).binary:
            raise RuntimeError(f"nvcc produced no binary for {arch}")
