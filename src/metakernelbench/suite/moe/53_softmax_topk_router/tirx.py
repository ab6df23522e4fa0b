"""Top-k router in TIRx: per token, k rounds of lane-local + shuffle argmax over ordered integer keys, then softmax."""
import functools

import torch
import tvm_tirx
from tvm_tirx.backend.config import parse_backend_config
from tvm_tirx.backend.cuda.compiler import compile_source
from tvm_tirx.script import tirx as T

# Exact expf and division, no flush-to-zero: the default build passes --use_fast_math.
_NO_FAST_MATH = {"cuda": {"nvcc": [], "nvrtc": []}}
_THREADS = 128
_NO_INDEX = 1 << 20  # index of "no candidate"; larger than any expert id, so it loses every tie


def _lanes(experts, tokens, sms):
    """Lanes per token: at most 32 logits per lane (fewest instructions per token), but more lanes,
    hence shorter per-warp instruction chains, while there are too few warps to fill the GPU."""
    lanes = 2
    while lanes < 32 and lanes * 32 < experts:
        lanes *= 2
    while lanes < 32 and lanes < experts and tokens * lanes < sms * 8 * 32:
        lanes *= 2
    return lanes


def _layout(experts, lanes):
    """Floats per load and loads per lane."""
    vec = 4 if experts % (4 * lanes) == 0 else 1
    return vec, -(-experts // (lanes * vec))


def _kernel(experts, top_k, lanes):
    if not 1 <= top_k <= experts:
        raise ValueError(f"top_k={top_k} must be in [1, experts={experts}]")
    vec, loads = _layout(experts, lanes)
    per_lane = loads * vec
    slots = -(-top_k // lanes)  # winners each lane keeps: round r goes to lane r % lanes
    butterfly_steps = lanes.bit_length() - 1
    full_mask = 0xFFFFFFFF
    n = T.dynamic("n")

    @T.function
    def softmax_topk(
        L: T.Tensor((n, experts), T.float32, align=16),
        WT: T.Tensor((n, top_k), T.float32),
        ID: T.Tensor((n, top_k), T.int32),
    ):
        T.device_entry(
            launch=T.cuda.LaunchConfig(grid=T.ceildiv(n * lanes, _THREADS), block=_THREADS),
            backend_config=_NO_FAST_MATH,
        )
        gtid = T.cuda.block_idx("x") * _THREADS + T.cuda.thread_idx("x")
        tok = gtid // lanes
        lane = gtid % lanes
        # Tail tokens still join every shuffle (full-warp masks), so clamp their row instead of branching.
        row = T.min(tok, n - 1)
        lane_off = lane * vec
        raw = T.alloc_local((per_lane,), T.float32)
        key = T.alloc_local((per_lane,), T.uint32)
        win_key = T.alloc_local((slots,), T.uint32)
        win_id = T.alloc_local((slots,), T.int32)
        # Lane `lane` holds vectors lane, lane + lanes, ...: each load instruction reads whole 32-byte sectors,
        # and the lane's experts (s * lanes + lane) * vec + c increase with (s, c).
        for s in T.unroll(loads):
            if T.constexpr(vec > 1):
                raw[s * vec : s * vec + vec] = L[row, T.Ramp((s * lanes + lane) * vec, 1, vec)]
            else:
                if s * lanes + lane < experts:
                    raw[s] = L[row, s * lanes + lane]
                else:
                    raw[s] = T.float32(0.0)
        for s in T.unroll(loads):
            for c in T.unroll(vec):
                if (s * lanes + lane) * vec + c < experts:
                    # -0.0 becomes +0.0 (torch ties them); the key is monotone in the float value,
                    # and 0 (below -inf's key) marks "taken" or "absent".
                    x = raw[s * vec + c]
                    bits = T.reinterpret(T.if_then_else(x == T.float32(0.0), T.float32(0.0), x), ty="uint32")
                    key[s * vec + c] = bits ^ (
                        T.reinterpret(T.shift_right(T.reinterpret(bits, ty="int32"), 31), ty="uint32")
                        | T.uint32(0x80000000)
                    )
                else:
                    key[s * vec + c] = T.uint32(0)
        best_key: T.uint32 = 0
        best_id: T.int32 = 0
        top_key: T.uint32 = 0
        rel: T.int32 = -1
        for r in T.unroll(top_k):
            best_key = T.uint32(0)
            best_id = _NO_INDEX
            # Drop the previous winner (its owner lane matches rel) and rescan in increasing expert order,
            # so a strict > keeps the lowest index among equal keys.
            for s in T.unroll(loads):
                for c in T.unroll(vec):
                    p = s * lanes * vec + c
                    if rel == p:
                        key[s * vec + c] = T.uint32(0)
                    if key[s * vec + c] > best_key:
                        best_key = key[s * vec + c]
                        best_id = p
            best_id = best_id + lane_off
            for b in T.unroll(butterfly_steps):
                o_key = T.cuda.__shfl_xor_sync(T.uint32(full_mask), best_key, lanes >> (b + 1), 32)
                o_id = T.cuda.__shfl_xor_sync(T.uint32(full_mask), best_id, lanes >> (b + 1), 32)
                if (o_key > best_key) | ((o_key == best_key) & (o_id < best_id)):
                    best_key = o_key
                    best_id = o_id
            if r == 0:
                top_key = best_key
            if lane == r % lanes:
                win_key[r // lanes] = best_key
                win_id[r // lanes] = best_id
            rel = best_id - lane_off
        top = _key_to_float(top_key)
        e = T.alloc_local((slots,), T.float32)
        total: T.float32 = 0.0
        for j in T.unroll(slots):
            if j * lanes + lane < top_k:
                e[j] = T.exp(_key_to_float(win_key[j]) - top)
                total = total + e[j]
        total = T.cuda.warp_sum(total, lanes)
        if tok < n:
            for j in T.unroll(slots):
                if j * lanes + lane < top_k:
                    WT[tok, j * lanes + lane] = e[j] / total
                    ID[tok, j * lanes + lane] = win_id[j]

    return softmax_topk


def _key_to_float(k):
    return T.reinterpret(
        T.if_then_else(k >= T.uint32(0x80000000), k ^ T.uint32(0x80000000), ~k), ty="float32"
    )


@functools.cache
def _compiled(experts, top_k, lanes, arch):
    target = tvm_tirx.target.Target({"kind": "cuda", "arch": arch})
    return tvm_tirx.tirx.compile(_kernel(experts, top_k, lanes), target=target)


def _arch(device):
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


@functools.cache
def _cpu_compiled(experts, top_k):
    """Host (llvm) kernel: one parallel iteration per token; round r takes the largest logit that comes after the
    previous winner in the order (descending value, then ascending index), so ties go to the lower index."""
    if not 1 <= top_k <= experts:
        raise ValueError(f"top_k={top_k} must be in [1, experts={experts}]")
    n = T.dynamic("n")

    @T.function
    def softmax_topk_cpu(
        L: T.Tensor((n, experts), T.float32),
        WT: T.Tensor((n, top_k), T.float32),
        ID: T.Tensor((n, top_k), T.int32),
    ):
        for tok in T.parallel(n):
            # st: best value, previous winner's value, running sum; ix: best id, previous winner's id
            st = T.alloc_local((3,), T.float32)
            ix = T.alloc_local((2,), T.int32)
            ix[1] = -1
            st[1] = T.float32(0)
            for r in range(top_k):
                ix[0] = -1
                st[0] = T.float32(0)
                for e in range(experts):
                    x = L[tok, e]
                    after = (ix[1] < 0) | (x < st[1]) | ((x == st[1]) & (e > ix[1]))
                    if after & ((ix[0] < 0) | (x > st[0])):
                        st[0] = x
                        ix[0] = e
                WT[tok, r] = st[0]
                ID[tok, r] = ix[0]
                st[1] = st[0]
                ix[1] = ix[0]
            st[1] = WT[tok, 0]
            st[2] = T.float32(0)
            for r in range(top_k):
                WT[tok, r] = T.exp(WT[tok, r] - st[1])
                st[2] = st[2] + WT[tok, r]
            for r in range(top_k):
                WT[tok, r] = WT[tok, r] / st[2]

    return tvm_tirx.tirx.compile(softmax_topk_cpu, target="llvm")


def _solve_cpu(logits, top_k):
    if logits.dtype != torch.float32 or logits.dim() != 2:
        raise TypeError("softmax_topk tirx kernel takes 2-D fp32 logits")
    top_k = int(top_k)
    tokens, experts = logits.shape
    logits = logits.contiguous()
    weights = torch.empty((tokens, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((tokens, top_k), dtype=torch.int32, device=logits.device)
    if tokens > 0:
        _cpu_compiled(experts, top_k)(logits, weights, ids)
    return weights, ids


def solve(logits, top_k):
    if not logits.is_cuda:
        return _solve_cpu(logits, top_k)
    if logits.dtype != torch.float32 or logits.dim() != 2:
        raise TypeError("softmax_topk tirx kernel takes 2-D fp32 logits")
    top_k = int(top_k)
    tokens, experts = logits.shape
    logits = logits.contiguous()
    if tokens * max(experts, 32) >= 2**31:  # element offsets and thread ids (<= 32 lanes a token) are int32
        raise ValueError("too many tokens for the kernel's 32-bit indexing")
    weights = torch.empty((tokens, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((tokens, top_k), dtype=torch.int32, device=logits.device)
    if tokens > 0:
        sms = torch.cuda.get_device_properties(logits.device).multi_processor_count
        lanes = _lanes(experts, tokens, sms)
        _compiled(experts, top_k, lanes, _arch(logits.device))(logits, weights, ids)
    return weights, ids


def _nvcc_build(ex, what):
    """Build the device code of `ex` now with nvcc (solve's NVRTC build happens lazily at the first launch)."""
    for mod in ex.mod.imports:
        config = parse_backend_config(mod.inspect_source("backend_config"))
        config["cuda"]["compiler"] = "nvcc"
        if not compile_source(mod.inspect_source("cuda"), config).binary:
            raise RuntimeError(f"nvcc produced no device binary for {what}")


def compile_for(arch: str) -> None:
    """Compile the kernels solve launches at the full and odd sizes (32768 and 3001 tokens, 128 experts, top 8;
    lanes as chosen on a 132-SM H200) to device binaries for `arch`."""
    for lanes in sorted({_lanes(128, tokens, 132) for tokens in (32768, 3001)}):
        _nvcc_build(_compiled(128, 8, lanes, arch), f"lanes={lanes}")
