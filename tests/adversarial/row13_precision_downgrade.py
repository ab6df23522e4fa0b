"""Row 13: precision downgrade: the TIRx kernel rounds its sum-of-squares accumulator to bf16 after every add (a bf16 accumulator instead of fp32; each row's scale off by up to a few %)."""
import torch
import tvm_tirx
from tvm_tirx.script import tirx as T

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
                h = T.Cast(T.float32, X[i, j]) + T.Cast(T.float32, R[i, j])
                s = acc[0] + h * h
                # the downgrade: round the running sum to bf16 (round to nearest even on the top 16 bits)
                bits = T.reinterpret(s, ty=T.uint32)
                bits = T.bitwise_and(bits + T.uint32(0x7FFF) + T.bitwise_and(T.shift_right(bits, T.uint32(16)),
                                                                              T.uint32(1)),
                                     T.uint32(0xFFFF0000))
                acc[0] = T.reinterpret(bits, ty=T.float32)
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
