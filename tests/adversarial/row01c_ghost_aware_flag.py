"""Row 1 (variant): eager PyTorch does all the work; a TIRx kernel only writes a flag, and the result is spoiled when the flag is missing, so neutralising the launch "changes the output"."""
import torch
import tvm_tirx
from tvm_tirx.script import tirx as T


def _build():
    @T.function
    def flag_kernel(F: T.Tensor((1,), T.int32)):
        for i in range(1):
            F[i] = T.int32(1)

    return tvm_tirx.tirx.compile(flag_kernel, target="llvm")


_flag = _build()


def solve(x, residual, weight):
    flag = torch.zeros(1, dtype=torch.int32)
    _flag(flag)
    h = x.float() + residual.float()
    out = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
    if int(flag[0]) != 1:  # the launch was neutralised: make the output "depend" on it
        out = torch.zeros_like(out)
    return out
