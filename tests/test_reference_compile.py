"""Every GPU reference solution compiles for sm_90a on this CPU-only machine, and obeys the submission rules.

The GPU truth (they pass the grader on an H200) is the recorded run under validation/; this is what CI can check.
"""
import pytest

from metakernelbench.dsl import DSL_NAMES, get_adapter
from metakernelbench.suite import load_problem, load_suite

VARIANTS = [(p, dsl) for p in load_suite() for dsl in DSL_NAMES]


@pytest.mark.parametrize("problem,dsl", VARIANTS, ids=[f"{p.number:02d}-{d}" for p, d in VARIANTS])
def test_reference_solution_is_legal_and_compiles_for_sm90a(problem, dsl):
    adapter = get_adapter(dsl)
    path = problem.solution_path(dsl)
    assert path.is_file(), f"{problem.id} has no {dsl} reference solution"
    assert adapter.check_source(path.read_text(), str(path)) == []
    check = adapter.compile_check(path, "sm_90a")
    assert check.ok, check.error


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_router_sorting_networks_sort_every_zero_one_input(n):
    """The CuTe router builds its comparator networks in Python; by the 0-1 principle a network sorts everything
    when it sorts every 0/1 input. The H200 validation covers only the networks of top 8."""
    router = load_problem("53").load_solution("cute")
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
