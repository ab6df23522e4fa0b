"""Every GPU reference solution, as graded (kit inlined), obeys the submission rules and compiles for sm_90a on this
CPU-only machine: one compile process per DSL for the whole suite, the DSLs side by side.

The GPU truth (they pass the grader on an H200) is the ledger under validation/; this is what CI can check.
"""
import pytest

from metakernelbench.dsl import dsl_names, get_adapter
from metakernelbench.grader.validation import compile_references
from metakernelbench.suite import load_problem, load_suite

VARIANTS = [(p, dsl) for p in load_suite() for dsl in dsl_names() if p.solution_path(dsl).is_file()]


@pytest.fixture(scope="module")
def compiled():
    return {(problem.id, check.dsl): check for problem, check in compile_references(VARIANTS, "sm_90a")}


def test_every_problem_has_a_reference_in_every_dsl(suite):
    missing = [f"{p.id} [{d}]" for p in suite for d in dsl_names() if not p.solution_path(d).is_file()]
    assert not missing, f"no reference solution: {missing}"


@pytest.mark.parametrize("problem,dsl", VARIANTS, ids=[f"{p.number:02d}-{d}" for p, d in VARIANTS])
def test_graded_reference_is_legal_and_compiles_for_sm90a(compiled, problem, dsl):
    path = problem.graded_solution(dsl)
    assert get_adapter(dsl).check_source(path.read_text(), str(path)) == []
    check = compiled[(problem.id, dsl)]
    assert check.ok, check.error


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_router_sorting_networks_sort_every_zero_one_input(n):
    """The CuTe router builds its comparator networks in Python; by the 0-1 principle a network sorts everything
    when it sorts every 0/1 input. The H200 validation covers only the networks of top 8."""
    router = load_problem("76").load_solution("cute")
    ce = lambda a, b: (max(a, b), min(a, b))  # noqa: E731
    for bits in range(1 << n):
        xs = [(bits >> i) & 1 for i in range(n)]
        assert router._sort_desc(xs, ce) == sorted(xs, reverse=True)
    for ones in range(n + 1):  # every 0/1 bitonic sequence: a descending run and an ascending one, rotated
        descending = [1] * ones + [0] * (n - ones)
        for cut in range(n + 1):
            bitonic = descending[:cut] + sorted(descending[cut:])
            for shift in range(n):
                assert router._bitonic_desc(bitonic[shift:] + bitonic[:shift], ce) == descending
