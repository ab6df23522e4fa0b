"""A run's summary in Markdown: outcomes per arm and, per problem, each arm's result side by side.

Offline clients (replay, reference) are labelled, so a demo can never be mistaken for a model's result.
"""
from __future__ import annotations

from collections import defaultdict

from metakernelbench.store import Store, TrialRow


def _outcome(t: TrialRow) -> str:
    if t.status != "finished":
        return t.status
    r = t.result or {}
    if not r.get("passed"):
        return "fail"
    speed = f" {r['speedup_vs_eager']:.2f}x" if r.get("speedup_vs_eager") else ""
    return f"pass{speed}"


def summarise(store: Store, run_id: str) -> str:
    trials = store.trials(run_id)
    if not trials:
        return f"# Run `{run_id}`\n\nNo trials recorded yet.\n"
    offline = any((t.result or {}).get("offline_client") for t in trials)
    lines = [f"# Run `{run_id}`: {trials[0].model}" + (" (OFFLINE client: not a model's result)" if offline else ""),
             "", "| arm | trials | finished | passed | skipped | tokens out | cost (USD) |", "|---|---|---|---|---|---|---|"]
    by_arm: dict[str, list[TrialRow]] = defaultdict(list)
    for t in trials:
        by_arm[t.arm].append(t)
    for arm, rows in by_arm.items():
        tokens = sum((t.usage or {}).get("output_tokens", 0) for t in rows)
        costs = [(t.usage or {}).get("cost_usd") for t in rows if (t.usage or {}).get("cost_usd") is not None]
        lines.append(f"| {arm} | {len(rows)} | {sum(t.status == 'finished' for t in rows)} | "
                     f"{sum(bool((t.result or {}).get('passed')) for t in rows)} | "
                     f"{sum(t.status == 'skipped' for t in rows)} | {tokens} | "
                     f"{f'{sum(costs):.2f}' if costs else 'n/a'} |")
    columns = sorted({(t.dsl, t.arm, t.source_dsl or "", t.replicate) for t in trials})
    header = [f"{dsl} {arm}{' from ' + src if src else ''} r{rep}" for dsl, arm, src, rep in columns]
    lines += ["", "| problem | " + " | ".join(header) + " |", "|---" * (len(header) + 1) + "|"]
    cells = {(t.problem, t.dsl, t.arm, t.source_dsl or "", t.replicate): _outcome(t) for t in trials}
    for problem in sorted({t.problem for t in trials}):
        lines.append(f"| {problem} | " + " | ".join(cells.get((problem, *c), "") for c in columns) + " |")
    lines += ["", "Outcome per trial: pass (with its speedup over PyTorch eager), fail, or skipped (no source "
                  "skill). Outcomes only: no paired statistics or noise floor here."]
    return "\n".join(lines) + "\n"
