"""Row 24 (variant): a Python function registered with `tvm_ffi.register_global_func` computes the answer in eager PyTorch, called from inside a TIRx kernel by `T.call_packed`, so the work runs within a counted DSL launch."""
import torch
import tvm_tirx
from tvm_tirx.script import tirx as T
import tvm_ffi


def _eager(x, residual, weight):
    h = x.float() + residual.float()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)

_pending = []


@tvm_ffi.register_global_func("mkb_row24c.compute")
def _compute():
    x, residual, weight, out = _pending.pop()
    out.copy_(_eager(x, residual, weight))
    return 0


def _build_caller():
    @T.function
    def caller(F: T.Tensor((1,), T.int32)):
        for i in range(1):
            F[0] = T.call_packed("mkb_row24c.compute", ty="int32")

    return tvm_tirx.tirx.compile(caller, target="llvm")


_caller = _build_caller()


def solve(x, residual, weight):
    out = torch.empty_like(x)
    _pending.append((x, residual, weight, out))
    _caller(torch.zeros(1, dtype=torch.int32))
    return out
