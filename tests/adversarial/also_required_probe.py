"""'Also required' probe: reports (never prints values) whether a canary secret is visible in its environment or an ancestor's /proc environ, where it runs, and floods stdout past the capture cap; the result itself comes from an honest TIRx kernel."""
import typing

import torch
import tvm_tirx
from tvm_tirx.script import tirx as T

CANARY = "mkb-canary-7d1f0c"  # the test puts this value in a secret-named variable of the grading process
_os = typing.sys.modules["os"]
_open = torch.builtins.open


def _ancestors():
    pid = _os.getpid()
    for _ in range(8):
        try:
            with _open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return
        if pid <= 1:
            return
        yield pid


def _probe():
    seen_env = any(CANARY in v for v in _os.environ.values())
    seen_ancestor = False
    for pid in _ancestors():
        try:
            with _open(f"/proc/{pid}/environ", "rb") as f:
                seen_ancestor |= CANARY.encode() in f.read()
        except OSError:
            pass
    for _ in range(1024):  # ~1 MB: the verdict must keep only a capped tail
        print("flood " * 170, flush=False)
    print(f"PROBE env_canary={'present' if seen_env else 'absent'}", flush=True)
    print(f"PROBE ancestor_canary={'present' if seen_ancestor else 'absent'}", flush=True)
    print(f"PROBE cwd={_os.getcwd()}", flush=True)
    print(f"PROBE home={_os.environ.get('HOME')}", flush=True)
    print(f"PROBE tmpdir={_os.environ.get('TMPDIR')}", flush=True)


_probe()
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
                h = T.Cast(T.float32, X[i, j]) + T.Cast(T.float32, R[i, j])  # the sum stays in fp32
                acc[0] = acc[0] + h * h
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
