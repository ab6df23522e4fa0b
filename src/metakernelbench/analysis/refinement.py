"""KernelBench-X's questions asked of our trials: does iterative refinement buy correctness at the cost of speed,
how many correct kernels are slower than eager PyTorch, and does the problem family or the model explain more of the
outcome?"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from metakernelbench.store import TrialRow


@dataclass(frozen=True)
class RoundStats:
    """Submissions made at one round (1 = first submission of a trial) across trials."""

    round: int
    submissions: int
    compile_rate: float
    pass_rate: float
    geomean_speedup_of_passing: float | None


@dataclass(frozen=True)
class VarianceShare:
    """Share of the variance of per-trial outcome (passed = 1, else 0) explained by each grouping (eta squared)."""

    family: float | None
    model: float | None
    trials: int


def by_round(submissions: dict[str, list[dict]]) -> list[RoundStats]:
    """`submissions`: trial id -> that trial's verdicts in submission order."""
    rounds: dict[int, list[dict]] = defaultdict(list)
    for verdicts in submissions.values():
        for i, verdict in enumerate(verdicts, start=1):
            rounds[i].append(verdict)
    stats = []
    for r in sorted(rounds):
        verdicts = rounds[r]
        speeds = [v["speedup_vs_eager"] for v in verdicts if v.get("passed") and v.get("speedup_vs_eager")]
        geomean = math.exp(sum(map(math.log, speeds)) / len(speeds)) if speeds else None
        stats.append(RoundStats(r, len(verdicts), sum(bool(v.get("compiled")) for v in verdicts) / len(verdicts),
                                sum(bool(v.get("passed")) for v in verdicts) / len(verdicts), geomean))
    return stats


def slower_than_eager(trials: list[TrialRow]) -> tuple[int, int]:
    """(correct trials slower than eager PyTorch, correct trials with a measured speedup)."""
    speeds = [t.result["speedup_vs_eager"] for t in trials
              if t.status == "finished" and t.result and t.result.get("passed") and t.result.get("speedup_vs_eager")]
    return sum(s < 1.0 for s in speeds), len(speeds)


def _eta_squared(values: list[float], groups: list[str]) -> float | None:
    mean = sum(values) / len(values)
    total = sum((v - mean) ** 2 for v in values)
    if total == 0 or len(set(groups)) < 2:
        return None
    members: dict[str, list[float]] = defaultdict(list)
    for v, g in zip(values, groups):
        members[g].append(v)
    between = sum(len(m) * (sum(m) / len(m) - mean) ** 2 for m in members.values())
    return between / total


def variance_share(trials: list[TrialRow]) -> VarianceShare:
    """None where a grouping has a single level (one model, one family) or outcomes do not vary."""
    finished = [t for t in trials if t.status == "finished" and t.result is not None]
    if not finished:
        return VarianceShare(None, None, 0)
    values = [1.0 if t.result.get("passed") else 0.0 for t in finished]
    return VarianceShare(_eta_squared(values, [t.problem.split("/")[0] for t in finished]),
                         _eta_squared(values, [t.model for t in finished]), len(finished))
