"""Every GPU reference solution compiles for sm_90a on this CPU-only machine, and obeys the submission rules.

The GPU truth (they pass the grader on an H200) is the recorded run under validation/; this is what CI can check.
"""
import pytest

from metakernelbench.dsl import DSL_NAMES, get_adapter
from metakernelbench.suite import load_suite

VARIANTS = [(p, dsl) for p in load_suite() for dsl in DSL_NAMES]


@pytest.mark.parametrize("problem,dsl", VARIANTS, ids=[f"{p.number:02d}-{d}" for p, d in VARIANTS])
def test_reference_solution_is_legal_and_compiles_for_sm90a(problem, dsl):
    adapter = get_adapter(dsl)
    path = problem.solution_path(dsl)
    assert path.is_file(), f"{problem.id} has no {dsl} reference solution"
    assert adapter.check_source(path.read_text(), str(path)) == []
    check = adapter.compile_check(path, "sm_90a")
    assert check.ok, check.error
