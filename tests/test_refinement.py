"""KernelBench-X measurements recover hand-computed values."""
import math

import pytest

from metakernelbench.analysis.refinement import by_round, slower_than_eager, variance_share
from metakernelbench.store import TrialRow


def _trial(problem, model, passed, speedup=None, status="finished"):
    return TrialRow("id", "r", model, problem, "tirx", "solo", 0, None, None, status, 1,
                    {"passed": passed, "speedup_vs_eager": speedup}, None, None, None)


def test_rounds_count_compile_pass_and_speed_per_submission_number():
    subs = {"a": [{"compiled": False, "passed": False}, {"compiled": True, "passed": True, "speedup_vs_eager": 2.0}],
            "b": [{"compiled": True, "passed": True, "speedup_vs_eager": 8.0}]}
    first, second = by_round(subs)
    assert (first.round, first.submissions, first.compile_rate, first.pass_rate) == (1, 2, 0.5, 0.5)
    assert first.geomean_speedup_of_passing == pytest.approx(8.0)
    assert (second.submissions, second.pass_rate, second.geomean_speedup_of_passing) == (1, 1.0, 2.0)


def test_slower_than_eager_counts_only_correct_measured_trials():
    trials = [_trial("a/1", "m", True, 0.5), _trial("a/2", "m", True, 2.0), _trial("a/3", "m", False, 0.1),
              _trial("a/4", "m", True, 0.9, status="running")]
    assert slower_than_eager(trials) == (1, 2)


def test_variance_share_is_eta_squared():
    trials = [_trial("fam1/x", "m1", True), _trial("fam1/y", "m2", True), _trial("fam2/x", "m1", False),
              _trial("fam2/y", "m2", False)]
    share = variance_share(trials)
    assert share.family == pytest.approx(1.0) and share.model == pytest.approx(0.0) and share.trials == 4
    mixed = trials + [_trial("fam1/z", "m1", False)]
    values, mean = [1, 1, 0, 0, 0], 0.4
    total = sum((v - mean) ** 2 for v in values)
    between = 3 * (2 / 3 - mean) ** 2 + 2 * (0 - mean) ** 2
    assert math.isclose(variance_share(mixed).family, between / total)
    assert variance_share([_trial("f/x", "m", True)]).family is None
