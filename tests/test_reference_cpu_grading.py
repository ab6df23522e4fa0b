"""The TIRx references that declare a host path (CPU_PATH = True) pass the grader on the CPU (LLVM): CI grades real
reference kernels end to end, among them the demo's."""
import pytest

from metakernelbench.grader import Grader, GraderConfig
from metakernelbench.suite import load_suite

PROBLEMS = [p for p in load_suite() if p.solution_runs_on_cpu("tirx")]


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


def test_the_demo_problems_have_host_paths(suite):
    demo = [p for p in suite if getattr(p.module, "DEMO", False)]
    assert demo and all(p.solution_runs_on_cpu("tirx") for p in demo)
