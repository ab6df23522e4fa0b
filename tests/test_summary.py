"""The run summary counts every arm and labels offline clients."""
from metakernelbench.analysis import summarise
from metakernelbench.protocol import plan
from metakernelbench.store import Store


def test_summary_counts_arms_and_labels_offline_runs(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    store.ensure_run("r", {}, {})
    specs = plan("r", "reference", ["mlp_norm/28_fused_add_rmsnorm_h4096_llama31_8b"], ["cute", "tirx"], ["solo", "skill"],
                 solo_control=False)
    store.add_trials(specs)
    solo_cute, solo_tirx, skill_tirx_from_cute, skill_cute_from_tirx = specs[0], specs[1], specs[2], specs[3]
    for spec, passed in ((solo_cute, False), (solo_tirx, True)):
        store.start_trial(spec.trial_id, {})
        store.finish_trial(spec.trial_id, {"passed": passed, "speedup_vs_eager": 5.5 if passed else None,
                                           "offline_client": True}, "skill", {}, {"output_tokens": 10})
    store.start_trial(skill_tirx_from_cute.trial_id, {})
    store.skip_trial(skill_tirx_from_cute.trial_id, "no skill")
    text = summarise(store, "r")
    assert "OFFLINE client" in text
    assert "| solo | 2 | 2 | 1 | 0 | 20 | n/a |" in text and "| skill | 2 | 0 | 0 | 1 | 0 | n/a |" in text
    row = next(line for line in text.splitlines() if line.startswith("| mlp_norm/28"))
    assert "pass 5.50x" in row and "fail" in row and "skipped" in row and "pending" in row
    assert "No trials" in summarise(store, "other")
