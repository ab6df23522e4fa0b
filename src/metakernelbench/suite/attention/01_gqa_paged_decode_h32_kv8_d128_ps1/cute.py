"""Split-K paged GQA decode on bf16 mma.sync over CSR page lists: fp32 online softmax per chunk, base-2 LSE merge."""
import functools

import torch

import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda

from metakernelbench.suite.kits.common import gpu_arch, split_kv_slots
from metakernelbench.suite.kits.cute import compile_kernel, fake_ptr, gmem_ptr, stream_of

THREADS = 128
WARPS = THREADS // 32
TILE = 16  # tokens per warp per iteration: two n-tiles of the QKᵀ mma, one k-tile of the PV mma
SEARCH = 4  # kv_indptr entries per lane per round of the sequence search: 128 sequences per round trip
CHUNKS = (128, 256)  # tokens per CTA: the two shape classes compiled per head configuration
LOG2E = 1.4426950408889634
NEG_INF = float("-inf")
_MMA = (
    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{$w0}, {$w1}, {$w2}, {$w3}}, "
    "{{$r0}, {$r1}, {$r2}, {$r3}}, {{$r4}, {$r5}}, {{$r6}, {$r7}, {$r8}, {$r9}};"
)
# Rounds (x0, x1) to a bf16x2 pair (x0 in the low half) and also returns the bf16x2 rounding residual, so that
# P·V computed as hi·V + lo·V keeps fp32-level accuracy on the bf16 tensor cores.
_SPLIT = """{
.reg .b32 h, l, t0, t1;
.reg .f32 f0, f1;
cvt.rn.bf16x2.f32 h, {$r1}, {$r0};
shl.b32 t0, h, 16;
and.b32 t1, h, 0xffff0000;
mov.b32 f0, t0;
mov.b32 f1, t1;
sub.f32 f0, {$r0}, f0;
sub.f32 f1, {$r1}, f1;
cvt.rn.bf16x2.f32 l, f1, f0;
mov.b32 {$w0}, h;
mov.b32 {$w1}, l;
}"""


def _mma(a, b, c):
    """D = A·B + C for one m16n8k16 bf16 tile (PTX fragment order: a 4 regs, b 2 regs, c 4 fp32)."""
    return cute.arch.inline_ptx(_MMA, write_only_types=[cutlass.Float32] * 4, read_only_args=[*a, *b, *c])


def _split_bf16x2(x0, x1):
    return cute.arch.inline_ptx(_SPLIT, write_only_types=[cutlass.Int32] * 2, read_only_args=[x0, x1])


