"""Split-K paged GQA decode over CSR page lists: fp32 online softmax per (chunk, KV head) CTA on 16-byte gathers, then
a merge that writes o and the base-2 LSE."""
import functools
import math

import torch
from tvm_tirx.script import tirx as T

from metakernelbench.suite.kits.common import gpu_arch, split_kv_slots
from metakernelbench.suite.kits.tirx import TIRX_DTYPES, build_cpu, build_cuda, nvcc_build

_THREADS = 128
_WARPS = _THREADS // 32
_TILE = 8  # tokens per half-warp per step: 2 x _TILE 16-byte gathers in flight per lane
_SEARCH = 4  # kv_indptr entries per lane per round of the sequence search: 128 sequences per round trip
_TARGET_CTAS = 4096  # the shorter chunk while the grid stays within about this many CTAs (~30 per SM)
_CHUNKS = (128, 256)  # tokens per CTA: the two shape classes compiled per head configuration
_LOG2E = math.log2(math.e)
CPU_PATH = True  # a host (llvm) build too: `mkb demo` and CI grade it on the CPU


def _lanes(d):
    # A token's head row (d elements) is read by d/8 adjacent lanes, 8 elements (16 bytes) each.
    lpt = d // 8
    if d % 8 or lpt > 32 or lpt & (lpt - 1):
        raise ValueError(f"gqa decode tirx: head_dim {d} must be 8 x a power of two <= 256")
    return lpt, 32 // lpt


