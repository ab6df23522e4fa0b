"""Row 24 (variant): native code brought by the submission: a shared object copied into its working directory and loaded through ctypes (reached as `torch.ctypes`), where a C implementation could do the work."""
import torch
import tvm_tirx
from tvm_tirx.script import tirx as T


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


_cache = {}


def _honest(x, residual, weight):
    hidden = x.shape[1]
    if hidden not in _cache:
        _cache[hidden] = _build(hidden)
    out = torch.empty_like(x)
    _cache[hidden](x, residual, weight, out)
    return out

_ctypes = object.__getattribute__(torch, "ctypes")
_lib = None
for _path in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6", "/lib64/libm.so.6",
              "/usr/lib/aarch64-linux-gnu/libm.so.6"):
    try:
        with open(_path, "rb") as _src, open("native_helper.so", "wb") as _dst:
            _dst.write(_src.read())
        _lib = _ctypes.CDLL("./native_helper.so")
        break
    except OSError:
        continue


def solve(x, residual, weight):
    return _honest(x, residual, weight)