@cute.kernel
def _chunk_kernel(
    mQ: cute.Tensor,  # (4, D/8, Hq, B) int32 words = bf16 pairs
    mK: cute.Tensor,  # (4, D/8, Hkv, pages) int32 words
    mV: cute.Tensor,
    mIndptr: cute.Tensor,  # (B + 1,)
    mIdx: cute.Tensor,  # (tokens,)
    mOp: cute.Tensor,  # (D, slots, Hq) fp32: chunk output, already normalised
    mLse: cute.Tensor,  # (slots, Hq) fp32: chunk log2-sum-exp2
    batch: cutlass.Int32,
    sm_scale: cutlass.Float32,
    D: cutlass.Constexpr,
    G: cutlass.Constexpr,
    C: cutlass.Constexpr,
):
    # Warp-level layout (lane = 4g + t). S = Q·Kᵀ uses M = query heads (rows >= G are zero), N = 8 tokens,
    # K = head dims; the dims are permuted identically for Q and K so that every thread feeds the B operand
    # from 16-byte loads of K rows: thread (g, t) loads chunks t + 4j of token g, and chunk t + 4j supplies
    # k-steps 2j and 2j + 1. Oᵀ = Vᵀ·Pᵀ uses M = head dims, N = query heads, K = 16 tokens: the S accumulator
    # fragment is exactly the Pᵀ B fragment, and thread (g, t) builds the Vᵀ A fragment by byte-permuting
    # 16-byte loads of chunks g + 8i of tokens 2t, 2t+1, 2t+8, 2t+9. M-tile 4i + w covers dims 8(g+8i) + 2w
    # (row g) and 8(g+8i) + 2w + 1 (row g + 8).
    KJ = D // 32
    VI = D // 64
    STEP = WARPS * TILE
    tid, _, _ = cute.arch.thread_idx()
    slot, kvh, _ = cute.arch.block_idx()
    warp = tid // 32
    lane = tid % 32
    g = lane // 4
    t = lane % 4
    qscale = sm_scale * LOG2E  # scores in the log2 domain so the softmax uses ex2

    sPage = cute.make_tensor(cute.arch.alloc_smem(cutlass.Int32, C, 16), cute.make_layout(C))
    sAcc = cute.make_tensor(
        cute.arch.alloc_smem(cutlass.Float32, D * G * WARPS, 16),
        cute.make_layout((8, D // 8, G, WARPS), stride=(1, 8, D, D * G)),
    )
    sM = cute.make_tensor(cute.arch.alloc_smem(cutlass.Float32, G * WARPS, 16), cute.make_layout((G, WARPS)))
    sL = cute.make_tensor(cute.arch.alloc_smem(cutlass.Float32, G * WARPS, 16), cute.make_layout((G, WARPS)))

    # The slot's sequence b is the last whose first slot kv_indptr[b] // C + b (see split_kv_slots) is <= slot:
    # every warp counts those sequences by ballots, the same count in every lane, so no barrier is needed.
    count = cutlass.Int32(0)
    for base in range(0, batch, 32 * SEARCH):
        for u in cutlass.range_constexpr(SEARCH):
            i = base + 32 * u + lane
            first_slot = mIndptr[cutlass.min(i, batch - 1)] // C + i
            count = count + cute.arch.popc(cute.arch.vote_ballot_sync((i < batch) & (first_slot <= slot)))
    b = count - 1
    kv_start = mIndptr[b]
    seq_len = mIndptr[b + 1] - kv_start
    start = (slot - (kv_start // C + b)) * C
    if start < seq_len:  # past the sequence's last chunk: an empty slot
        n = cutlass.min(seq_len - start, C)
        # Stage this chunk's page ids once; slots past the sequence end reuse its first page (their scores are
        # masked), so the K/V loads below need no branches and no other sequence's entry is read.
        first = mIdx[kv_start + start]
        for i in range(tid, C, THREADS):
            page = first
            if i < n:
                page = mIdx[kv_start + start + i]
            sPage[i] = page
        cute.arch.sync_threads()

        zero = cutlass.Int32(0)
        fzero = cutlass.Float32(0.0)
        rQ = cute.make_rmem_tensor((4, KJ), cutlass.Int32)
        rQ.fill(0)
        if g < G:
            for j in cutlass.range_constexpr(KJ):
                cute.autovec_copy(mQ[None, t + 4 * j, kvh * G + g, b], rQ[None, j])
        rO = cute.make_rmem_tensor((4, D // 16), cutlass.Float32)
        rO.fill(0.0)
        rStat = cute.make_rmem_tensor((2,), cutlass.Float32)  # running max (log2 domain) and partial sum
        rStat[0] = NEG_INF
        rStat[1] = 0.0
        rK = cute.make_rmem_tensor((4, KJ, 2), cutlass.Int32)
        rV = cute.make_rmem_tensor((4, VI, 4), cutlass.Int32)
        rS = cute.make_rmem_tensor((2, 2), cutlass.Float32)

        for it in range((n + STEP - 1) // STEP):
            t0 = it * STEP + warp * TILE
            # All 16 K and V loads of the tile are issued before any math.
            for nt in cutlass.range_constexpr(2):
                page = cutlass.Int64(sPage[t0 + 8 * nt + g])
                for j in cutlass.range_constexpr(KJ):
                    cute.autovec_copy(mK[None, t + 4 * j, kvh, page], rK[None, j, nt])
            for r in cutlass.range_constexpr(4):
                page = cutlass.Int64(sPage[t0 + 2 * t + r % 2 + 8 * (r // 2)])
                for i in cutlass.range_constexpr(VI):
                    cute.autovec_copy(mV[None, g + 8 * i, kvh, page], rV[None, i, r])

            for nt in cutlass.range_constexpr(2):
                c0 = fzero
                c1 = fzero
                for s in cutlass.range_constexpr(D // 16):
                    j = s // 2
                    hl = s % 2
                    c0, c1, _, _ = _mma(
                        (rQ[2 * hl, j], zero, rQ[2 * hl + 1, j], zero),
                        (rK[2 * hl, j, nt], rK[2 * hl + 1, j, nt]),
                        (c0, c1, fzero, fzero),
                    )
                # Thread (g, t) now holds head g's scores for tokens 8nt + 2t and 8nt + 2t + 1 of the tile.
                rS[0, nt] = cutlass.Float32(cutlass.select_(t0 + 8 * nt + 2 * t < n, c0 * qscale, NEG_INF))
                rS[1, nt] = cutlass.Float32(cutlass.select_(t0 + 8 * nt + 2 * t + 1 < n, c1 * qscale, NEG_INF))

            m_old = rStat[0]
            m_tile = cute.arch.fmax(cute.arch.fmax(rS[0, 0], rS[1, 0]), cute.arch.fmax(rS[0, 1], rS[1, 1]))
            m_tile = cute.arch.fmax(m_tile, cute.arch.shuffle_sync_bfly(m_tile, offset=1))
            m_tile = cute.arch.fmax(m_tile, cute.arch.shuffle_sync_bfly(m_tile, offset=2))
            m_new = cute.arch.fmax(m_old, m_tile)
            # A head that has only seen masked slots keeps m = -inf; shift by 0 then so exp2 gives 0, not NaN.
            m_ref = cutlass.Float32(cutlass.select_(m_new == NEG_INF, 0.0, m_new))
            alpha = cute.arch.exp2(m_old - m_ref)
            p00 = cute.arch.exp2(rS[0, 0] - m_ref)
            p10 = cute.arch.exp2(rS[1, 0] - m_ref)
            p01 = cute.arch.exp2(rS[0, 1] - m_ref)
            p11 = cute.arch.exp2(rS[1, 1] - m_ref)
            rStat[1] = rStat[1] * alpha + ((p00 + p10) + (p01 + p11))
            rStat[0] = m_new
            hi0, lo0 = _split_bf16x2(p00, p10)
            hi1, lo1 = _split_bf16x2(p01, p11)
            # Oᵀ columns are heads 2t and 2t + 1, whose statistics live in lanes 8t and 8t + 4.
            a_even = cute.arch.shuffle_sync(alpha, 8 * t)
            a_odd = cute.arch.shuffle_sync(alpha, 8 * t + 4)
            for mt in cutlass.range_constexpr(D // 16):
                i = mt // 4
                w = mt % 4
                v0 = cutlass.Int32(cute.arch.prmt(rV[w, i, 0], rV[w, i, 1], 0x5410))
                v1 = cutlass.Int32(cute.arch.prmt(rV[w, i, 0], rV[w, i, 1], 0x7632))
                v2 = cutlass.Int32(cute.arch.prmt(rV[w, i, 2], rV[w, i, 3], 0x5410))
                v3 = cutlass.Int32(cute.arch.prmt(rV[w, i, 2], rV[w, i, 3], 0x7632))
                acc = _mma(
                    (v0, v1, v2, v3),
                    (hi0, hi1),
                    (rO[0, mt] * a_even, rO[1, mt] * a_odd, rO[2, mt] * a_even, rO[3, mt] * a_odd),
                )
                acc = _mma((v0, v1, v2, v3), (lo0, lo1), acc)
                for e in cutlass.range_constexpr(4):
                    rO[e, mt] = acc[e]

        # Combine the warps of this CTA through shared memory.
        l = rStat[1]
        l = l + cute.arch.shuffle_sync_bfly(l, offset=1)
        l = l + cute.arch.shuffle_sync_bfly(l, offset=2)
        if t == 0 and g < G:
            sM[g, warp] = rStat[0]
            sL[g, warp] = l
        rOut = cute.make_rmem_tensor((8,), cutlass.Float32)
        for x in cutlass.range_constexpr(2):
            if 2 * t + x < G:
                for i in cutlass.range_constexpr(VI):
                    for w in cutlass.range_constexpr(4):
                        rOut[2 * w] = rO[x, 4 * i + w]
                        rOut[2 * w + 1] = rO[2 + x, 4 * i + w]
                    sAcc[None, g + 8 * i, 2 * t + x, warp].store(rOut.load())
        cute.arch.sync_threads()
        for o in range(tid, G * D, THREADS):
            h = o // D
            d = o % D
            m = sM[h, 0]
            for j in cutlass.range_constexpr(1, WARPS):
                m = cute.arch.fmax(m, sM[h, j])
            lsum = cutlass.Float32(0.0)
            acc = cutlass.Float32(0.0)
            for j in cutlass.range_constexpr(WARPS):
                wgt = cute.arch.exp2(sM[h, j] - m)
                lsum = lsum + sL[h, j] * wgt
                acc = acc + sAcc[d % 8, d // 8, h, j] * wgt
            mOp[d, slot, kvh * G + h] = acc / lsum
            if d == 0:
                mLse[slot, kvh * G + h] = m + cute.math.log2(lsum)


@cute.kernel
def _merge_kernel(mOp: cute.Tensor, mLse: cute.Tensor, mIndptr: cute.Tensor, mO: cute.Tensor, mLseOut: cute.Tensor,
                  C: cutlass.Constexpr):
    d, _, _ = cute.arch.thread_idx()
    hq, b, _ = cute.arch.block_idx()
    kv_start = mIndptr[b]
    first = kv_start // C + b  # the sequence's chunks fill slots first, first + 1, ... (split_kv_slots)
    splits = (mIndptr[b + 1] - kv_start + C - 1) // C
    m = cutlass.Float32(NEG_INF)
    for s in range(splits):
        m = cute.arch.fmax(m, mLse[first + s, hq])
    l = cutlass.Float32(0.0)
    acc = cutlass.Float32(0.0)
    for s in range(splits):
        w = cute.arch.exp2(mLse[first + s, hq] - m)
        l = l + w
        acc = acc + w * mOp[d, first + s, hq]
    mO[d, hq, b] = (acc / l).to(mO.element_type)
    if d == 0:
        mLseOut[hq, b] = m + cute.math.log2(l)


@cute.jit
def _decode(
    pQ: cute.Pointer,
    pK: cute.Pointer,
    pV: cute.Pointer,
    pIndptr: cute.Pointer,
    pIdx: cute.Pointer,
    pOp: cute.Pointer,
    pLse: cute.Pointer,
    pO: cute.Pointer,
    pLseOut: cute.Pointer,
    batch: cutlass.Int32,
    tokens: cutlass.Int32,
    pages: cutlass.Int32,
    slots: cutlass.Int32,
    sm_scale: cutlass.Float32,
    Hq: cutlass.Constexpr,
    Hkv: cutlass.Constexpr,
    D: cutlass.Constexpr,
    C: cutlass.Constexpr,
    stream: cuda.CUstream,
):
    w = D // 2  # int32 words per row
    mQ = cute.make_tensor(pQ, cute.make_layout((4, D // 8, Hq, batch), stride=(1, 4, w, Hq * w)))
    mK = cute.make_tensor(pK, cute.make_layout((4, D // 8, Hkv, pages), stride=(1, 4, w, Hkv * w)))
    mV = cute.make_tensor(pV, cute.make_layout((4, D // 8, Hkv, pages), stride=(1, 4, w, Hkv * w)))
    mIndptr = cute.make_tensor(pIndptr, cute.make_layout((batch + 1,)))
    mIdx = cute.make_tensor(pIdx, cute.make_layout((tokens,)))
    mOp = cute.make_tensor(pOp, cute.make_layout((D, slots, Hq), stride=(1, Hq * D, D)))
    mLse = cute.make_tensor(pLse, cute.make_layout((slots, Hq), stride=(Hq, 1)))
    mO = cute.make_tensor(pO, cute.make_layout((D, Hq, batch), stride=(1, D, Hq * D)))
    mLseOut = cute.make_tensor(pLseOut, cute.make_layout((Hq, batch), stride=(1, Hq)))
    _chunk_kernel(mQ, mK, mV, mIndptr, mIdx, mOp, mLse, batch, sm_scale, D, Hq // Hkv, C).launch(
        grid=(slots, Hkv, 1), block=(THREADS, 1, 1), stream=stream
    )
    _merge_kernel(mOp, mLse, mIndptr, mO, mLseOut, C).launch(grid=(Hq, batch, 1), block=(D, 1, 1), stream=stream)


def _chunk_len(tokens, batch, kv_heads):
    """Tokens per CTA: 256 keeps the partial-output traffic small; 128 when that leaves too few CTAs."""
    return 256 if kv_heads * split_kv_slots(tokens, batch, 256) >= 1024 else 128


@functools.cache
def _compiled(q_heads, kv_heads, head_dim, chunk, arch):
    if head_dim % 64 or q_heads % kv_heads or q_heads // kv_heads > 8 or chunk % (WARPS * TILE):
        raise ValueError(f"gqa decode cute: unsupported head_dim={head_dim}, q_heads={q_heads}, kv_heads={kv_heads}")
    words = fake_ptr(torch.int32, 16)
    return compile_kernel(
        _decode, words, words, words, fake_ptr(torch.int32, 4), fake_ptr(torch.int32, 4),
        fake_ptr(torch.float32, 16), fake_ptr(torch.float32, 4), fake_ptr(torch.bfloat16, 16),
        fake_ptr(torch.float32, 4), cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1),
        cutlass.Float32(1.0), q_heads, kv_heads, head_dim, chunk, arch=arch,
    )


def solve(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    if not q.dtype == k_cache.dtype == v_cache.dtype == torch.bfloat16:
        raise TypeError("gqa decode cute: q, k_cache and v_cache must be bfloat16")
    if not kv_indptr.dtype == kv_indices.dtype == torch.int32:
        raise TypeError("gqa decode cute: kv_indptr and kv_indices must be int32")
    if k_cache.shape[1] != 1 or not all(t.is_contiguous() for t in (q, k_cache, v_cache, kv_indptr, kv_indices)):
        raise ValueError("gqa decode cute: needs page size 1 and contiguous q, caches and index tensors")
    batch, q_heads, d = q.shape
    pages, _, kv_heads, _ = k_cache.shape
    tokens = kv_indices.numel()
    chunk = _chunk_len(tokens, batch, kv_heads)
    slots = split_kv_slots(tokens, batch, chunk)
    o_part = torch.empty((slots, q_heads, d), dtype=torch.float32, device=q.device)
    lse_part = torch.empty((slots, q_heads), dtype=torch.float32, device=q.device)
    o = torch.empty_like(q)
    lse = torch.empty((batch, q_heads), dtype=torch.float32, device=q.device)
    kernel = _compiled(q_heads, kv_heads, d, chunk, gpu_arch(q.device))
    # q and the caches go in as int32 words (bf16 pairs): the mma fragments are built from raw words.
    kernel(
        gmem_ptr(q.view(torch.int32), 16), gmem_ptr(k_cache.view(torch.int32), 16),
        gmem_ptr(v_cache.view(torch.int32), 16), gmem_ptr(kv_indptr, 4), gmem_ptr(kv_indices, 4),
        gmem_ptr(o_part, 16), gmem_ptr(lse_part, 4), gmem_ptr(o, 16), gmem_ptr(lse, 4),
        batch, tokens, pages, slots, sm_scale, stream_of(q),
    )
    return o, lse


def compile_for(arch: str, sizes: list[dict]) -> None:
    """Both chunk lengths for every head configuration: batch, token and page counts are dynamic."""
    for heads in {(s["q_heads"], s["kv_heads"], s["head_dim"]) for s in sizes}:
        for chunk in CHUNKS:
            _compiled(*heads, chunk, arch)
