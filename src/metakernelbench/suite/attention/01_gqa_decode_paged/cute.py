"""Split-K paged GQA decode on bf16 mma.sync: K/V rows gathered into fragments, fp32 online softmax, LSE merge."""
import functools
import math

import torch

import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass.cute.runtime import make_fake_stream, make_ptr

THREADS = 128
WARPS = THREADS // 32
TILE = 16  # tokens per warp per iteration: two n-tiles of the QKᵀ mma, one k-tile of the PV mma
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
    mBT: cute.Tensor,  # (ctx, B)
    mLen: cute.Tensor,  # (B,)
    mOp: cute.Tensor,  # (D, S, Hq, B) fp32: chunk output, already normalised
    mLse: cute.Tensor,  # (S, Hq, B) fp32: chunk log2-sum-exp2
    D: cutlass.Constexpr,
    G: cutlass.Constexpr,
    C: cutlass.Constexpr,
    qscale: cutlass.Constexpr,
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
    split, kvh, b = cute.arch.block_idx()
    warp = tid // 32
    lane = tid % 32
    g = lane // 4
    t = lane % 4

    sPage = cute.make_tensor(cute.arch.alloc_smem(cutlass.Int32, C, 16), cute.make_layout(C))
    sAcc = cute.make_tensor(
        cute.arch.alloc_smem(cutlass.Float32, D * G * WARPS, 16),
        cute.make_layout((8, D // 8, G, WARPS), stride=(1, 8, D, D * G)),
    )
    sM = cute.make_tensor(cute.arch.alloc_smem(cutlass.Float32, G * WARPS, 16), cute.make_layout((G, WARPS)))
    sL = cute.make_tensor(cute.arch.alloc_smem(cutlass.Float32, G * WARPS, 16), cute.make_layout((G, WARPS)))

    seq_len = mLen[b]
    start = split * C
    if start < seq_len:
        n = cutlass.min(seq_len - start, C)
        # Stage this chunk's page ids once; slots past the sequence end reuse its first page (their scores are
        # masked), so the K/V loads below need no branches and padding entries of block_table are never read.
        first = mBT[start, b]
        for i in range(tid, C, THREADS):
            page = first
            if i < n:
                page = mBT[start + i, b]
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
            mOp[d, split, kvh * G + h, b] = acc / lsum
            if d == 0:
                mLse[split, kvh * G + h, b] = m + cute.math.log2(lsum)


@cute.kernel
def _merge_kernel(mOp: cute.Tensor, mLse: cute.Tensor, mLen: cute.Tensor, mO: cute.Tensor, C: cutlass.Constexpr):
    d, _, _ = cute.arch.thread_idx()
    hq, b, _ = cute.arch.block_idx()
    splits = (mLen[b] + C - 1) // C
    m = cutlass.Float32(NEG_INF)
    for s in range(splits):
        m = cute.arch.fmax(m, mLse[s, hq, b])
    l = cutlass.Float32(0.0)
    acc = cutlass.Float32(0.0)
    for s in range(splits):
        w = cute.arch.exp2(mLse[s, hq, b] - m)
        l = l + w
        acc = acc + w * mOp[d, s, hq, b]
    mO[d, hq, b] = (acc / l).to(mO.element_type)


@cute.jit
def _decode(
    pQ: cute.Pointer,
    pK: cute.Pointer,
    pV: cute.Pointer,
    pBT: cute.Pointer,
    pLen: cute.Pointer,
    pOp: cute.Pointer,
    pLse: cute.Pointer,
    pO: cute.Pointer,
    batch: cutlass.Int32,
    pages: cutlass.Int32,
    stream: cuda.CUstream,
    Hq: cutlass.Constexpr,
    Hkv: cutlass.Constexpr,
    D: cutlass.Constexpr,
    ctx: cutlass.Constexpr,
    C: cutlass.Constexpr,
):
    S = (ctx + C - 1) // C
    w = D // 2  # int32 words per row
    mQ = cute.make_tensor(pQ, cute.make_layout((4, D // 8, Hq, batch), stride=(1, 4, w, Hq * w)))
    mK = cute.make_tensor(pK, cute.make_layout((4, D // 8, Hkv, pages), stride=(1, 4, w, Hkv * w)))
    mV = cute.make_tensor(pV, cute.make_layout((4, D // 8, Hkv, pages), stride=(1, 4, w, Hkv * w)))
    mBT = cute.make_tensor(pBT, cute.make_layout((ctx, batch), stride=(1, ctx)))
    mLen = cute.make_tensor(pLen, cute.make_layout((batch,)))
    mOp = cute.make_tensor(pOp, cute.make_layout((D, S, Hq, batch), stride=(1, D, S * D, Hq * S * D)))
    mLse = cute.make_tensor(pLse, cute.make_layout((S, Hq, batch), stride=(1, S, Hq * S)))
    mO = cute.make_tensor(pO, cute.make_layout((D, Hq, batch), stride=(1, D, Hq * D)))
    qscale = LOG2E / math.sqrt(D)  # scores in the log2 domain so the softmax uses ex2
    _chunk_kernel(mQ, mK, mV, mBT, mLen, mOp, mLse, D, Hq // Hkv, C, qscale).launch(
        grid=(S, Hkv, batch), block=(THREADS, 1, 1), stream=stream
    )
    _merge_kernel(mOp, mLse, mLen, mO, C).launch(grid=(Hq, batch, 1), block=(D, 1, 1), stream=stream)


def _chunk_len(batch, kv_heads, ctx):
    """Tokens per CTA: 256 keeps the partial-output traffic small; 128 when that leaves too few CTAs."""
    return 256 if batch * kv_heads * -(-ctx // 256) >= 1024 else 128


@functools.lru_cache(maxsize=None)
def _compiled(q_heads, kv_heads, head_dim, ctx, chunk, arch):
    if head_dim % 64 or q_heads % kv_heads or q_heads // kv_heads > 8 or chunk % (WARPS * TILE):
        raise ValueError(f"unsupported head_dim={head_dim}, q_heads={q_heads}, kv_heads={kv_heads}")

    def ptr(t, align):
        return make_ptr(t, 0, cute.AddressSpace.gmem, assumed_align=align)

    return cute.compile(
        _decode,
        ptr(cutlass.Int32, 16), ptr(cutlass.Int32, 16), ptr(cutlass.Int32, 16), ptr(cutlass.Int32, 4),
        ptr(cutlass.Int32, 4), ptr(cutlass.Float32, 16), ptr(cutlass.Float32, 4), ptr(cutlass.BFloat16, 16),
        cutlass.Int32(1), cutlass.Int32(1), make_fake_stream(),
        q_heads, kv_heads, head_dim, ctx, chunk,
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


def solve(q, k_cache, v_cache, block_table, seq_lens):
    if not q.dtype == k_cache.dtype == v_cache.dtype == torch.bfloat16:
        raise ValueError("q, k_cache and v_cache must be bfloat16")
    batch, q_heads, d = q.shape
    pages, kv_heads, _ = k_cache.shape
    ctx = block_table.shape[1]
    chunk = _chunk_len(batch, kv_heads, ctx)
    splits = -(-ctx // chunk)
    o_part = torch.empty((batch, q_heads, splits, d), dtype=torch.float32, device=q.device)
    lse = torch.empty((batch, q_heads, splits), dtype=torch.float32, device=q.device)
    o = torch.empty_like(q)
    kernel = _compiled(q_heads, kv_heads, d, ctx, chunk, _arch(q.device))
    # q and the caches are passed as int32 words (bf16 pairs): the mma fragments are built from raw words.
    kernel(
        _ptr(q, cutlass.Int32, 16), _ptr(k_cache, cutlass.Int32, 16), _ptr(v_cache, cutlass.Int32, 16),
        _ptr(block_table.to(torch.int32), cutlass.Int32, 4), _ptr(seq_lens.to(torch.int32), cutlass.Int32, 4),
        _ptr(o_part, cutlass.Float32, 16), _ptr(lse, cutlass.Float32, 4), _ptr(o, cutlass.BFloat16, 16),
        batch, pages, cuda.CUstream(torch.cuda.current_stream(q.device).cuda_stream),
    )
    return o


def compile_for(arch: str, sizes: list[dict]) -> None:
    """Compile the decode kernels for every GPU size."""
    for s in sizes:
        _compiled(s["q_heads"], s["kv_heads"], s["head_dim"], s["max_context"],
                  _chunk_len(s["batch"], s["kv_heads"], s["max_context"]), arch)
