"""Row 24: eager PyTorch computes the answer; a TIRx kernel copies it into the returned tensor (so neutralising the launch leaves poison) and spins long enough to own most of the call's time."""
import torch
import tvm_tirx
from tvm_tirx.script import tirx as T


def _eager(x, residual, weight):
    h = x.float() + residual.float()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)


def _build_copy(hidden, spins):
    n = T.dynamic("n")

    @T.function
    def copy(S: T.Tensor((n, hidden), T.bfloat16), O: T.Tensor((n, hidden), T.bfloat16)):
        for i in T.parallel(n):
            acc = T.alloc_local((1,), T.float32)
            acc[0] = T.float32(0)
            for k in range(spins):
                acc[0] = acc[0] * T.float32(0.5) + T.Cast(T.float32, S[i, k % hidden])
            for j in range(hidden):
                O[i, j] = T.Cast(T.bfloat16, T.Cast(T.float32, S[i, j]) + acc[0] * T.float32(0))

    return tvm_tirx.tirx.compile(copy, target="llvm")


_copies = {}


def _shell(result):
    """Copy `result` through a TIRx kernel: neutralised, the output is the poison the grader left there."""
    hidden = result.shape[1]
    if hidden not in _copies:
        _copies[hidden] = _build_copy(hidden, 256 * hidden)
    out = torch.empty_like(result)
    _copies[hidden](result, out)
    return out


def solve(x, residual, weight):
    return _shell(_eager(x, residual, weight))
