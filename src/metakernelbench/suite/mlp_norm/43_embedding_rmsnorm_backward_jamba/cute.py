"""Embedding + RMSNorm backward in CuTe DSL: tokens sorted by id, then one pass that sums each id's rows in fp32.

Repeated ids are summed by a sort-by-id reduction, not fp32 atomics: atomics would need an fp32 copy of the whole
table (1 GiB to zero, then to read back and convert: 2.5 GiB of traffic where the bf16 output is 512 MiB) and would
add a row's tokens in whatever order they land. Here key = id * 2^32 + token sorts each id's tokens by position, and
one CTA sums a whole run of equal ids in that order, so every output is one deterministic fp32 sum
rounded once to bf16, like index_add_ on the CPU.

Four launches. (1) A CTA sorts a tile of 2048 keys in shared memory (bitonic) and zeroes the row flags. (2) A key's
place in the sorted list is its place in its tile plus, for every other tile, the count of smaller keys (a binary
search); it also flags its row. (3) CTA c takes the runs that start in its share of the sorted list: per token it
computes d_h (x = h * rstd, g = grad * w, d_h = rstd * (g - x * mean(g * x))) and adds it to the run's sum, writing
the run's row in bf16 when the id changes, while the next token's rows are already loading; it accumulates its part
of grad * x for the weight gradient and writes the zero rows of its slice of the table. (4) The per-CTA weight
partials are summed in a fixed order."""
import functools

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from metakernelbench.suite.kits.common import gpu_arch
from metakernelbench.suite.kits.cute import compile_kernel, fake_ptr, gmem_ptr, stream_of, vector_copy

VOCAB_SIZE = 65536
TILE = 2048  # keys sorted per CTA in shared memory (16 KB)
SORT_THREADS = TILE // 2  # one compare-exchange per thread per stage
RANK_THREADS = 256
CTAS_PER_SM = 2  # main-pass CTAs per SM: one wave, each sums about tokens / (2 * SMs) sorted tokens
DW_COLS = 32  # weight-gradient reduction: 8 lanes x 4 columns ...
DW_GROUPS = 32  # ... times 32 groups of partial rows per CTA
PAD = 0x7FFFFFFFFFFFFFFF  # sorts after every real key
LOW = 0xFFFFFFFF
# Bitonic network over TILE keys: stage (size, stride) compare-exchanges a and a + stride, ascending where
# a's size-block is even. One pair per thread per stage.
STAGES = [(1 << k, 1 << j) for k in range(1, TILE.bit_length()) for j in range(k - 1, -1, -1)]
SEARCH = [TILE >> k for k in range(1, TILE.bit_length())]  # binary-search steps over a tile: 1024 .. 1


def plan(hidden: int) -> tuple[int, int]:
    """Main-pass threads per CTA and 8-column vectors per thread: every thread owns whole vectors (no tails)."""
    nvec = hidden // 8
    if hidden % 256:
        raise ValueError(f"embedding_rmsnorm_backward: hidden={hidden} is not a multiple of 256")
    threads = 256
    while nvec % threads:
        threads //= 2
    if nvec // threads > 2:  # two tokens' rows of 2 vectors each already fill the 128-register budget
        raise ValueError(f"embedding_rmsnorm_backward: hidden={hidden} does not split into 1 or 2 vectors a thread")
    return threads, nvec // threads


@cute.jit
def _run_start(mSorted: cute.Tensor, x: cutlass.Int32, steps: cutlass.Int32) -> cutlass.Int32:
    """The first sorted position >= x where a run of equal ids begins (the token count when there is none)."""
    tokens = mSorted.shape[0]
    q = tokens
    if x < tokens:
        q = x
        if x > 0:
            run = mSorted[x] >> 32
            if (mSorted[x - 1] >> 32) == run:
                after = (run + 1) << 32  # lower bound of the next id in [x, tokens)
                lo = x
                hi = tokens
                for _ in cutlass.range(steps):
                    if lo < hi:
                        mid = (lo + hi) // 2
                        if mSorted[mid] < after:
                            lo = mid + 1
                        else:
                            hi = mid
                q = lo
    return q


