"""Row 8: solve returns at once and a background thread runs the TIRx kernel into the returned tensor after the timer has stopped."""
import torch
import tvm_tirx
from tvm_tirx.script import tirx as T

try:  # the plain route (static rules and the import guard must stop it) ...
    import threading
except ImportError:  # ... and a route through a module re-exported by typing, to reach the runtime defence
    import typing
    threading = typing.sys.modules["threading"]

_cache = {}


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
    hidden = x.shape[1]
    if hidden not in _cache:
        _cache[hidden] = _build(hidden)
    out = torch.empty_like(x)
    flag = torch.zeros(1, dtype=torch.int32)
    _touch(flag)  # counted inside the timed region; the real work is not
    threading.Thread(target=_cache[hidden], args=(x, residual, weight, out)).start()
    return out
