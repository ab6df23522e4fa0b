"""Exports carry every trial, submission and message of a store, and a legend naming every field they hold."""
import json

import pytest

from metakernelbench.protocol import plan
from metakernelbench.store import Store
from metakernelbench.store.export import LEGEND, export


def _store(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    store.ensure_run("r", {}, {})
    specs = plan("r", "m", ["mlp_norm/28_fused_add_rmsnorm_h4096_llama31_8b"], ["tirx"], ["solo"])
    store.add_trials(specs)
    first = specs[0].trial_id
    store.start_trial(first, {"temperature": 0.2})
    store.add_message(first, 0, "user", "task")
    store.add_message(first, 1, "assistant", "```python\nx = 1\n```")
    store.add_submission(first, 0, "x = 1", {"passed": False, "failed_check": "static_rules"})
    store.add_regrade(first, 0, 0, {"passed": True, "runtime": {"median_ms": 0.5}})
    store.add_artifact(first, "agent-output.txt", "whole output " * 1000)
    store.finish_trial(first, {"passed": False}, "keep sums in fp32", {"words": 4}, {"output_tokens": 7})
    return store, specs


def test_jsonl_export_round_trips_with_a_complete_legend(tmp_path):
    store, specs = _store(tmp_path)
    paths = export(store, tmp_path / "out", "jsonl")
    assert sorted(p.name for p in paths) == ["artifacts.jsonl", "legend.json", "messages.jsonl", "regrades.jsonl",
                                             "submissions.jsonl", "trials.jsonl"]
    tables = {name: [json.loads(line) for line in (tmp_path / "out" / f"{name}.jsonl").read_text().splitlines()]
              for name in ("trials", "submissions", "messages", "regrades", "artifacts")}
    assert tables["artifacts"][0]["text"] == "whole output " * 1000 and not tables["artifacts"][0]["truncated"]
    assert tables["regrades"][0]["verdict"]["runtime"]["median_ms"] == 0.5
    assert len(tables["trials"]) == len(specs) and len(tables["submissions"]) == 1 and len(tables["messages"]) == 2
    assert tables["submissions"][0]["verdict"]["failed_check"] == "static_rules"
    finished = next(t for t in tables["trials"] if t["status"] == "finished")
    assert finished["skill"] == "keep sums in fp32" and finished["usage"] == {"output_tokens": 7}
    legend = json.loads((tmp_path / "out" / "legend.json").read_text())
    for name, rows in tables.items():
        assert set(rows[0]) == set(legend[name]) == set(LEGEND[name])


def test_unknown_format_names_the_choices(tmp_path):
    store, _ = _store(tmp_path)
    with pytest.raises(ValueError, match="jsonl or parquet"):
        export(store, tmp_path / "out", "csv")


def test_parquet_export_holds_the_same_rows(tmp_path):
    import pandas

    store, specs = _store(tmp_path)
    export(store, tmp_path / "pq", "parquet")
    trials = pandas.read_parquet(tmp_path / "pq" / "trials.parquet")
    submissions = pandas.read_parquet(tmp_path / "pq" / "submissions.parquet")
    assert len(trials) == len(specs) and list(trials.columns) == list(LEGEND["trials"])
    assert json.loads(submissions.loc[0, "verdict"])["failed_check"] == "static_rules"