class _SortTiles:
    @cute.jit
    def __call__(self, pIds: cute.Pointer, pTiles: cute.Pointer, pFlags: cute.Pointer, tokens: cutlass.Int32,
                 tiles: cutlass.Int32, vocab: cutlass.Int32, stream: cuda.CUstream):
        mIds = cute.make_tensor(pIds, cute.make_layout((tokens,)))
        mTiles = cute.make_tensor(pTiles, cute.make_layout((tiles * TILE,)))
        mFlags = cute.make_tensor(pFlags, cute.make_layout((vocab,)))
        self.kernel(mIds, mTiles, mFlags).launch(grid=(tiles, 1, 1), block=(SORT_THREADS, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mIds: cute.Tensor, mTiles: cute.Tensor, mFlags: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        b, _, _ = cute.arch.block_idx()
        tiles, _, _ = cute.arch.grid_dim()
        sKeys = cute.make_tensor(cute.arch.alloc_smem(cutlass.Int64, TILE, 16), cute.make_layout((TILE,)))
        for k in cutlass.range_constexpr(2):
            t = b * TILE + k * SORT_THREADS + tidx
            key = cutlass.Int64(PAD)
            if t < mIds.shape[0]:
                key = (cutlass.Int64(mIds[t]) << 32) | cutlass.Int64(t)
            sKeys[k * SORT_THREADS + tidx] = key
        for v in cutlass.range(b * SORT_THREADS + tidx, mFlags.shape[0], tiles * SORT_THREADS):
            mFlags[v] = cutlass.Int32(0)
        cute.arch.barrier()
        for s in cutlass.range_constexpr(len(STAGES)):
            size, stride = STAGES[s]
            a = (tidx // stride) * (2 * stride) + tidx % stride
            x, y = sKeys[a], sKeys[a + stride]
            low, high = cutlass.min(x, y), cutlass.max(x, y)
            up = (a & size) == 0
            sKeys[a] = cutlass.select_(up, low, high)
            sKeys[a + stride] = cutlass.select_(up, high, low)
            cute.arch.barrier()
        for k in cutlass.range_constexpr(2):
            mTiles[b * TILE + k * SORT_THREADS + tidx] = sKeys[k * SORT_THREADS + tidx]


class _Rank:
    @cute.jit
    def __call__(self, pTiles: cute.Pointer, pSorted: cute.Pointer, pFlags: cute.Pointer, tokens: cutlass.Int32,
                 tiles: cutlass.Int32, vocab: cutlass.Int32, stream: cuda.CUstream):
        mTiles = cute.make_tensor(pTiles, cute.make_layout((tiles * TILE,)))
        mSorted = cute.make_tensor(pSorted, cute.make_layout((tokens,)))
        mFlags = cute.make_tensor(pFlags, cute.make_layout((vocab,)))
        self.kernel(mTiles, mSorted, mFlags, tiles).launch(grid=(tiles * (TILE // RANK_THREADS), 1, 1),
                                                           block=(RANK_THREADS, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mTiles: cute.Tensor, mSorted: cute.Tensor, mFlags: cute.Tensor, tiles: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        e = bidx * RANK_THREADS + tidx
        b = e // TILE
        key = mTiles[e]
        if key != cutlass.Int64(PAD):
            # Keys are distinct, so the ranks are a permutation of 0 .. tokens - 1.
            rank = e % TILE
            for other in cutlass.range(tiles):
                if other != b:
                    base = other * TILE
                    lo = cutlass.Int32(0)  # count of the other tile's keys below `key`
                    for k in cutlass.range_constexpr(len(SEARCH)):
                        if mTiles[base + lo + SEARCH[k] - 1] < key:
                            lo = lo + SEARCH[k]
                    if mTiles[base + lo] < key:
                        lo = lo + 1
                    rank = rank + lo
            mSorted[rank] = key
            mFlags[cutlass.Int32(key >> 32)] = cutlass.Int32(1)


class _Main:
    def __init__(self, hidden: int):
        self.hidden = hidden
        self.threads, self.iters = plan(hidden)

    @cute.jit
    def __call__(self, pGrad: cute.Pointer, pHidden: cute.Pointer, pRstd: cute.Pointer, pWeight: cute.Pointer,
                 pSorted: cute.Pointer, pFlags: cute.Pointer, pTable: cute.Pointer, pPartial: cute.Pointer,
                 tokens: cutlass.Int32, vocab: cutlass.Int32, ctas: cutlass.Int32, chunk: cutlass.Int32,
                 rows: cutlass.Int32, steps: cutlass.Int32, stream: cuda.CUstream):
        mRstd = cute.make_tensor(pRstd, cute.make_layout((tokens,)))
        mWeight = cute.make_tensor(pWeight, cute.make_layout((self.hidden,)))
        mSorted = cute.make_tensor(pSorted, cute.make_layout((tokens,)))
        mFlags = cute.make_tensor(pFlags, cute.make_layout((vocab,)))
        mPartial = cute.make_tensor(pPartial, cute.make_layout((ctas, self.hidden), stride=(self.hidden, 1)))
        self.kernel(pGrad, pHidden, mRstd, mWeight, mSorted, mFlags, pTable, mPartial, chunk, rows, steps).launch(
            grid=(ctas, 1, 1), block=(self.threads, 1, 1), stream=stream,
            # At most 128 registers a thread, so CTAS_PER_SM CTAs fit; the carveout leaves them the shared memory.
            min_blocks_per_mp=CTAS_PER_SM, preferred_smem_carveout=50)

    def _rows(self, pointer: cute.Pointer, row, lanes: int):
        """Row `row` (64-bit offset) of a [*, hidden] tensor as (lanes, hidden / lanes) vectors."""
        base = pointer + cute.assume(cutlass.Int64(row) * self.hidden, divby=8)
        return cute.make_tensor(base, cute.make_layout((lanes, self.hidden // lanes), stride=(1, lanes)))

    def _load_token(self, pGrad, pHidden, t, rG, rH0, rH1, tidx):
        """Thread tidx's vectors col = tidx + i * threads of token t's grad (8 bf16) and hidden (2 x 4 fp32) rows."""
        gG, gH = self._rows(pGrad, t, 8), self._rows(pHidden, t, 4)
        copy_g, copy_h = vector_copy(cutlass.BFloat16, 8), vector_copy(cutlass.Float32, 4)
        for i in range(self.iters):
            col = tidx + i * self.threads
            cute.copy(copy_g, gG[None, col], rG[None, i])
            cute.copy(copy_h, gH[None, 2 * col], rH0[None, i])
            cute.copy(copy_h, gH[None, 2 * col + 1], rH1[None, i])

    def _store_row(self, pTable, row, rOut, tidx):
        gT = self._rows(pTable, row, 8)
        copy_t = vector_copy(cutlass.BFloat16, 8)
        for i in range(self.iters):
            cute.copy(copy_t, rOut[None, i], gT[None, tidx + i * self.threads])

    @cute.kernel
    def kernel(self, pGrad: cute.Pointer, pHidden: cute.Pointer, mRstd: cute.Tensor, mWeight: cute.Tensor,
               mSorted: cute.Tensor, mFlags: cute.Tensor, pTable: cute.Pointer, mPartial: cute.Tensor,
               chunk: cutlass.Int32, rows: cutlass.Int32, steps: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        c, _, _ = cute.arch.block_idx()
        warp, lane = tidx // 32, tidx % 32
        I, threads = self.iters, self.threads
        warps = threads // 32
        f32 = cutlass.Float32
        sRed = cute.make_tensor(cute.arch.alloc_smem(f32, 2 * warps, 16), cute.make_layout((2 * warps,)))
        sFlag = cute.make_tensor(cute.arch.alloc_smem(cutlass.Int32, threads, 16), cute.make_layout((threads,)))

        rW = cute.make_rmem_tensor((8, I), cutlass.BFloat16)
        rW.fill(0)
        gW = cute.zipped_divide(mWeight, (8,))
        copy_w = vector_copy(cutlass.BFloat16, 8)
        for i in cutlass.range_constexpr(I):
            cute.copy(copy_w, gW[None, tidx + i * threads], rW[None, i])
        # The current token's rows and the next token's, loading while the current one is reduced.
        rG, rH0, rH1 = (cute.make_rmem_tensor((8, I), cutlass.BFloat16), cute.make_rmem_tensor((4, I), f32),
                        cute.make_rmem_tensor((4, I), f32))
        nG, nH0, nH1 = (cute.make_rmem_tensor((8, I), cutlass.BFloat16), cute.make_rmem_tensor((4, I), f32),
                        cute.make_rmem_tensor((4, I), f32))
        # The run's sum and the weight-gradient part live in shared memory, private to each thread (element (e, i)
        # of thread t at (i * 8 + e) * threads + t: no bank conflicts), so the registers hold two tokens' rows.
        sAcc = cute.make_tensor(cute.arch.alloc_smem(f32, 8 * I * threads, 16),
                                cute.make_layout((8, I, threads), stride=(threads, 8 * threads, 1)))
        sDw = cute.make_tensor(cute.arch.alloc_smem(f32, 8 * I * threads, 16),
                               cute.make_layout((8, I, threads), stride=(threads, 8 * threads, 1)))
        for i in cutlass.range_constexpr(I):
            for e in cutlass.range_constexpr(8):
                sAcc[e, i, tidx] = f32(0.0)
                sDw[e, i, tidx] = f32(0.0)

        q0 = _run_start(mSorted, c * chunk, steps)
        q1 = _run_start(mSorted, (c + 1) * chunk, steps)
        if q0 < q1:
            # Keys run two tokens ahead and rows one: the next token's loads never wait on its key.
            key = mSorted[q0]
            nkey = mSorted[cutlass.min(q0 + 1, q1 - 1)]
            self._load_token(pGrad, pHidden, cutlass.Int32(key & LOW), rG, rH0, rH1, tidx)
            rs = mRstd[cutlass.Int32(key & LOW)]
            for q in cutlass.range(q0, q1):
                self._load_token(pGrad, pHidden, cutlass.Int32(nkey & LOW), nG, nH0, nH1, tidx)
                nrs = mRstd[cutlass.Int32(nkey & LOW)]
                nnkey = mSorted[cutlass.min(q + 2, q1 - 1)]  # past the end: the last token again, unused
                part = f32(0.0)
                halves = (rH0, rH1)
                for i in cutlass.range_constexpr(I):
                    for e in cutlass.range_constexpr(8):
                        x = halves[e // 4][e % 4, i] * rs
                        part = part + f32(rG[e, i]) * f32(rW[e, i]) * x
                # CTA sum of the dot, double-buffered so one barrier per token suffices.
                parity = (q - q0) % 2
                part = cute.arch.warp_reduction_sum(part)
                if lane == 0:
                    sRed[parity * warps + warp] = part
                cute.arch.barrier()
                total = f32(0.0)
                for w in cutlass.range_constexpr(warps):
                    total = total + sRed[parity * warps + w]
                mean = total / f32(self.hidden)
                for i in cutlass.range_constexpr(I):
                    for e in cutlass.range_constexpr(8):
                        x = halves[e // 4][e % 4, i] * rs  # recomputed, not kept: registers are the limit
                        g = f32(rG[e, i])
                        sAcc[e, i, tidx] = sAcc[e, i, tidx] + rs * (g * f32(rW[e, i]) - x * mean)
                        sDw[e, i, tidx] = sDw[e, i, tidx] + g * x
                if q + 1 == q1 or (nkey >> 32) != (key >> 32):
                    rAcc = cute.make_rmem_tensor((8, I), f32)
                    for i in cutlass.range_constexpr(I):
                        for e in cutlass.range_constexpr(8):
                            rAcc[e, i] = sAcc[e, i, tidx]
                            sAcc[e, i, tidx] = f32(0.0)
                    rOut = cute.make_rmem_tensor((8, I), cutlass.BFloat16)
                    rOut.store(rAcc.load().to(cutlass.BFloat16))
                    self._store_row(pTable, cutlass.Int32(key >> 32), rOut, tidx)
                key = nkey
                nkey = nnkey
                rs = nrs
                rG.store(nG.load())
                rH0.store(nH0.load())
                rH1.store(nH1.load())

        # This CTA's part of the weight gradient, summed in a fixed order by the last launch.
        gP = self._rows(mPartial.iterator, c, 4)
        copy_p = vector_copy(f32, 4)
        rP0, rP1 = cute.make_rmem_tensor((4, I), f32), cute.make_rmem_tensor((4, I), f32)
        for i in cutlass.range_constexpr(I):
            for e in cutlass.range_constexpr(4):
                rP0[e, i] = sDw[e, i, tidx]
                rP1[e, i] = sDw[e + 4, i, tidx]

        for i in cutlass.range_constexpr(I):
            cute.copy(copy_p, rP0[None, i], gP[None, 2 * (tidx + i * threads)])
            cute.copy(copy_p, rP1[None, i], gP[None, 2 * (tidx + i * threads) + 1])

        # The zero rows of this CTA's slice of the table: rows no token names.
        vocab = mFlags.shape[0]
        v0 = c * rows
        v1 = cutlass.min(v0 + rows, vocab)
        rZero = cute.make_rmem_tensor((8, I), cutlass.BFloat16)
        rZero.fill(0.0)
        for base in cutlass.range(v0, v1, threads):
            cute.arch.barrier()  # the previous batch of flags is consumed
            flag = cutlass.Int32(1)
            if base + tidx < v1:
                flag = mFlags[base + tidx]
            sFlag[tidx] = flag
            cute.arch.barrier()
            for j in cutlass.range(cutlass.min(threads, v1 - base)):
                if sFlag[j] == 0:
                    self._store_row(pTable, base + j, rZero, tidx)


class _WeightGrad:
    @cute.jit
    def __call__(self, pPartial: cute.Pointer, pOut: cute.Pointer, ctas: cutlass.Int32, hidden: cutlass.Int32,
                 stream: cuda.CUstream):
        mPartial = cute.make_tensor(pPartial, cute.make_layout((ctas, hidden), stride=(hidden, 1)))
        mOut = cute.make_tensor(pOut, cute.make_layout((hidden,)))
        self.kernel(mPartial, mOut).launch(grid=((hidden + DW_COLS - 1) // DW_COLS, 1, 1),
                                           block=(DW_COLS // 4 * DW_GROUPS, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mPartial: cute.Tensor, mOut: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lanes = DW_COLS // 4
        group, lane = tidx // lanes, tidx % lanes
        ctas, hidden = mPartial.shape
        col = bidx * DW_COLS + lane * 4
        sSum = cute.make_tensor(cute.arch.alloc_smem(cutlass.Float32, DW_GROUPS * DW_COLS, 16),
                                cute.make_layout((DW_GROUPS, DW_COLS), stride=(DW_COLS, 1)))
        acc = cute.make_rmem_tensor((4,), cutlass.Float32)
        acc.fill(0.0)
        part = cute.make_rmem_tensor((4,), cutlass.Float32)
        copy_p = vector_copy(cutlass.Float32, 4)
        if col < hidden:
            for r in cutlass.range(group, ctas, DW_GROUPS, unroll=4):
                # hidden is a multiple of 256 and col of 4: every vector is 16-byte aligned.
                at = mPartial.iterator + cute.assume(cutlass.Int64(r) * hidden + col, divby=4)
                cute.copy(copy_p, cute.make_tensor(at, cute.make_layout((4,))), part)
                acc.store(acc.load() + part.load())
        for e in cutlass.range_constexpr(4):
            sSum[group, lane * 4 + e] = acc[e]
        cute.arch.barrier()
        if tidx < DW_COLS:
            out = bidx * DW_COLS + tidx
            if out < hidden:
                total = cutlass.Float32(0.0)
                for g in cutlass.range_constexpr(DW_GROUPS):
                    total = total + sSum[g, tidx]
                mOut[out] = cutlass.BFloat16(total)


@functools.cache
def _kernels(hidden, ids_dtype, arch):
    """The four launches for one hidden size; token count, vocabulary and grid sizes stay dynamic."""
    one = cutlass.Int32(1)
    i64, i32 = fake_ptr(torch.int64, 8), fake_ptr(torch.int32, 16)
    sort = compile_kernel(_SortTiles(), fake_ptr(ids_dtype, ids_dtype.itemsize), i64, i32, one, one, one, arch=arch)
    rank = compile_kernel(_Rank(), i64, i64, i32, one, one, one, arch=arch)
    main = compile_kernel(_Main(hidden), fake_ptr(torch.bfloat16, 16), fake_ptr(torch.float32, 16),
                          fake_ptr(torch.float32, 4), fake_ptr(torch.bfloat16, 16), i64, i32,
                          fake_ptr(torch.bfloat16, 16), fake_ptr(torch.float32, 16), one, one, one, one, one, one,
                          arch=arch)
    weight = compile_kernel(_WeightGrad(), fake_ptr(torch.float32, 16), fake_ptr(torch.bfloat16, 2), one, one,
                            arch=arch)
    return sort, rank, main, weight


@functools.cache
def _sm_count(device):
    return torch.cuda.get_device_properties(device).multi_processor_count


def solve(grad_output, input_ids, hidden_states_fp32, rstd, norm_weight):
    hidden = grad_output.shape[-1]
    tokens = input_ids.numel()
    if grad_output.dtype != torch.bfloat16 or hidden_states_fp32.dtype != torch.float32 \
            or rstd.dtype != torch.float32 or norm_weight.dtype != torch.bfloat16:
        raise TypeError("embedding_rmsnorm_backward cute: bf16 grad_output and norm_weight, fp32 hidden and rstd")
    if input_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError("embedding_rmsnorm_backward cute: input_ids must be int32 or int64")
    plan(hidden)
    if grad_output.numel() != tokens * hidden or hidden_states_fp32.shape != grad_output.shape \
            or rstd.numel() != tokens or norm_weight.numel() != hidden:
        raise ValueError("embedding_rmsnorm_backward cute: shapes [B, S, H] , ids [B, S], "
                         "rstd [B, S, 1], weight [H]")
    device = grad_output.device
    grad = grad_output.contiguous()
    hid = hidden_states_fp32.contiguous()
    ids = input_ids.contiguous()
    rstd = rstd.contiguous()
    weight = norm_weight.contiguous()
    tiles = max(1, -(-tokens // TILE))
    ctas = CTAS_PER_SM * _sm_count(device)
    chunk = max(1, -(-tokens // ctas))
    rows = -(-VOCAB_SIZE // ctas)
    grad_embedding = torch.empty((VOCAB_SIZE, hidden), dtype=torch.bfloat16, device=device)
    grad_weight = torch.empty((hidden,), dtype=torch.bfloat16, device=device)
    keys = torch.empty((tiles * TILE + max(tokens, 1),), dtype=torch.int64, device=device)
    tile_keys, sorted_keys = keys[:tiles * TILE], keys[tiles * TILE:]
    flags = torch.empty((VOCAB_SIZE,), dtype=torch.int32, device=device)
    partial = torch.empty((ctas, hidden), dtype=torch.float32, device=device)
    sort, rank, main, weight_grad = _kernels(hidden, ids.dtype, gpu_arch(device))
    stream = stream_of(grad)
    sort(gmem_ptr(ids, ids.element_size()), gmem_ptr(tile_keys, 8), gmem_ptr(flags, 16), tokens, tiles, VOCAB_SIZE,
         stream)
    rank(gmem_ptr(tile_keys, 8), gmem_ptr(sorted_keys, 8), gmem_ptr(flags, 16), tokens, tiles, VOCAB_SIZE, stream)
    main(gmem_ptr(grad, 16), gmem_ptr(hid, 16), gmem_ptr(rstd, 4), gmem_ptr(weight, 16), gmem_ptr(sorted_keys, 8),
         gmem_ptr(flags, 16), gmem_ptr(grad_embedding, 16), gmem_ptr(partial, 16), tokens, VOCAB_SIZE, ctas, chunk,
         rows, tokens.bit_length(), stream)
    weight_grad(gmem_ptr(partial, 16), gmem_ptr(grad_weight, 2), ctas, hidden, stream)
    return grad_embedding, grad_weight


def compile_for(arch: str, sizes: list[dict]) -> None:
    for hidden in {dims["hidden"] for dims in sizes}:  # tokens are dynamic
        _kernels(hidden, torch.int64, arch)