def _cdiv(a, b):
    return -(-a // b)


def _chunk_len(tokens, batch, hkv):
    """Tokens per CTA: 128 while the grid stays near _TARGET_CTAS, else 256 (fewer partials to merge)."""
    return _CHUNKS[0] if hkv * split_kv_slots(tokens, batch, _CHUNKS[0]) <= _TARGET_CTAS else _CHUNKS[1]


def _split_kernel(hq, hkv, d, chunk, dtype):
    group = hq // hkv
    lpt, tpw = _lanes(d)
    step = _WARPS * tpw * _TILE
    nhw = _WARPS * tpw
    nout = _cdiv(group * d, _THREADS)
    batch = T.dynamic("batch")
    tokens = T.dynamic("tokens")
    pages = T.dynamic("pages")
    slots = T.dynamic("slots")

    @T.function
    def gqa_decode_split(q: T.Tensor((batch, hq, d), dtype, data_alignment=16),
                         k_cache: T.Tensor((pages, 1, hkv, d), dtype, data_alignment=16),
                         v_cache: T.Tensor((pages, 1, hkv, d), dtype, data_alignment=16),
                         kv_indptr: T.Tensor((batch + 1,), "int32"), kv_indices: T.Tensor((tokens,), "int32"),
                         sm_scale: T.float32,
                         part_o: T.Tensor((slots, hkv, group, d), "float32"),
                         part_ml: T.Tensor((slots, hkv, group, 2), "float32")):
        T.device_entry(launch=T.cuda.LaunchConfig(grid=(slots, hkv), block=_THREADS))
        slot = T.cuda.block_idx("x")
        h = T.cuda.block_idx("y")
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
        seen = T.alloc_local((1,), "int32")
        sm_acc = T.alloc_shared((nhw, group, d), "float32")
        sm_ml = T.alloc_shared((nhw, group, 2), "float32")
        neg_inf = T.float32(-math.inf)
        # The slot's sequence b is the last whose first slot kv_indptr[b] // chunk + b (see split_kv_slots) is
        # <= slot: every warp counts those sequences with warp reductions, the same count in every lane.
        seen[0] = 0
        for r in T.serial(T.ceildiv(batch, 32 * _SEARCH)):
            for u in T.unroll(_SEARCH):
                i = r * (32 * _SEARCH) + u * 32 + tid % 32
                before = T.if_then_else(
                    T.And(i < batch, kv_indptr[T.min(i, batch - 1)] // chunk + i <= slot), T.uint32(1), T.uint32(0))
                seen[0] = seen[0] + T.Cast("int32", T.cuda.reduce_add_sync_u32(T.uint32(0xFFFFFFFF), before))
        b = seen[0] - 1
        kv_start = kv_indptr[b]
        seqlen = kv_indptr[b + 1] - kv_start
        start = (slot - (kv_start // chunk + b)) * chunk
        if start < seqlen:  # past the sequence's last chunk: an empty slot
            end = T.min(start + chunk, seqlen)
            for gg in T.unroll(group):
                qraw[0:8] = q[b, h * group + gg, T.Ramp(li * 8, 1, 8)]
                for e in T.unroll(8):
                    # Scores live in the log2 domain: exp2 is one MUFU op.
                    qf[gg * 8 + e] = T.float32(qraw[e]) * (sm_scale * T.float32(_LOG2E))
                    acc[gg * 8 + e] = T.float32(0)
                m[gg] = neg_inf
                l[gg] = T.float32(0)
            for t in T.unroll(_TILE):
                pg[t] = kv_indices[kv_start + T.min(start + w * (tpw * _TILE) + t * tpw + sub, end - 1)]
            for it in T.serial(chunk // step):
                base = start + it * step + w * (tpw * _TILE)
                if base < end:  # warp-uniform, so the width-lpt shuffles below never diverge
                    # Issue all K and V gathers of the tile before using any of them. Tokens past the end re-read
                    # the sequence's last token (no branch, no other sequence's entry read) and are masked to p = 0.
                    for t in T.unroll(_TILE):
                        kraw[t * 8:t * 8 + 8] = k_cache[T.int64(pg[t]), 0, T.int64(h), T.Ramp(T.int64(li * 8), 1, 8)]
                        vraw[t * 8:t * 8 + 8] = v_cache[T.int64(pg[t]), 0, T.int64(h), T.Ramp(T.int64(li * 8), 1, 8)]
                    # Prefetch the next step's page numbers so their latency overlaps this step's math.
                    for t in T.unroll(_TILE):
                        pg[t] = kv_indices[kv_start + T.min(base + step + t * tpw + sub, end - 1)]
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
                    part_o[slot, h, gg, dd] = tmp[3]
                    if dd == 0:
                        part_ml[slot, h, gg, 0] = tmp[1]
                        part_ml[slot, h, gg, 1] = tmp[2]

    return gqa_decode_split


def _merge_kernel(hq, hkv, d, chunk, dtype):
    group = hq // hkv
    batch = T.dynamic("batch")
    slots = T.dynamic("slots")

    @T.function
    def gqa_decode_merge(kv_indptr: T.Tensor((batch + 1,), "int32"),
                         part_o: T.Tensor((slots, hkv, group, d), "float32"),
                         part_ml: T.Tensor((slots, hkv, group, 2), "float32"),
                         o: T.Tensor((batch, hq, d), dtype), lse: T.Tensor((batch, hq), "float32")):
        T.device_entry(launch=T.cuda.LaunchConfig(grid=(hq, batch), block=d))
        qh = T.cuda.block_idx("x")
        b = T.cuda.block_idx("y")
        dd = T.cuda.thread_idx("x")
        h = qh // group
        gg = qh % group
        first = kv_indptr[b] // chunk + b  # the sequence's chunks fill slots first, first + 1, ... (split_kv_slots)
        st = T.alloc_local((4,), "float32")
        st[0] = T.float32(-math.inf)
        st[1] = T.float32(0)
        st[2] = T.float32(0)
        for s in T.serial(T.ceildiv(kv_indptr[b + 1] - kv_indptr[b], chunk)):
            st[3] = T.max(st[0], part_ml[first + s, h, gg, 0])
            st[1] = st[1] * T.exp2(st[0] - st[3]) + part_ml[first + s, h, gg, 1] * T.exp2(
                part_ml[first + s, h, gg, 0] - st[3])
            st[2] = st[2] * T.exp2(st[0] - st[3]) + part_o[first + s, h, gg, dd] * T.exp2(
                part_ml[first + s, h, gg, 0] - st[3])
            st[0] = st[3]
        o[b, qh, dd] = T.cast(st[2] / st[1], dtype)
        if dd == 0:
            lse[b, qh] = st[0] + T.log2(st[1])

    return gqa_decode_merge


@functools.cache
def _compiled(hq, hkv, d, chunk, dtype, arch):
    return (build_cuda(_split_kernel(hq, hkv, d, chunk, dtype), arch),
            build_cuda(_merge_kernel(hq, hkv, d, chunk, dtype), arch))


def _cpu_kernel(hq, hkv, d, dtype):
    """Host (llvm) kernel: one parallel iteration per (sequence, query head), fp32 online softmax over the
    sequence's pages in kv_indices; pages not listed there are never read."""
    group = hq // hkv
    inv_ln2 = 1.0 / math.log(2.0)
    batch = T.dynamic("batch")
    tokens = T.dynamic("tokens")
    pages = T.dynamic("pages")

    @T.function
    def gqa_decode_cpu(q: T.Tensor((batch, hq, d), dtype), k_cache: T.Tensor((pages, 1, hkv, d), dtype),
                       v_cache: T.Tensor((pages, 1, hkv, d), dtype), kv_indptr: T.Tensor((batch + 1,), "int32"),
                       kv_indices: T.Tensor((tokens,), "int32"), sm_scale: T.float32,
                       o: T.Tensor((batch, hq, d), dtype), lse: T.Tensor((batch, hq), "float32")):
        for bq in T.parallel(batch * hq):
            b = bq // hq
            qh = bq % hq
            h = qh // group
            qf = T.alloc_local((d,), "float32")
            acc = T.alloc_local((d,), "float32")
            # st: running max, running sum, score, new max, rescale factor, p
            st = T.alloc_local((6,), "float32")
            for e in range(d):
                qf[e] = T.float32(q[b, qh, e]) * sm_scale
                acc[e] = T.float32(0)
            st[0] = T.float32(-math.inf)
            st[1] = T.float32(0)
            for t in T.serial(kv_indptr[b + 1] - kv_indptr[b]):
                pg = T.Cast("int64", kv_indices[kv_indptr[b] + t])
                st[2] = T.float32(0)
                for e in range(d):
                    st[2] = st[2] + qf[e] * T.float32(k_cache[pg, 0, h, e])
                st[3] = T.max(st[0], st[2])
                st[4] = T.exp(st[0] - st[3])
                st[5] = T.exp(st[2] - st[3])
                st[1] = st[1] * st[4] + st[5]
                for e in range(d):
                    acc[e] = acc[e] * st[4] + st[5] * T.float32(v_cache[pg, 0, h, e])
                st[0] = st[3]
            for e in range(d):
                o[b, qh, e] = T.cast(acc[e] / st[1], dtype)
            lse[b, qh] = (st[0] + T.log(st[1])) * T.float32(inv_ln2)

    return gqa_decode_cpu


@functools.cache
def _cpu_compiled(hq, hkv, d, dtype):
    return build_cpu(_cpu_kernel(hq, hkv, d, dtype))


def solve(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    if q.dtype not in (torch.bfloat16, torch.float16) or not q.dtype == k_cache.dtype == v_cache.dtype:
        raise TypeError("gqa decode tirx: q, k_cache and v_cache must all be bfloat16 (or all float16)")
    if not kv_indptr.dtype == kv_indices.dtype == torch.int32:
        raise TypeError("gqa decode tirx: kv_indptr and kv_indices must be int32")
    if k_cache.shape[1] != 1:
        raise ValueError(f"gqa decode tirx: page size must be 1, got {k_cache.shape[1]}")
    batch, hq, d = q.shape
    hkv = k_cache.shape[2]
    dtype = TIRX_DTYPES[q.dtype]
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
    kv_indptr, kv_indices = kv_indptr.contiguous(), kv_indices.contiguous()
    o = torch.empty((batch, hq, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, hq), dtype=torch.float32, device=q.device)
    if not q.is_cuda:
        _cpu_compiled(hq, hkv, d, dtype)(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale, o, lse)
        return o, lse
    tokens = kv_indices.numel()
    chunk = _chunk_len(tokens, batch, hkv)
    slots = split_kv_slots(tokens, batch, chunk)
    split_ex, merge_ex = _compiled(hq, hkv, d, chunk, dtype, gpu_arch(q.device))
    part_o = torch.empty((slots, hkv, hq // hkv, d), dtype=torch.float32, device=q.device)
    part_ml = torch.empty((slots, hkv, hq // hkv, 2), dtype=torch.float32, device=q.device)
    split_ex(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale, part_o, part_ml)
    merge_ex(kv_indptr, part_o, part_ml, o, lse)
    return o, lse


def compile_for(arch: str, sizes: list[dict]) -> None:
    """Both kernels at both chunk lengths for every head configuration, built with nvcc: batch, token, page and
    slot counts are dynamic."""
    for hq, hkv, d in {(s["q_heads"], s["kv_heads"], s["head_dim"]) for s in sizes}:
        for chunk in _CHUNKS:
            for ex in _compiled(hq, hkv, d, chunk, "bfloat16", arch):
                nvcc_build(ex, f"q_heads={hq}, kv_heads={hkv}, head_dim={d}, chunk={chunk}")
