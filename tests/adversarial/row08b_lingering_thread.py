"""Row 8 (variant): a worker thread started by solve runs the TIRx kernel and stays alive after the calls (to prefetch/finish work later); solve waits for it, so outputs are right and only the thread check can object."""
import torch
import tvm_tirx
from tvm_tirx.script import tirx as T

try:  # the plain route (static rules and the import guard must stop it) ...
    import queue
    import threading
except ImportError:  # ... and a route through a module re-exported by typing, to reach the runtime defence
    import typing
    queue = typing.sys.modules.get("queue") or typing.sys.modules["multiprocessing"].queues.queue
    threading = typing.sys.modules["threading"]

_cache = {}
_worker = {}


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
def _serve(jobs):
    while True:
        fn, args, done = jobs.get()
        fn(*args)
        done.set()


def solve(x, residual, weight):
    hidden = x.shape[1]
    if hidden not in _cache:
        _cache[hidden] = _build(hidden)
    if "jobs" not in _worker:
        _worker["jobs"] = queue.SimpleQueue()
        threading.Thread(target=_serve, args=(_worker["jobs"],), daemon=True).start()
    out = torch.empty_like(x)
    done = threading.Event()
    _worker["jobs"].put((_cache[hidden], (x, residual, weight, out), done))
    done.wait()
    return out
