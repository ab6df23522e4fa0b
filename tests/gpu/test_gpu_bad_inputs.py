"""GPU failure modes a submission can cause — an illegal address, a kernel that never ends, device out of memory —
each give a failing verdict with a clear reason, and the next grading on the same GPU is unaffected. Skipped
without a CUDA device."""
import os
import re

import pytest
import torch

from metakernelbench.grader import Grader, GraderConfig
from metakernelbench.suite import load_problem

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

PROBLEM = "mlp_norm/28_fused_add_rmsnorm_h4096_llama31_8b"
CONFIG = GraderConfig(compile_baseline=False, baseline_processes=1, preload_dsls=("cute",), first_call_timeout_s=30.0,
                      call_timeout_s=20.0,
                      extra_env={"PYTHONPATH": os.environ.get("PYTHONPATH", "")})

PRELUDE = '''
import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_ptr


def _stream():
    return cuda.CUstream(torch.cuda.current_stream().cuda_stream)
'''

ILLEGAL_ADDRESS = PRELUDE + '''

@cute.kernel
def _scribble(t: cute.Tensor):
    tid, _, _ = cute.arch.thread_idx()
    t[tid] = cutlass.Float32(1.0)


@cute.jit
def _launch(p: cute.Pointer, stream: cuda.CUstream):
    _scribble(cute.make_tensor(p, cute.make_layout((32,)))).launch(grid=(1, 1, 1), block=(32, 1, 1), stream=stream)


def solve(x, residual, weight):
    _launch(make_ptr(cutlass.Float32, 1 << 46, cute.AddressSpace.gmem, assumed_align=4), _stream())  # unmapped
    return x.clone()
'''

ENDLESS_KERNEL = PRELUDE + '''

@cute.kernel
def _spin(t: cute.Tensor):
    while t[0] == cutlass.Int32(0):  # nothing ever writes it
        t[1] = t[1] + cutlass.Int32(1)


@cute.jit
def _launch(p: cute.Pointer, stream: cuda.CUstream):
    _spin(cute.make_tensor(p, cute.make_layout((2,)))).launch(grid=(1, 1, 1), block=(1, 1, 1), stream=stream)


def solve(x, residual, weight):
    flag = torch.zeros(2, dtype=torch.int32, device=x.device)
    _launch(make_ptr(cutlass.Int32, flag.data_ptr(), cute.AddressSpace.gmem, assumed_align=4), _stream())
    return x.clone()  # the grader's device sync after the call never returns
'''

OUT_OF_MEMORY = PRELUDE + '''

def solve(x, residual, weight):
    hoard = torch.empty(1 << 50, dtype=torch.uint8, device=x.device)  # a petabyte
    return hoard
'''


@pytest.fixture(scope="module")
def grader():
    with Grader(CONFIG) as g:
        yield g


@pytest.mark.parametrize("source, checks, reason", [
    pytest.param(ILLEGAL_ADDRESS, ("runtime_error", "crash"), r"illegal (memory access|address)", id="illegal-address"),
    pytest.param(ENDLESS_KERNEL, ("timeout",), r"no answer within \d+ s", id="endless-kernel"),
    pytest.param(OUT_OF_MEMORY, ("runtime_error",), r"out of memory", id="device-oom"),
])
def test_gpu_failure_gives_a_verdict_and_the_next_grading_passes(grader, tmp_path, source, checks, reason):
    problem = load_problem(PROBLEM)
    path = tmp_path / "bad.py"
    path.write_text(source)
    bad = grader.grade(problem, "cute", path)
    assert not bad.passed and bad.failed_check in checks, (bad.failed_check, bad.reason)
    assert re.search(reason, bad.reason + bad.stderr_tail, re.IGNORECASE), (bad.reason, bad.stderr_tail[-500:])
    honest = grader.grade(problem, "cute", problem.graded_solution("cute"))
    assert honest.passed, honest.reason
