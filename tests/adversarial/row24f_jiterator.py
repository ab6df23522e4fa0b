"""Row 24 (variant): raw CUDA through NVRTC (`torch.cuda.jiterator`) computes behind a DSL shell; on the CPU the kernel is only created, which is where the grader's child refuses it."""
import torch
import tvm_tirx
from tvm_tirx.script import tirx as T

_code = "template <typename T> T twice(T x) { return x + x; }"
_twice = torch.cuda.jiterator._create_jit_fn(_code)


def _build_touch():
    @T.function
    def touch(F: T.Tensor((1,), T.int32)):
        for i in range(1):
            F[i] = T.int32(1)

    return tvm_tirx.tirx.compile(touch, target="llvm")


_touch = _build_touch()


def solve(x, residual, weight):
    _touch(torch.zeros(1, dtype=torch.int32))
    return _twice(x)
