"""Row 19 (variant): return a 1 GiB output so the trusted parent receives and materialises it (several copies) before any shape check: memory pressure on the grading process itself."""
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
    _touch(flag)
    return torch.zeros(1 << 29, dtype=torch.bfloat16)
