"""Embedding + RMSNorm backward in TIRx: tokens sorted by id, then one pass that sums each id's rows in fp32.

Repeated ids are summed by a sort-by-id reduction, not fp32 atomics: atomics would need an fp32 copy of the whole
table (1 GiB to zero, then to read back and convert: 2.5 GiB of traffic where the bf16 output is 512 MiB) and would
add a row's tokens in whatever order they land. Here key = id * 2^32 + token sorts each id's tokens by position, and
one CTA sums a whole run of equal ids in order, so every output is one deterministic fp32 sum rounded once to bf16,
like index_add_ on the CPU.

Four launches. (1) A CTA sorts a tile of 2048 keys in shared memory (bitonic) and zeroes the row flags. (2) A key's
place in the sorted list is its place in its tile plus, for every other tile, the count of smaller keys (a binary
search); it also flags its row. (3) CTA c takes the runs that start in its share of the sorted list: per token it
computes d_h (x = h * rstd, g = grad * w, d_h = rstd * (g - x * mean(g * x))) and adds it to the run's sum, writing
the run's row in bf16 when the id changes, while the next token's rows are already loading; it accumulates its part
of grad * x for the weight gradient and writes the zero rows of its slice of the table. (4) The per-CTA weight
partials are summed in a fixed order. On the host (llvm) a serial pass over the tokens adds into an fp32 table."""
import functools

import torch
from tvm_tirx.script import tirx as T

from metakernelbench.suite.kits.common import gpu_arch
from metakernelbench.suite.kits.tirx import NO_FAST_MATH, build_cpu, build_cuda, nvcc_build

CPU_PATH = True
VOCAB_SIZE = 65536
_TILE = 2048  # keys sorted per CTA in shared memory (16 KB)
_LOG_TILE = 11
_SORT_THREADS = _TILE // 2  # one compare-exchange per thread per stage
_RANK_THREADS = 256
_CTAS_PER_SM = 2  # main-pass CTAs per SM: one wave, each sums about tokens / (2 * SMs) sorted tokens
_DW_COLS = 32  # weight-gradient reduction: 8 lanes x 4 columns ...
_DW_GROUPS = 32  # ... times 32 groups of partial rows per CTA
_PAD = 0x7FFFFFFFFFFFFFFF  # sorts after every real key
_LOW = 0xFFFFFFFF


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


