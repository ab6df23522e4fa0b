"""The TIRx reference solutions also run on the CPU (LLVM), so CI grades real reference kernels end to end."""
import pytest

from metakernelbench.grader import Grader, GraderConfig
from metakernelbench.suite import load_suite

PROBLEMS = load_suite()


@pytest.fixture(scope="module")
def grader():
    with Grader(GraderConfig(device="cpu", warmup_calls=2, timed_calls=10, baseline_processes=1)) as g:
        yield g


@pytest.mark.parametrize("problem", PROBLEMS, ids=[p.name for p in PROBLEMS])
def test_tirx_reference_passes_the_grader_on_cpu(grader, problem):
    verdict = grader.grade(problem, "tirx", problem.graded_solution("tirx"))
    assert verdict.passed, f"{verdict.failed_check}: {verdict.reason}\n{verdict.stderr_tail[-1500:]}"
    assert {d["size"] for d in verdict.draws} == {"cpu", "cpu_odd"}
    assert verdict.checks["ghost_replay"]["passed"] and verdict.checks["dsl_share"]["share"] >= 0.1
