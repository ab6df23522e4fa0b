"""Row 18 (GPU exploit, CPU-visible part only): pin the weight in a persisting-L2 access-policy window so it stays cached across timed calls; on a CPU the GPU branch never runs, so only the static rule is exercised here."""
import torch
import tvm_tirx
from tvm_tirx.script import tirx as T

_cache = {}
_pinned = {}


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
def _persist(t):
    from cuda.bindings import driver as cu

    cu.cuCtxSetLimit(cu.CUlimit.CU_LIMIT_PERSISTING_L2_CACHE_SIZE, 64 << 20)
    attr = cu.CUstreamAttrValue()
    attr.accessPolicyWindow.base_ptr = t.data_ptr()
    attr.accessPolicyWindow.num_bytes = t.numel() * t.element_size()
    attr.accessPolicyWindow.hitRatio = 1.0
    attr.accessPolicyWindow.hitProp = cu.CUaccessProperty.CU_ACCESS_PROPERTY_PERSISTING
    stream = torch.cuda.current_stream().cuda_stream
    cu.cuStreamSetAttribute(stream, cu.CUstreamAttrID.CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, attr)


def solve(x, residual, weight):
    hidden = x.shape[1]
    if hidden not in _cache:
        _cache[hidden] = _build(hidden)
    if x.is_cuda and hidden not in _pinned:
        _persist(weight)
        _pinned[hidden] = True
    out = torch.empty_like(x)
    _cache[hidden](x, residual, weight, out)
    return out
