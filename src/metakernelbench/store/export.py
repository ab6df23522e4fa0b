"""Export a store to flat files (JSON Lines or Parquet) for analysis elsewhere, with a legend of every field."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from metakernelbench.store import Store

LEGEND = {
    "trials": {
        "trial_id": "fixed id from (run, model, problem, DSL, arm, source DSL, replicate)",
        "run_id": "the run inside the store", "model": "model string", "problem": "problem id",
        "dsl": "the DSL the trial wrote", "arm": "solo, skill or placebo", "replicate": "replicate index",
        "source_dsl": "DSL of the solo trial whose skill this trial received (skill/placebo)",
        "skill_problem": "problem of that solo trial (differs from `problem` only for placebo)",
        "status": "finished, skipped, agent_error (the agent never attempted the task: set-up failure, retried on "
                  "resume), running (interrupted) or pending", "attempts": "times the trial was started",
        "result": "passed, best_submission, median_ms, speedup_vs_eager (+range), fraction_of_roofline and "
                  "noise_spread (medians over the chosen submission's fresh gradings), selection_median_ms and "
                  "selection_speedup_vs_eager (the grading that chose it), regrade_medians_ms, regrade_failure, "
                  "submissions, turns (None for command agents), stop_reason, offline_client, isolation (command "
                  "agents: bwrap or user nobody)",
        "skill": "the skill text the trial distilled", "skill_audit": "words, chars, code_fences, dsl_identifiers",
        "usage": "input/output/cached tokens, cost_usd (reported by the client or CLI, else priced from the price "
                 "table; null when unknown), wall_s; command agents also agent_exit_status, refused_submits, "
                 "agent_turns",
        "task_hash": "fingerprint of the task the trial was shown (statement, problem module, DSL guide, grader)",
        "error": "why an agent_error trial's agent could not be set up",
    },
    "submissions": {"trial_id": "the trial", "idx": "submission number within the trial",
                    "code": "the submitted file", "verdict": "the grader's verdict (see `mkb legend`)"},
    "messages": {"trial_id": "the trial", "idx": "turn number", "role": "user or assistant",
                 "content": "the message text"},
    "regrades": {"trial_id": "the trial", "idx": "fresh grading number", "submission": "the chosen submission graded",
                 "verdict": "the grader's verdict"},
    "artifacts": {"trial_id": "the trial", "name": "agent-output.txt (the agent's whole output) or the path of its "
                                                   "CLI's conversation file under its HOME",
                  "text": "the whole text, secrets redacted", "truncated": "cut at the size cap"},
}


def _tables(store: Store) -> dict[str, list[dict]]:
    trials = [asdict(t) for t in store.trials()]
    submissions, messages, regrades, artifacts = [], [], [], []
    for t in trials:
        submissions += [{"trial_id": t["trial_id"], "idx": i, "code": code, "verdict": verdict}
                        for i, code, verdict in store.submissions(t["trial_id"])]
        messages += [{"trial_id": t["trial_id"], "idx": i, "role": role, "content": content}
                     for i, (role, content) in enumerate(store.transcript(t["trial_id"]))]
        regrades += [{"trial_id": t["trial_id"], "idx": i, "submission": s, "verdict": verdict}
                     for i, s, verdict in store.regrades(t["trial_id"])]
        artifacts += [{"trial_id": t["trial_id"], "name": name, "text": text, "truncated": cut}
                      for name, text, cut in store.artifacts(t["trial_id"])]
    return {"trials": trials, "submissions": submissions, "messages": messages, "regrades": regrades,
            "artifacts": artifacts}


def export(store: Store, out: Path, fmt: str) -> list[Path]:
    """Write trials, submissions, messages, fresh gradings and agent files as `fmt` ("jsonl" or "parquet") under `out`, plus legend.json."""
    if fmt not in ("jsonl", "parquet"):
        raise ValueError(f"unknown export format '{fmt}': use jsonl or parquet")
    if fmt == "parquet":
        try:
            import pandas
            import pyarrow  # noqa: F401  (pandas' Parquet engine)
        except ImportError as exc:
            raise ValueError(f"Parquet export needs pandas and pyarrow ({exc.name} missing): "
                             "pip install pandas pyarrow, or use --format jsonl") from exc
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, rows in _tables(store).items():
        path = out / f"{name}.{fmt}"
        if fmt == "jsonl":
            path.write_text("".join(json.dumps(row, default=str) + "\n" for row in rows))
        else:
            frame = pandas.DataFrame([{k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in r.items()}
                                      for r in rows], columns=list(LEGEND[name]))
            frame.to_parquet(path, index=False)
        written.append(path)
    legend = out / "legend.json"
    legend.write_text(json.dumps(LEGEND, indent=2))
    return [*written, legend]
