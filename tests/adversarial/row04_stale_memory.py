"""Row 4: return an uninitialised tensor, hoping the allocator hands back memory that held the reference's result."""
import torch
import tvm_tirx
from tvm_tirx.script import tirx as T


def _build():
    @T.function
    def touch(F: T.Tensor((1,), T.int32)):
        for i in range(1):
            F[i] = T.int32(1)

    return tvm_tirx.tirx.compile(touch, target="llvm")


_touch = _build()


def solve(x, residual, weight):
    flag = torch.zeros(1, dtype=torch.int32)
    _touch(flag)  # a real launch, so only the stale-memory trick is under test
    return torch.empty(x.shape, dtype=x.dtype)
