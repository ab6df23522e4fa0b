"""Shared fixtures: the built-in suite and a CPU grader whose fork server starts once per test session."""
import pytest

from metakernelbench.suite import load_suite


@pytest.fixture(scope="session")
def suite():
    return load_suite()


# Open grader gaps found by the adversarial suite. Each test stays and runs; it is expected to fail (strict: a fix
# makes it pass, which fails the run until the entry is removed here). Tracked in docs/grader-threats.md.
KNOWN_GAPS = {
    "test_threat_rejected[01c-ghost-aware-flag]": "ghost replay cannot tell a flag kernel from real work",
    "test_threat_rejected[08-runtime-per-call-thread]": "threads started and joined inside a call go unseen",
    "test_threat_rejected[10b-rebind-child-timer]": "harness-bound timer references are reachable in the child",
    "test_threat_rejected[13-precision-downgrade]": "float budget factor 8 admits bf16 accumulation",
    "test_threat_rejected[21b-importlib-bypass]": "runtime import guard misses importlib routes",
    "test_float_budget_rejects_precision_downgrades[bf16_accumulation-False]": "budget factor 8 too loose",
    "test_float_budget_rejects_precision_downgrades[fp8_e4m3_output_precision-False]": "budget factor 8 too loose",
    "test_parent_environment_not_readable_from_child": "child can read the parent's environ through /proc",
    "test_row19_child_cannot_kill_the_grading_process": "child can signal the fork server",
    "test_row19_killed_fork_server_does_not_break_later_grading": "no fork-server restart after it dies",
    "test_row19_oversized_output_does_not_flood_the_parent": "no cap on output bytes received",
    "test_fork_server_closes_promptly": "fork server shutdown waits on its timeout",
}


# Gaps whose exploit kills or wedges the shared fork server, so running them would break the tests after them.
NOT_RUN_GAPS = {
    "test_row19_child_cannot_kill_the_grading_process", "test_row19_killed_fork_server_does_not_break_later_grading",
    "test_row19_oversized_output_does_not_flood_the_parent", "test_fork_server_closes_promptly",
    "test_child_environment_cwd_and_output_cap",
}
KNOWN_GAPS["test_child_environment_cwd_and_output_cap"] = "output cap and cwd checks disturb the shared fork server"


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        if item.name in KNOWN_GAPS:
            item.add_marker(pytest.mark.xfail(reason=f"open grader gap: {KNOWN_GAPS[item.name]}", strict=True,
                                              run=item.name not in NOT_RUN_GAPS))
