"""GPU sides of threat rows 22-27 and of pinned numerics: inputs handed over by CUDA IPC from a dedicated allocation,
the CUDA event timer out of the submission's reach, jiterator shut in the child, the kernel-only device time, the
fp64 anchor's memory bound, and every CuTe and TIRx reference still passing. Skipped without a CUDA device; run on the
H200 with `python -m pytest -q tests/gpu/test_gpu_hardening.py`."""
import json
import os
import subprocess
import sys

import pytest
import torch

from metakernelbench.dsl import dsl_names
from metakernelbench.grader import Grader, GraderConfig, compare, numerics
from metakernelbench.grader.cuda_ipc import DeviceBuffer
from metakernelbench.suite import load_problem, load_suite

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

PROBLEM = "mlp_norm/28_fused_add_rmsnorm_h4096_llama31_8b"
ENV = {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}
CONFIG = GraderConfig(compile_baseline=False, baseline_processes=1, preload_dsls=("cute", "tirx"), extra_env=ENV)
STATIC_OFF = GraderConfig(compile_baseline=False, baseline_processes=1, preload_dsls=("cute", "tirx"),
                          static_rules=False, extra_env=ENV)

PATCH_EVENT_TIMER = '''

_real_elapsed = torch.cuda.Event.elapsed_time
torch.cuda.Event.elapsed_time = lambda self, end: _real_elapsed(self, end) * 0.1
'''

JITERATOR = '''

_twice = torch.cuda.jiterator._create_jit_fn("template <typename T> T twice(T x) { return x + x; }")
_honest_solve = solve


def solve(*inputs):
    _honest_solve(*inputs)  # the DSL launch the checks look for
    return _twice(inputs[0])
'''


@pytest.fixture(scope="module")
def grader():
    with Grader(CONFIG) as g:
        yield g


@pytest.fixture(scope="module")
def unguarded():
    with Grader(STATIC_OFF) as g:
        yield g


def _variant(tmp_path, name: str, tail: str):
    problem = load_problem(PROBLEM)
    path = tmp_path / name
    path.write_text(problem.graded_solution("cute").read_text() + tail)
    return problem, path


VARIANTS = [(p, d) for p in load_suite() for d in dsl_names() if p.solution_path(d).is_file()]


@pytest.mark.parametrize("problem,dsl", VARIANTS, ids=[f"{p.number:02d}-{d}" for p, d in VARIANTS])
def test_every_reference_passes_the_hardened_grader(grader, problem, dsl):
    verdict = grader.grade(problem, dsl, problem.graded_solution(dsl))
    assert verdict.passed, f"{verdict.failed_check}: {verdict.reason}\n{verdict.stderr_tail[-1500:]}"
    assert {d["inputs_transport"] for d in verdict.draws} == {"ipc"}
    assert verdict.checks["dsl_share"]["eager_share"] <= CONFIG.max_eager_share
    assert 0 < verdict.runtime["kernel_ms"] <= verdict.runtime["median_ms"], verdict.runtime
    assert verdict.numerics["matmul_allow_tf32"] is False


def test_honest_overhead_is_under_a_second(grader):
    problem = load_problem(PROBLEM)
    grader.grade(problem, "cute", problem.graded_solution("cute"))  # fork server up, baseline cached
    verdict = grader.grade(problem, "cute", problem.graded_solution("cute"))
    assert verdict.passed, verdict.reason
    assert verdict.timings_s["overhead"] <= 1.0, verdict.timings_s


def test_row23_cuda_event_timer_patch_is_seen(unguarded, tmp_path):
    problem, path = _variant(tmp_path, "event_timer.py", PATCH_EVENT_TIMER)
    verdict = unguarded.grade(problem, "cute", path)
    assert verdict.failed_check == "integrity" and "torch.cuda.Event.elapsed_time was replaced" in verdict.reason, (
        verdict.failed_check, verdict.reason)


def test_row24_jiterator_is_refused(grader, unguarded, tmp_path):
    problem, path = _variant(tmp_path, "jiterator.py", JITERATOR)
    static = grader.grade(problem, "cute", path)
    assert static.failed_check == "static_rules" and "jiterator" in static.reason, static.reason
    runtime = unguarded.grade(problem, "cute", path)
    assert runtime.failed_check == "import" and "another kernel language" in runtime.reason, runtime.reason


IMPORT_IN_ANOTHER_PROCESS = """
import json, sys
import torch
from metakernelbench.grader.cuda_ipc import import_copies
torch.zeros(1, device="cuda")  # the driver API below needs an initialised driver and context, as the parent has
records = json.loads(sys.stdin.read())
sums = [int(t.view(torch.uint8).sum()) for t in import_copies(records, "cuda:0")]
try:
    import_copies([dict(records[0], offset=1 << 40)], "cuda:0")
    past = "accepted"
except ValueError as exc:
    past = str(exc)
print(json.dumps({"sums": sums, "past": past}))
"""


def _byte_sum(tensor: torch.Tensor) -> int:
    return int(tensor.contiguous().view(torch.uint8).sum())


def test_input_buffer_is_its_own_allocation():
    """The child maps only the inputs: the buffer's IPC handle covers one dedicated allocation, never a caching
    allocator segment that could also hold the parent's references. The driver opens a handle only in another
    process, as the child is."""
    buffer = DeviceBuffer("cuda:0")
    try:
        reference = torch.full((1 << 20,), 7.0, device="cuda")  # a parent tensor the child must never see
        inputs = [torch.randn(4096, 512, device="cuda").bfloat16(), torch.arange(999, device="cuda")]
        records = buffer.records(inputs)
        assert {r["handle"] for r in records} == {buffer.handle}
        assert not (buffer.pointer <= reference.data_ptr() < buffer.pointer + buffer.size)
        child = subprocess.run([sys.executable, "-c", IMPORT_IN_ANOTHER_PROCESS], input=json.dumps(records),
                               capture_output=True, text=True, timeout=120)
        assert child.returncode == 0, child.stderr[-2000:]
        got = json.loads(child.stdout.strip().splitlines()[-1])
        assert got["sums"] == [_byte_sum(t) for t in inputs]
        assert "runs past" in got["past"], got["past"]
    finally:
        buffer.close()


def test_one_check_peaks_below_three_times_the_inputs():
    problem = load_problem(PROBLEM)
    inputs = problem.make_inputs(1, "cuda:0", "full")
    input_bytes = sum(t.numel() * t.element_size() for t in inputs)
    got = problem.reference(*[t.clone() for t in inputs])
    anchor = numerics.Anchor(problem, slice_above_bytes=0, slice_floor_bytes=0)  # sliced as the largest would be
    anchor.references(inputs, "full", True)  # proves separability once per size, outside the measured check
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    lp, wide = anchor.references(inputs, "full", True)
    checks = compare.compare(problem, got, lp, wide)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    assert all(c.passed for c in checks) and anchor.slices_used > 1
    assert peak <= 3 * input_bytes, f"one check peaked at {peak / input_bytes:.2f}x the inputs"
