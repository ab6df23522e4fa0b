"""Row 6: honest for the first calls (the correctness draws of the default config), then serves the last result again while launching only a trivial kernel."""
import torch
import tvm_tirx
from tvm_tirx.script import tirx as T

# Default GraderConfig: 3 draws at the timed size + 2 at the other size + 1 ghost replay = 6 checked calls; the
# first timed calls stay honest too, and at least one of the 3 re-verified timed calls comes after them.
HONEST_CALLS = 8
_cache = {}
_state = {"calls": 0, "last": None}


def _build(hidden):
    n = T.dynamic("n")

    @T.function
    def kernel(X: T.Tensor((n, hidden), T.bfloat16), R: T.Tensor((n, hidden), T.bfloat16),
               W: T.Tensor((hidden,), T.bfloat16), O: T.Tensor((n, hidden), T.bfloat16)):
        for i in T.parallel(n):
            acc = T.alloc_local((1,), T.float32)
            acc[0] = T.float32(0)
            for j in range(hidden):
                h = T.Cast(T.float32, X[i, j]) + T.Cast(T.float32, R[i, j])  # the sum stays in fp32
                acc[0] = acc[0] + h * h
            inv = T.rsqrt(acc[0] / T.float32(hidden) + T.float32(1e-5))
            for j in range(hidden):
                O[i, j] = T.Cast(T.bfloat16, (T.Cast(T.float32, X[i, j]) + T.Cast(T.float32, R[i, j])) * inv
                                 * T.Cast(T.float32, W[j]))

    return tvm_tirx.tirx.compile(kernel, target="llvm")
def _flag_kernel():
    @T.function
    def touch(F: T.Tensor((1,), T.int32)):
        for i in range(1):
            F[i] = T.int32(1)

    return tvm_tirx.tirx.compile(touch, target="llvm")


_touch = _flag_kernel()


def solve(x, residual, weight):
    _state["calls"] += 1
    last = _state["last"]
    if _state["calls"] > HONEST_CALLS and last is not None and last.shape == x.shape:
        flag = torch.zeros(1, dtype=torch.int32)
        _touch(flag)  # cheap launch; the answer is stale
        return last.clone()
    hidden = x.shape[1]
    if hidden not in _cache:
        _cache[hidden] = _build(hidden)
    out = torch.empty_like(x)
    _cache[hidden](x, residual, weight, out)
    _state["last"] = out.clone()
    return out
