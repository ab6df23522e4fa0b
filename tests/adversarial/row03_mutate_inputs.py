"""Row 3: a TIRx kernel zeroes the inputs x and residual and returns zeros, so a reference computed afterwards on the same (mutated) inputs would agree."""
import torch
import tvm_tirx
from tvm_tirx.script import tirx as T

_cache = {}


def _build(hidden):
    n = T.dynamic("n")

    @T.function
    def wipe(X: T.Tensor((n, hidden), T.bfloat16), R: T.Tensor((n, hidden), T.bfloat16),
             O: T.Tensor((n, hidden), T.bfloat16)):
        for i in T.parallel(n):
            for j in range(hidden):
                X[i, j] = T.bfloat16(0)
                R[i, j] = T.bfloat16(0)
                O[i, j] = T.bfloat16(0)

    return tvm_tirx.tirx.compile(wipe, target="llvm")


def solve(x, residual, weight):
    hidden = x.shape[1]
    if hidden not in _cache:
        _cache[hidden] = _build(hidden)
    out = torch.empty_like(x)
    _cache[hidden](x, residual, out)  # reference(0, 0, w) == 0: "agrees" if computed after the call
    return out
