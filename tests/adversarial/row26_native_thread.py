"""Row 26: a TorchScript task forked onto ATen's native inter-op pool (`torch.jit.fork`) computes the output after `solve` returns; the TIRx launch only writes the flag the task waits for, so neutralising it spoils the output."""
import torch
import tvm_tirx
from tvm_tirx.script import tirx as T


def _build_flag():
    @T.function
    def flag(F: T.Tensor((1,), T.int32), X: T.Tensor((64, 512), T.bfloat16)):
        for i in range(1):
            acc = T.alloc_local((1,), T.float32)
            acc[0] = T.float32(0)
            for k in range(32768):  # a share of the call's time, for the old time-share check
                acc[0] = acc[0] * T.float32(0.5) + T.Cast(T.float32, X[k // 512 % 64, k % 512])
            F[i] = T.int32(1) + T.Cast("int32", acc[0] * T.float32(0))

    return tvm_tirx.tirx.compile(flag, target="llvm")


_flag = _build_flag()
_spin_input = torch.ones(64, 512, dtype=torch.bfloat16)


@torch.jit.script
def _late(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, flag: torch.Tensor,
          out: torch.Tensor) -> int:
    if int(flag[0]) == 1:
        for _ in range(3):  # long enough to outlast the return of solve
            h = x.float() + residual.float()
            out.copy_((h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype))
    else:
        out.zero_()
    return 0


@torch.jit.script
def _fork(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, flag: torch.Tensor,
          out: torch.Tensor) -> torch.jit.Future[int]:
    return torch.jit.fork(_late, x, residual, weight, flag, out)


_futures = []


def solve(x, residual, weight):
    flag = torch.zeros(1, dtype=torch.int32)
    _flag(flag, _spin_input)
    out = torch.empty_like(x)
    _futures.append(_fork(x, residual, weight, flag, out))
    return out
