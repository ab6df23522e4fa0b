"""Split-K paged GQA decode: fp32 online softmax per (chunk, KV head, sequence) CTA on 16-byte gathers, then a merge."""
import functools
import math

import torch
import tvm_tirx
from tvm_tirx.backend.config import parse_backend_config
from tvm_tirx.backend.cuda.compiler import compile_source
from tvm_tirx.script import tirx as T

_THREADS = 128
_WARPS = _THREADS // 32
_TILE = 8  # tokens per half-warp per step: 2 x _TILE 16-byte gathers in flight per lane
_TARGET_CTAS = 4096  # split the context until the grid has about this many CTAs (~30 per SM)
_MIN_CHUNK = 128  # keeps the per-CTA merge epilogue small next to the streaming loop
_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
CPU_PATH = True


def _lanes(d):
    # A token's head row (d elements) is read by d/8 adjacent lanes, 8 elements (16 bytes) each.
    lpt = d // 8
    if d % 8 or lpt > 32 or lpt & (lpt - 1):
        raise ValueError(f"gqa_decode: head_dim {d} must be 8 x a power of two <= 256")
    return lpt, 32 // lpt


def _cdiv(a, b):
    return -(-a // b)


def _split(batch, hkv, ctx, d):
    # Context chunk per CTA (a multiple of one CTA step) and the number of chunks covering block_table's width.
    step = _WARPS * _lanes(d)[1] * _TILE
    nsplit = max(1, min(_cdiv(_TARGET_CTAS, batch * hkv), _cdiv(ctx, _MIN_CHUNK)))
    chunk = _cdiv(_cdiv(ctx, nsplit), step) * step
    return chunk, _cdiv(ctx, chunk)


def _split_kernel(batch, hq, hkv, d, ctx, chunk, nsplit, dtype):
    group = hq // hkv
    lpt, tpw = _lanes(d)
    step = _WARPS * tpw * _TILE
    nhw = _WARPS * tpw
    nout = _cdiv(group * d, _THREADS)
    qscale = math.log2(math.e) / math.sqrt(d)  # scores live in the log2 domain: exp2 is one MUFU op
    pages = T.dynamic("pages")

    @T.function
    def gqa_decode_split(q: T.Tensor((batch, hq, d), dtype, data_alignment=16),
                         k_cache: T.Tensor((pages, hkv, d), dtype, data_alignment=16),
                         v_cache: T.Tensor((pages, hkv, d), dtype, data_alignment=16),
                         block_table: T.Tensor((batch, ctx), "int32"), seq_lens: T.Tensor((batch,), "int32"),
                         part_o: T.Tensor((batch, hkv, nsplit, group, d), "float32"),
                         part_ml: T.Tensor((batch, hkv, nsplit, group, 2), "float32")):
        T.device_entry(launch=T.cuda.LaunchConfig(grid=(nsplit, hkv, batch), block=_THREADS))
        split = T.cuda.block_idx("x")
        h = T.cuda.block_idx("y")
        b = T.cuda.block_idx("z")
        tid = T.cuda.thread_idx("x")
        w = tid // 32
        sub = (tid % 32) // lpt
        li = tid % lpt
        hw = w * tpw + sub
        qraw = T.alloc_local((8,), dtype)
        qf = T.alloc_local((group * 8,), "float32")
        acc = T.alloc_local((group * 8,), "float32")
        m = T.alloc_local((group,), "float32")
        l = T.alloc_local((group,), "float32")
        pg = T.alloc_local((_TILE,), "int32")
        kraw = T.alloc_local((_TILE * 8,), dtype)
        vraw = T.alloc_local((_TILE * 8,), dtype)
        sc = T.alloc_local((_TILE * group,), "float32")
        mu = T.alloc_local((group,), "float32")
        xf = T.alloc_local((8,), "float32")
        tmp = T.alloc_local((4,), "float32")
        sm_acc = T.alloc_shared((nhw, group, d), "float32")
        sm_ml = T.alloc_shared((nhw, group, 2), "float32")
        neg_inf = T.float32(-math.inf)
        seqlen = seq_lens[b]
        start = split * chunk
        if start < seqlen:
            end = T.min(start + chunk, seqlen)
            for gg in T.unroll(group):
                qraw[0:8] = q[b, h * group + gg, T.Ramp(li * 8, 1, 8)]
                for e in T.unroll(8):
                    qf[gg * 8 + e] = T.float32(qraw[e]) * T.float32(qscale)
                    acc[gg * 8 + e] = T.float32(0)
                m[gg] = neg_inf
                l[gg] = T.float32(0)
            for t in T.unroll(_TILE):
                pg[t] = block_table[b, T.min(start + w * (tpw * _TILE) + t * tpw + sub, end - 1)]
            for it in T.serial(chunk // step):
                base = start + it * step + w * (tpw * _TILE)
                if base < end:  # warp-uniform, so the width-lpt shuffles below never diverge
                    # Issue all K and V gathers of the tile before using any of them. Tokens past the end re-read
                    # the last valid token (no branch, no padding entry read) and are masked to p = 0 below.
                    for t in T.unroll(_TILE):
                        kraw[t * 8:t * 8 + 8] = k_cache[T.int64(pg[t]), T.int64(h), T.Ramp(T.int64(li * 8), 1, 8)]
                        vraw[t * 8:t * 8 + 8] = v_cache[T.int64(pg[t]), T.int64(h), T.Ramp(T.int64(li * 8), 1, 8)]
                    # Prefetch the next step's page numbers so their latency overlaps this step's math.
                    for t in T.unroll(_TILE):
                        pg[t] = block_table[b, T.min(base + step + t * tpw + sub, end - 1)]
                    for t in T.unroll(_TILE):
                        for e in T.unroll(8):
                            xf[e] = T.float32(kraw[t * 8 + e])
                        for gg in T.unroll(group):
                            tmp[0] = T.float32(0)
                            for e in T.unroll(8):
                                tmp[0] = tmp[0] + qf[gg * 8 + e] * xf[e]
                            # Shuffle outside the select: a select around a call becomes a branch, and the two
                            # half-warps of a warp may disagree on the mask.
                            tmp[0] = T.cuda.warp_reduce(tmp[0], "sum", lpt)
                            sc[t * group + gg] = T.select(base + t * tpw + sub < end, tmp[0], neg_inf)
                    for gg in T.unroll(group):
                        tmp[1] = m[gg]
                        for t in T.unroll(_TILE):
                            # Plain compare-select (T.max adds NaN propagation the scores never need).
                            tmp[1] = T.select(sc[t * group + gg] > tmp[1], sc[t * group + gg], tmp[1])
                        # A half-warp whose tokens so far are all masked keeps m = -inf; exponentiate against 0.
                        mu[gg] = T.select(tmp[1] == neg_inf, T.float32(0), tmp[1])
                        tmp[3] = T.exp2(m[gg] - mu[gg])
                        l[gg] = l[gg] * tmp[3]
                        for e in T.unroll(8):
                            acc[gg * 8 + e] = acc[gg * 8 + e] * tmp[3]
                        m[gg] = tmp[1]
                    for t in T.unroll(_TILE):
                        for e in T.unroll(8):
                            xf[e] = T.float32(vraw[t * 8 + e])
                        for gg in T.unroll(group):
                            tmp[0] = T.exp2(sc[t * group + gg] - mu[gg])
                            l[gg] = l[gg] + tmp[0]
                            for e in T.unroll(8):
                                acc[gg * 8 + e] = acc[gg * 8 + e] + tmp[0] * xf[e]
            for gg in T.unroll(group):
                sm_acc[hw, gg, li * 8:li * 8 + 8] = acc[T.Ramp(gg * 8, 1, 8)]
                if li == 0:
                    sm_ml[hw, gg, 0] = m[gg]
                    sm_ml[hw, gg, 1] = l[gg]
            T.cuda.cta_sync()
            # Combine the CTA's half-warps; half-warp 0 always saw token `start`, so the max is finite.
            for i in T.unroll(nout):
                if i * _THREADS + tid < group * d:
                    gg = (i * _THREADS + tid) // d
                    dd = (i * _THREADS + tid) % d
                    tmp[1] = neg_inf
                    for x in T.unroll(nhw):
                        tmp[1] = T.max(tmp[1], sm_ml[x, gg, 0])
                    tmp[2] = T.float32(0)
                    tmp[3] = T.float32(0)
                    for x in T.unroll(nhw):
                        tmp[0] = T.exp2(sm_ml[x, gg, 0] - tmp[1])
                        tmp[2] = tmp[2] + sm_ml[x, gg, 1] * tmp[0]
                        tmp[3] = tmp[3] + sm_acc[x, gg, dd] * tmp[0]
                    part_o[b, h, split, gg, dd] = tmp[3]
                    if dd == 0:
                        part_ml[b, h, split, gg, 0] = tmp[1]
                        part_ml[b, h, split, gg, 1] = tmp[2]

    return gqa_decode_split


def _merge_kernel(batch, hq, hkv, d, chunk, nsplit, dtype):
    group = hq // hkv

    @T.function
    def gqa_decode_merge(seq_lens: T.Tensor((batch,), "int32"),
                         part_o: T.Tensor((batch, hkv, nsplit, group, d), "float32"),
                         part_ml: T.Tensor((batch, hkv, nsplit, group, 2), "float32"),
                         o: T.Tensor((batch, hq, d), dtype)):
        T.device_entry(launch=T.cuda.LaunchConfig(grid=(hq, batch), block=d))
        qh = T.cuda.block_idx("x")
        b = T.cuda.block_idx("y")
        dd = T.cuda.thread_idx("x")
        h = qh // group
        gg = qh % group
        st = T.alloc_local((4,), "float32")
        st[0] = T.float32(-math.inf)
        st[1] = T.float32(0)
        st[2] = T.float32(0)
        # Only the chunks the split kernel wrote (those starting before seq_lens[b]).
        for s in T.serial(T.ceildiv(seq_lens[b], chunk)):
            st[3] = T.max(st[0], part_ml[b, h, s, gg, 0])
            st[1] = st[1] * T.exp2(st[0] - st[3]) + part_ml[b, h, s, gg, 1] * T.exp2(part_ml[b, h, s, gg, 0] - st[3])
            st[2] = st[2] * T.exp2(st[0] - st[3]) + part_o[b, h, s, gg, dd] * T.exp2(part_ml[b, h, s, gg, 0] - st[3])
            st[0] = st[3]
        o[b, qh, dd] = T.cast(st[2] / st[1], dtype)

    return gqa_decode_merge


@functools.cache
def _compiled(batch, hq, hkv, d, ctx, dtype, arch):
    chunk, nsplit = _split(batch, hkv, ctx, d)
    target = tvm_tirx.target.Target({"kind": "cuda", "arch": arch})
    return (tvm_tirx.tirx.compile(_split_kernel(batch, hq, hkv, d, ctx, chunk, nsplit, dtype), target=target),
            tvm_tirx.tirx.compile(_merge_kernel(batch, hq, hkv, d, chunk, nsplit, dtype), target=target))


@functools.cache
def _device_arch(index):
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


@functools.cache
def _cpu_compiled(hq, hkv, d, dtype):
    """Host (llvm) kernel: one parallel iteration per (sequence, query head), fp32 online softmax over the
    sequence's first seq_lens[b] pages; padding entries of block_table are never read."""
    group = hq // hkv
    qscale = 1.0 / math.sqrt(d)
    batch = T.dynamic("batch")
    pages = T.dynamic("pages")
    ctx = T.dynamic("ctx")

    @T.function
    def gqa_decode_cpu(q: T.Tensor((batch, hq, d), dtype), k_cache: T.Tensor((pages, hkv, d), dtype),
                       v_cache: T.Tensor((pages, hkv, d), dtype), block_table: T.Tensor((batch, ctx), "int32"),
                       seq_lens: T.Tensor((batch,), "int32"), o: T.Tensor((batch, hq, d), dtype)):
        for bq in T.parallel(batch * hq):
            b = bq // hq
            qh = bq % hq
            h = qh // group
            qf = T.alloc_local((d,), "float32")
            acc = T.alloc_local((d,), "float32")
            # st: running max, running sum, score, new max, rescale factor, p
            st = T.alloc_local((6,), "float32")
            for e in range(d):
                qf[e] = T.float32(q[b, qh, e]) * T.float32(qscale)
                acc[e] = T.float32(0)
            st[0] = T.float32(-math.inf)
            st[1] = T.float32(0)
            for t in T.serial(seq_lens[b]):
                pg = T.Cast("int64", block_table[b, t])
                st[2] = T.float32(0)
                for e in range(d):
                    st[2] = st[2] + qf[e] * T.float32(k_cache[pg, h, e])
                st[3] = T.max(st[0], st[2])
                st[4] = T.exp(st[0] - st[3])
                st[5] = T.exp(st[2] - st[3])
                st[1] = st[1] * st[4] + st[5]
                for e in range(d):
                    acc[e] = acc[e] * st[4] + st[5] * T.float32(v_cache[pg, h, e])
                st[0] = st[3]
            for e in range(d):
                o[b, qh, e] = T.cast(acc[e] / st[1], dtype)

    return tvm_tirx.tirx.compile(gqa_decode_cpu, target="llvm")


def _solve_cpu(q, k_cache, v_cache, block_table, seq_lens):
    batch, hq, d = q.shape
    hkv = k_cache.shape[1]
    o = torch.empty((batch, hq, d), dtype=q.dtype, device=q.device)
    _cpu_compiled(hq, hkv, d, _DTYPES[q.dtype])(q.contiguous(), k_cache.contiguous(), v_cache.contiguous(),
                                                block_table.to(torch.int32).contiguous(),
                                                seq_lens.to(torch.int32).contiguous(), o)
    return o


def solve(q, k_cache, v_cache, block_table, seq_lens):
    if not q.is_cuda:
        return _solve_cpu(q, k_cache, v_cache, block_table, seq_lens)
    batch, hq, d = q.shape
    hkv, ctx = k_cache.shape[1], block_table.shape[1]
    chunk, nsplit = _split(batch, hkv, ctx, d)
    split_ex, merge_ex = _compiled(batch, hq, hkv, d, ctx, _DTYPES[q.dtype], _device_arch(q.device.index or 0))
    part_o = torch.empty((batch, hkv, nsplit, hq // hkv, d), dtype=torch.float32, device=q.device)
    part_ml = torch.empty((batch, hkv, nsplit, hq // hkv, 2), dtype=torch.float32, device=q.device)
    o = torch.empty((batch, hq, d), dtype=q.dtype, device=q.device)
    seq_lens = seq_lens.to(torch.int32).contiguous()
    split_ex(q.contiguous(), k_cache.contiguous(), v_cache.contiguous(), block_table.to(torch.int32).contiguous(),
             seq_lens, part_o, part_ml)
    merge_ex(seq_lens, part_o, part_ml, o)
    return o


def compile_for(arch: str, sizes: list[dict]) -> None:
    """Compile both kernels solve launches at every GPU size to device binaries for `arch` with nvcc."""
    for s in sizes:
        for ex in _compiled(s["batch"], s["q_heads"], s["kv_heads"], s["head_dim"], s["max_context"], "bfloat16", arch):
            for mod in ex.mod.imports:  # device code is otherwise built lazily at first launch
                config = parse_backend_config(mod.inspect_source("backend_config"))
                config["cuda"]["compiler"] = "nvcc"
                if not compile_source(mod.inspect_source("cuda"), config).binary:
                    raise RuntimeError(f"nvcc produced no binary for {arch}")
