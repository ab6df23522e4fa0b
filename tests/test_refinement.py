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


def test_report_carries_refinement_read_from_the_store(tmp_path):
    from metakernelbench.analysis.report import report_store
    from metakernelbench.protocol import plan
    from metakernelbench.store import Store

    store = Store(tmp_path / "s.sqlite")
    store.ensure_run("r", {}, {})
    specs = plan("r", "m", ["mlp_norm/28_fused_add_rmsnorm_h4096_llama31_8b", "moe/76_softmax_topk_router_renorm"], ["tirx"], ["solo"],
                 solo_control=False)
    store.add_trials(specs)
    verdicts = [[{"compiled": False, "passed": False, "draws": [0] * 50},
                 {"compiled": True, "passed": True, "speedup_vs_eager": 0.5}],
                [{"compiled": True, "passed": True, "speedup_vs_eager": 2.0}]]
    for spec, trial_verdicts in zip(specs, verdicts):
        store.start_trial(spec.trial_id, {})
        for i, v in enumerate(trial_verdicts):
            store.add_submission(spec.trial_id, i, "code", v)
        last = trial_verdicts[-1]
        store.finish_trial(spec.trial_id, {"passed": True, "speedup_vs_eager": last["speedup_vs_eager"],
                                           "median_ms": 1.0, "noise_spread": 0.05}, None, None, {})
    assert store.submission_outcomes("r")[specs[0].trial_id][0] == {
        "compiled": False, "passed": False, "speedup_vs_eager": None, "file_sha256": None, "median_ms": None,
        "spread": None}
    report = report_store(store, tmp_path / "out", "r", n_boot=50)
    first, second = report["refinement"]["by_round"]
    assert (first["submissions"], first["compile_rate"], first["pass_rate"]) == (2, 0.5, 0.5)
    assert second["geomean_speedup_of_passing"] == 0.5
    assert report["refinement"]["slower_than_eager"] == {"correct_trials": 2, "slower": 1, "share": 0.5}
    assert "Refinement by submission round" in (tmp_path / "out" / "report.md").read_text()