def _sort_kernel(ids_dtype):
    n, tiles, vocab = T.dynamic("n"), T.dynamic("tiles"), T.dynamic("vocab")
    half = _SORT_THREADS

    @T.function
    def sort_tiles(ids: T.Tensor((n,), ids_dtype), tile_keys: T.Tensor((tiles * _TILE,), "int64"),
                   flags: T.Tensor((vocab,), "int32")):
        T.device_entry(launch=T.cuda.LaunchConfig(grid=tiles, block=half))
        b = T.cuda.block_idx("x")
        tid = T.cuda.thread_idx("x")
        s_keys = T.alloc_shared((_TILE,), "int64")
        for k in T.unroll(2):
            t = b * _TILE + k * half + tid
            s_keys[k * half + tid] = T.if_then_else(
                t < n, (T.Cast("int64", ids[t]) << T.int64(32)) | T.Cast("int64", t), T.int64(_PAD))
        for it in range(T.ceildiv(T.max(vocab - b * half - tid, 0), tiles * half)):
            flags[(it * tiles + b) * half + tid] = 0
        T.cuda.cta_sync()
        # Bitonic network: stage (2^k, 2^j), j = k-1 .. 0, compare-exchanges a and a + 2^j, ascending where a's
        # 2^k-block is even. One pair per thread per stage; the unrolled strides fold to constants.
        for k in T.unroll(1, _LOG_TILE + 1):
            for jj in T.unroll(_LOG_TILE):
                if jj < k:
                    stride = 1 << (k - 1 - jj)
                    a = (tid // stride) * (2 * stride) + tid % stride
                    x = s_keys[a]
                    y = s_keys[a + stride]
                    up = (a & (1 << k)) == 0
                    s_keys[a] = T.if_then_else(up, T.min(x, y), T.max(x, y))
                    s_keys[a + stride] = T.if_then_else(up, T.max(x, y), T.min(x, y))
                    T.cuda.cta_sync()
        for k in T.unroll(2):
            tile_keys[b * _TILE + k * half + tid] = s_keys[k * half + tid]

    return sort_tiles


def _rank_kernel():
    n, tiles, vocab = T.dynamic("n"), T.dynamic("tiles"), T.dynamic("vocab")

    @T.function
    def rank_keys(tile_keys: T.Tensor((tiles * _TILE,), "int64"), sorted_keys: T.Tensor((n,), "int64"),
                  flags: T.Tensor((vocab,), "int32")):
        T.device_entry(launch=T.cuda.LaunchConfig(grid=tiles * (_TILE // _RANK_THREADS), block=_RANK_THREADS))
        e = T.cuda.block_idx("x") * _RANK_THREADS + T.cuda.thread_idx("x")
        key = tile_keys[e]
        rank = T.alloc_local((2,), "int32")  # [0]: the rank; [1]: count of one other tile's keys below `key`
        if key != T.int64(_PAD):
            # Keys are distinct, so the ranks are a permutation of 0 .. n - 1.
            rank[0] = e % _TILE
            for other in range(tiles):
                if other != e // _TILE:
                    rank[1] = 0
                    for k in T.unroll(_LOG_TILE):
                        if tile_keys[other * _TILE + rank[1] + (_TILE >> (k + 1)) - 1] < key:
                            rank[1] = rank[1] + (_TILE >> (k + 1))
                    if tile_keys[other * _TILE + rank[1]] < key:
                        rank[1] = rank[1] + 1
                    rank[0] = rank[0] + rank[1]
            sorted_keys[rank[0]] = key
            flags[T.Cast("int32", key >> T.int64(32))] = 1

    return rank_keys


def _main_kernel(hidden):
    threads, iters = plan(hidden)
    warps = threads // 32
    lanes = 8 * iters  # columns per thread
    n, vocab, ctas = T.dynamic("n"), T.dynamic("vocab"), T.dynamic("ctas")
    inv_hidden = 1.0 / hidden  # a power of two's reciprocal is exact; otherwise the mean's own rounding

    @T.function
    def embedding_backward(grad: T.Tensor((n, hidden), "bfloat16", align=16),
                           hidden_states: T.Tensor((n, hidden), "float32", align=16),
                           rstd: T.Tensor((n,), "float32"), weight: T.Tensor((hidden,), "bfloat16", align=16),
                           sorted_keys: T.Tensor((n,), "int64"), flags: T.Tensor((vocab,), "int32"),
                           table: T.Tensor((vocab, hidden), "bfloat16", align=16),
                           partial: T.Tensor((ctas, hidden), "float32", align=16),
                           chunk: T.int32, rows: T.int32, steps: T.int32):
        T.device_entry(launch=T.cuda.LaunchConfig(grid=ctas, block=threads), backend_config=NO_FAST_MATH)
        c = T.cuda.block_idx("x")
        tid = T.cuda.thread_idx("x")
        warp = tid // 32
        lane = tid % 32
        s_red = T.alloc_shared((2 * warps,), "float32")
        s_flag = T.alloc_shared((threads,), "int32")
        # The run's sum and the weight-gradient part live in shared memory, private to each thread (element e of
        # thread t at e * threads + t: no bank conflicts), so the registers hold two tokens' rows.
        s_acc = T.alloc_shared((lanes * threads,), "float32")
        s_dw = T.alloc_shared((lanes * threads,), "float32")
        wv = T.alloc_local((lanes,), "bfloat16")
        g_cur = T.alloc_local((lanes,), "bfloat16")
        h_cur = T.alloc_local((lanes,), "float32")
        g_nxt = T.alloc_local((lanes,), "bfloat16")
        h_nxt = T.alloc_local((lanes,), "float32")
        out = T.alloc_local((lanes,), "bfloat16")
        keys = T.alloc_local((3,), "int64")  # the current sorted key and the next two
        rs = T.alloc_local((2,), "float32")  # their rstd
        f = T.alloc_local((3,), "float32")  # dot partial, total, mean
        q = T.alloc_local((2,), "int32")  # this CTA's sorted range [q[0], q[1])
        bound = T.alloc_local((2,), "int32")  # binary search lo, hi
        for i in T.unroll(iters):
            wv[i * 8 : i * 8 + 8] = weight[T.Ramp((tid + i * threads) * 8, 1, 8)]
        for e in T.unroll(lanes):
            s_acc[e * threads + tid] = T.float32(0)
            s_dw[e * threads + tid] = T.float32(0)
        # The runs whose first position lies in [c * chunk, (c + 1) * chunk): from the first run start at or after
        # c * chunk to the first at or after (c + 1) * chunk.
        for which in T.unroll(2):
            x0 = (c + which) * chunk
            q[which] = n
            if x0 < n:
                q[which] = x0
                if x0 > 0:
                    if (sorted_keys[x0 - 1] >> T.int64(32)) == (sorted_keys[x0] >> T.int64(32)):
                        bound[0] = x0
                        bound[1] = n
                        for _ in range(steps):
                            if bound[0] < bound[1]:
                                if sorted_keys[(bound[0] + bound[1]) // 2] < (
                                        ((sorted_keys[x0] >> T.int64(32)) + T.int64(1)) << T.int64(32)):
                                    bound[0] = (bound[0] + bound[1]) // 2 + 1
                                else:
                                    bound[1] = (bound[0] + bound[1]) // 2
                        q[which] = bound[0]
        if q[0] < q[1]:
            # Keys run two tokens ahead and rows one: the next token's loads never wait on its key.
            keys[0] = sorted_keys[q[0]]
            keys[1] = sorted_keys[T.min(q[0] + 1, q[1] - 1)]
            for i in T.unroll(iters):
                col = (tid + i * threads) * 8
                g_cur[i * 8 : i * 8 + 8] = grad[T.int64(keys[0] & T.int64(_LOW)), T.Ramp(T.int64(col), 1, 8)]
                h_cur[i * 8 : i * 8 + 4] = hidden_states[T.int64(keys[0] & T.int64(_LOW)), T.Ramp(T.int64(col), 1, 4)]
                h_cur[i * 8 + 4 : i * 8 + 8] = hidden_states[T.int64(keys[0] & T.int64(_LOW)),
                                                             T.Ramp(T.int64(col + 4), 1, 4)]
            rs[0] = rstd[T.Cast("int32", keys[0] & T.int64(_LOW))]
            for it in range(q[1] - q[0]):
                # The next token's rows load while this one is reduced; the last token re-loads itself, unused.
                for i in T.unroll(iters):
                    col = (tid + i * threads) * 8
                    g_nxt[i * 8 : i * 8 + 8] = grad[T.int64(keys[1] & T.int64(_LOW)), T.Ramp(T.int64(col), 1, 8)]
                    h_nxt[i * 8 : i * 8 + 4] = hidden_states[T.int64(keys[1] & T.int64(_LOW)),
                                                             T.Ramp(T.int64(col), 1, 4)]
                    h_nxt[i * 8 + 4 : i * 8 + 8] = hidden_states[T.int64(keys[1] & T.int64(_LOW)),
                                                                 T.Ramp(T.int64(col + 4), 1, 4)]
                rs[1] = rstd[T.Cast("int32", keys[1] & T.int64(_LOW))]
                keys[2] = sorted_keys[T.min(q[0] + it + 2, q[1] - 1)]
                f[0] = T.float32(0)
                for e in T.unroll(lanes):
                    f[0] = f[0] + T.float32(g_cur[e]) * T.float32(wv[e]) * (h_cur[e] * rs[0])
                # CTA sum of the dot, double-buffered by token parity so one barrier per token suffices.
                f[0] = T.cuda.warp_reduce(f[0], "sum", 32)
                if lane == 0:
                    s_red[(it % 2) * warps + warp] = f[0]
                T.cuda.cta_sync()
                f[1] = T.float32(0)
                for w in T.unroll(warps):
                    f[1] = f[1] + s_red[(it % 2) * warps + w]
                f[2] = f[1] * T.float32(inv_hidden)
                for e in T.unroll(lanes):
                    s_acc[e * threads + tid] = s_acc[e * threads + tid] + rs[0] * (
                        T.float32(g_cur[e]) * T.float32(wv[e]) - (h_cur[e] * rs[0]) * f[2])
                    s_dw[e * threads + tid] = s_dw[e * threads + tid] + T.float32(g_cur[e]) * (h_cur[e] * rs[0])
                if (q[0] + it + 1 == q[1]) or ((keys[1] >> T.int64(32)) != (keys[0] >> T.int64(32))):
                    for e in T.unroll(lanes):
                        out[e] = T.bfloat16(s_acc[e * threads + tid])
                        s_acc[e * threads + tid] = T.float32(0)
                    for i in T.unroll(iters):
                        table[keys[0] >> T.int64(32), T.Ramp(T.int64((tid + i * threads) * 8), 1, 8)] = \
                            out[T.Ramp(i * 8, 1, 8)]
                keys[0] = keys[1]
                keys[1] = keys[2]
                rs[0] = rs[1]
                for e in T.unroll(lanes):
                    g_cur[e] = g_nxt[e]
                    h_cur[e] = h_nxt[e]
        # This CTA's part of the weight gradient, summed in a fixed order by the last launch.
        for e in T.unroll(lanes):
            h_cur[e] = s_dw[e * threads + tid]
        for i in T.unroll(iters):
            col = (tid + i * threads) * 8
            partial[c, T.Ramp(col, 1, 4)] = h_cur[T.Ramp(i * 8, 1, 4)]
            partial[c, T.Ramp(col + 4, 1, 4)] = h_cur[T.Ramp(i * 8 + 4, 1, 4)]
        # The zero rows of this CTA's slice of the table: rows no token names.
        for e in T.unroll(8):
            out[e] = T.bfloat16(0)
        for it in range(T.ceildiv(T.max(T.min(c * rows + rows, vocab) - c * rows, 0), threads)):
            T.cuda.cta_sync()  # the previous batch of flags is consumed
            s_flag[tid] = T.if_then_else(c * rows + it * threads + tid < T.min(c * rows + rows, vocab),
                                         flags[T.min(c * rows + it * threads + tid, vocab - 1)], 1)
            T.cuda.cta_sync()
            for j in range(T.min(threads, T.min(c * rows + rows, vocab) - c * rows - it * threads)):
                if s_flag[j] == 0:
                    for i in T.unroll(iters):
                        table[T.int64(c * rows + it * threads + j), T.Ramp(T.int64((tid + i * threads) * 8), 1, 8)] = \
                            out[T.Ramp(0, 1, 8)]

    return embedding_backward


def _weight_kernel(hidden):
    ctas = T.dynamic("ctas")
    lanes = _DW_COLS // 4

    @T.function
    def weight_grad(partial: T.Tensor((ctas, hidden), "float32", align=16),
                    grad_weight: T.Tensor((hidden,), "bfloat16")):
        T.device_entry(launch=T.cuda.LaunchConfig(grid=-(-hidden // _DW_COLS), block=lanes * _DW_GROUPS),
                       backend_config=NO_FAST_MATH)
        tid = T.cuda.thread_idx("x")
        group = tid // lanes
        col = T.cuda.block_idx("x") * _DW_COLS + (tid % lanes) * 4
        s_sum = T.alloc_shared((_DW_GROUPS * _DW_COLS,), "float32")
        acc = T.alloc_local((4,), "float32")
        part = T.alloc_local((4,), "float32")
        for e in T.unroll(4):
            acc[e] = T.float32(0)
        if col < hidden:
            for it in range(T.ceildiv(T.max(ctas - group, 0), _DW_GROUPS)):
                part[0:4] = partial[group + it * _DW_GROUPS, T.Ramp(col, 1, 4)]
                for e in T.unroll(4):
                    acc[e] = acc[e] + part[e]
        for e in T.unroll(4):
            s_sum[group * _DW_COLS + (tid % lanes) * 4 + e] = acc[e]
        T.cuda.cta_sync()
        if tid < _DW_COLS:
            if T.cuda.block_idx("x") * _DW_COLS + tid < hidden:
                acc[0] = T.float32(0)
                for g in T.unroll(_DW_GROUPS):
                    acc[0] = acc[0] + s_sum[g * _DW_COLS + tid]
                grad_weight[T.cuda.block_idx("x") * _DW_COLS + tid] = T.bfloat16(acc[0])

    return weight_grad


def _cpu_kernel(hidden, ids_dtype):
    """Host (llvm) kernel: a serial pass over the tokens adds each d_h row into an fp32 table in token order."""
    n, vocab = T.dynamic("n"), T.dynamic("vocab")
    inv_hidden = 1.0 / hidden

    @T.function
    def embedding_backward_cpu(grad: T.Tensor((n, hidden), "bfloat16"),
                               hidden_states: T.Tensor((n, hidden), "float32"), rstd: T.Tensor((n,), "float32"),
                               weight: T.Tensor((hidden,), "bfloat16"), ids: T.Tensor((n,), ids_dtype),
                               table: T.Tensor((vocab, hidden), "bfloat16"),
                               grad_weight: T.Tensor((hidden,), "bfloat16"),
                               acc: T.Tensor((vocab, hidden), "float32")):
        for v in T.parallel(vocab):
            for j in range(hidden):
                acc[v, j] = T.float32(0)
        for t in range(n):
            st = T.alloc_local((2,), "float32")
            st[0] = T.float32(0)
            for j in range(hidden):
                st[0] = st[0] + T.float32(grad[t, j]) * T.float32(weight[j]) * (hidden_states[t, j] * rstd[t])
            st[1] = st[0] * T.float32(inv_hidden)
            for j in range(hidden):
                acc[ids[t], j] = acc[ids[t], j] + rstd[t] * (
                    T.float32(grad[t, j]) * T.float32(weight[j]) - (hidden_states[t, j] * rstd[t]) * st[1])
        for v in T.parallel(vocab):
            for j in range(hidden):
                table[v, j] = T.bfloat16(acc[v, j])
        for j in T.parallel(hidden):
            sw = T.alloc_local((1,), "float32")
            sw[0] = T.float32(0)
            for t in range(n):
                sw[0] = sw[0] + T.float32(grad[t, j]) * (hidden_states[t, j] * rstd[t])
            grad_weight[j] = T.bfloat16(sw[0])

    return embedding_backward_cpu


@functools.cache
def _kernels(hidden, ids_dtype, arch):
    """The four launches for one hidden size; token count, vocabulary and grid sizes stay dynamic."""
    return (build_cuda(_sort_kernel(ids_dtype), arch), build_cuda(_rank_kernel(), arch),
            build_cuda(_main_kernel(hidden), arch), build_cuda(_weight_kernel(hidden), arch))


@functools.cache
def _cpu_compiled(hidden, ids_dtype):
    return build_cpu(_cpu_kernel(hidden, ids_dtype))


@functools.cache
def _sm_count(device):
    return torch.cuda.get_device_properties(device).multi_processor_count


def solve(grad_output, input_ids, hidden_states_fp32, rstd, norm_weight):
    hidden = grad_output.shape[-1]
    tokens = input_ids.numel()
    if grad_output.dtype != torch.bfloat16 or hidden_states_fp32.dtype != torch.float32 \
            or rstd.dtype != torch.float32 or norm_weight.dtype != torch.bfloat16:
        raise TypeError("embedding_rmsnorm_backward tirx: bf16 grad_output and norm_weight, fp32 hidden and rstd")
    if input_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError("embedding_rmsnorm_backward tirx: input_ids must be int32 or int64")
    if grad_output.numel() != tokens * hidden or hidden_states_fp32.shape != grad_output.shape \
            or rstd.numel() != tokens or norm_weight.numel() != hidden:
        raise ValueError("embedding_rmsnorm_backward tirx: shapes [B, S, H], ids [B, S], rstd [B, S, 1], weight [H]")
    device = grad_output.device
    grad = grad_output.reshape(tokens, hidden).contiguous()
    hid = hidden_states_fp32.reshape(tokens, hidden).contiguous()
    ids = input_ids.reshape(tokens).contiguous()
    rstd = rstd.reshape(tokens).contiguous()
    weight = norm_weight.contiguous()
    ids_dtype = "int64" if ids.dtype == torch.int64 else "int32"
    grad_embedding = torch.empty((VOCAB_SIZE, hidden), dtype=torch.bfloat16, device=device)
    grad_weight = torch.empty((hidden,), dtype=torch.bfloat16, device=device)
    if not grad.is_cuda:
        acc = torch.empty((VOCAB_SIZE, hidden), dtype=torch.float32)
        _cpu_compiled(hidden, ids_dtype)(grad, hid, rstd, weight, ids, grad_embedding, grad_weight, acc)
        return grad_embedding, grad_weight
    plan(hidden)
    tiles = max(1, -(-tokens // _TILE))
    ctas = _CTAS_PER_SM * _sm_count(device)
    chunk = max(1, -(-tokens // ctas))
    rows = -(-VOCAB_SIZE // ctas)
    keys = torch.empty((tiles * _TILE + tokens,), dtype=torch.int64, device=device)
    tile_keys, sorted_keys = keys[:tiles * _TILE], keys[tiles * _TILE:]
    flags = torch.empty((VOCAB_SIZE,), dtype=torch.int32, device=device)
    partial = torch.empty((ctas, hidden), dtype=torch.float32, device=device)
    sort, rank, main, weight_grad = _kernels(hidden, ids_dtype, gpu_arch(device))
    sort(ids, tile_keys, flags)
    rank(tile_keys, sorted_keys, flags)
    main(grad, hid, rstd, weight, sorted_keys, flags, grad_embedding, partial, chunk, rows, tokens.bit_length())
    weight_grad(partial, grad_weight)
    return grad_embedding, grad_weight


def compile_for(arch: str, sizes: list[dict]) -> None:
    for hidden in {dims["hidden"] for dims in sizes}:  # tokens are dynamic
        for index, kernel in enumerate(_kernels(hidden, "int64", arch)):
            nvcc_build(kernel, f"hidden={hidden} kernel {index}")
