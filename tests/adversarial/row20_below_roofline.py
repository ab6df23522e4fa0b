"""Row 20: report a runtime below the physical limit (a thousandth of the real time, via the child's timer reachable through gc); the roofline floor is the defence under test, so run it with peak figures configured."""
import typing

import torch
import tvm_tirx
from tvm_tirx.script import tirx as T

gc = typing.sys.modules["gc"]
SCALE = 1e-3

for obj in gc.get_objects():
    if type(obj).__name__ == "Runner" and hasattr(obj, "perf_counter"):
        real = obj.perf_counter
        obj.perf_counter = lambda real=real: real() * SCALE
        if hasattr(obj, "Event"):
            RealEvent = obj.Event

            class FastEvent(RealEvent):
                def elapsed_time(self, end):
                    return super().elapsed_time(end) * SCALE

            obj.Event = FastEvent

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
def solve(x, residual, weight):
    hidden = x.shape[1]
    if hidden not in _cache:
        _cache[hidden] = _build(hidden)
    out = torch.empty_like(x)
    _cache[hidden](x, residual, weight, out)
    return out
