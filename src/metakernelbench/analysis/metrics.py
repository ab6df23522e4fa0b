"""Benchmark metrics over recorded trials: ladders (R@t, S, fast_p), paired skill-vs-solo outcomes, relative standing.

Pure functions over lists of `TrialRow` (no I/O). Every definition here is also written out in docs/metrics.md;
the two must agree. Ladders measure finished trials only: skipped (no source skill), pending and running trials are
left out of every denominator and counted as `excluded`, so a missing result is never scored as a failure. Pairs
follow the paper by default: a skipped treated trial counts as its base (its solo counterpart), since nothing was
transferred; `skipped_as_base=False` gives our unpaired view, which leaves it out.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable

from metakernelbench.store import TrialRow

THRESHOLDS = (0.0, 0.5, 1.0, 2.0, 4.0)
TREATED_ARMS = ("skill", "placebo")
OUTCOME_NAMES = {1: "improved", 0: "tied", -1: "regressed"}
STANDING_NAMES = {1: "above", 0: "level", -1: "below"}


# -- per trial ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrialOutcome:
    """What one finished trial achieved; speed fields are None unless it passed."""

    passed: bool
    speedup_vs_eager: float | None
    median_ms: float | None
    noise_spread: float | None


def is_finished(row: TrialRow) -> bool:
    """Only finished trials carry a result that can be scored."""
    return row.status == "finished" and row.result is not None


def outcome(row: TrialRow) -> TrialOutcome:
    """A trial's outcome; a failed trial has no speed, whatever its last submission measured."""
    if not is_finished(row):
        raise ValueError(f"trial {row.trial_id} is {row.status}, not finished: filter with is_finished() first")
    r = row.result or {}
    passed = bool(r.get("passed"))
    if not passed:
        return TrialOutcome(False, None, None, None)
    return TrialOutcome(True, r.get("speedup_vs_eager"), r.get("median_ms"), r.get("noise_spread"))


# -- ladders: R@t, S, fast_p, geometric-mean speedup ----------------------------------------------------------
def _beats(o: TrialOutcome, t: float) -> bool:
    """The paper's rung: passed with speedup >= t. R@0 is the pass rate: a passing trial counts at t = 0 even when
    its speedup was not measured."""
    if not o.passed:
        return False
    if t == 0:
        return True
    return o.speedup_vs_eager is not None and o.speedup_vs_eager >= t


def fast_p(rows: Iterable[TrialRow], p: float) -> float | None:
    """KernelBench's fast_p: the fraction of finished trials that pass with speedup vs eager strictly > p (fast_0 =
    pass rate). None when no trial finished. Strict where R@t is not: a 1.00x kernel is in R@1, not in fast_1."""
    outs = [outcome(r) for r in rows if is_finished(r)]
    if not outs:
        return None
    return sum(o.passed and (p == 0 or (o.speedup_vs_eager is not None and o.speedup_vs_eager > p))
               for o in outs) / len(outs)


@dataclass(frozen=True)
class Ladder:
    """The score of a set of trials: R@t per threshold, S = 100 * mean R@t, and the speed of those that passed."""

    n: int  # finished trials: the denominator
    excluded: int  # skipped, pending or running trials, left out
    passed: int
    r_at: dict[float, float]  # threshold t -> R@t; empty when n == 0
    s: float | None  # 100 * mean over THRESHOLDS of R@t
    geomean_speedup: float | None  # over passing trials with a measured speedup


def geomean_speedup(rows: Iterable[TrialRow]) -> float | None:
    """exp(mean ln speedup) over passing trials with a measured speedup: the speed of what works, ratio-fair."""
    return _geomean(outcome(r) for r in rows if is_finished(r))


def _geomean(outs: Iterable[TrialOutcome]) -> float | None:
    logs = [math.log(o.speedup_vs_eager) for o in outs
            if o.passed and o.speedup_vs_eager is not None and o.speedup_vs_eager > 0]
    return math.exp(sum(logs) / len(logs)) if logs else None


def ladder(rows: Iterable[TrialRow], thresholds: tuple[float, ...] = THRESHOLDS) -> Ladder:
    """R@t for each t (fraction of finished trials passing with speedup >= t; R@0 = pass rate) and the paper's S."""
    rows = list(rows)
    outs = [outcome(r) for r in rows if is_finished(r)]
    n = len(outs)
    if n == 0:
        return Ladder(0, len(rows), 0, {}, None, None)
    r_at = {t: sum(_beats(o, t) for o in outs) / n for t in thresholds}
    return Ladder(n, len(rows) - n, sum(o.passed for o in outs), r_at, 100.0 * sum(r_at.values()) / len(r_at),
                  _geomean(outs))


def direction(row: TrialRow) -> str:
    """'source→target' for a skill or placebo trial; the DSL alone for a solo trial."""
    return f"{row.source_dsl}→{row.dsl}" if row.source_dsl else row.dsl


def family(row: TrialRow) -> str:
    """The problem's family: its id up to the first '/' (e.g. 'attention' for 'attention/03_flash_fwd')."""
    return row.problem.split("/", 1)[0]


GROUP_KEYS: dict[str, Callable[[TrialRow], str]] = {
    "arm": lambda r: r.arm, "model": lambda r: r.model, "direction": direction, "family": family}


def group(rows: Iterable[TrialRow], key: str | Callable[[TrialRow], str]) -> dict[str, list[TrialRow]]:
    """Rows split by a key: 'arm', 'model', 'direction', 'family', or any function of a row; keys sorted."""
    fn = GROUP_KEYS[key] if isinstance(key, str) else key
    out: dict[str, list[TrialRow]] = defaultdict(list)
    for r in rows:
        out[fn(r)].append(r)
    return dict(sorted(out.items()))


def ladders_by(rows: Iterable[TrialRow], key: str | Callable[[TrialRow], str],
               thresholds: tuple[float, ...] = THRESHOLDS) -> dict[str, Ladder]:
    """One ladder per group (see `group`)."""
    return {k: ladder(v, thresholds) for k, v in group(rows, key).items()}


# -- comparing two trials: correct beats incorrect, else faster beyond the noise ------------------------------
@dataclass(frozen=True)
class Comparison:
    """a versus b: +1 when a is better, -1 when worse, 0 when level. Speed fields only when both passed."""

    sign: int
    log_ratio: float | None  # ln(b.median_ms / a.median_ms): > 0 when a is faster
    margin: float | None  # ln(1 + max(a.noise_spread, b.noise_spread, min_margin))
    missing_noise: bool  # a passing trial without a recorded noise_spread (counted as 0)


def compare(a: TrialRow, b: TrialRow, min_margin: float = 0.0) -> Comparison:
    """Correct beats incorrect; two incorrect are level; two correct: a is better only when b.ms / a.ms exceeds
    1 + the larger relative spread of the two, so a difference inside the timing noise is a tie."""
    oa, ob = outcome(a), outcome(b)
    if oa.passed != ob.passed:
        return Comparison(1 if oa.passed else -1, None, None, False)
    if not oa.passed:
        return Comparison(0, None, None, False)
    for row, o in ((a, oa), (b, ob)):
        if o.median_ms is None or o.median_ms <= 0:
            raise ValueError(f"passing trial {row.trial_id} has no positive median_ms: its result is incomplete; "
                             "re-grade it or drop it before comparing")
    missing = oa.noise_spread is None or ob.noise_spread is None
    return Comparison(*_speed_sign(oa.median_ms, oa.noise_spread, ob.median_ms, ob.noise_spread, min_margin), missing)


def _speed_sign(ms_a: float, spread_a: float | None, ms_b: float, spread_b: float | None,
                min_margin: float) -> tuple[int, float, float]:
    """(sign, log ratio, margin) of a's speed against b's: the one rule for trials and for repeated gradings."""
    spread = max(spread_a or 0.0, spread_b or 0.0, min_margin)
    log_ratio, margin = math.log(ms_b / ms_a), math.log1p(spread)
    return (1 if log_ratio > margin else -1 if log_ratio < -margin else 0), log_ratio, margin


# -- identical code graded more than once: the measurement's own noise -----------------------------------------
@dataclass(frozen=True)
class RepeatedCode:
    """One file (by its hash) that passed in several submissions of a problem and DSL. Every grading ran in a fresh
    process, so the differences between its times are the noise of the measurement alone; a pair of them that
    `compare`'s rule does not call a tie is a difference the benchmark would have reported and should not have."""

    problem: str
    dsl: str
    file_sha256: str
    gradings: int
    fastest_ms: float
    slowest_ms: float
    pairs: int
    untied: int  # pairs of its gradings that the rule at this min_margin calls a difference

    @property
    def ratio(self) -> float:
        return self.slowest_ms / self.fastest_ms


def repeated_code(rows: Iterable[TrialRow], submissions: dict[str, list[dict]],
                  min_margin: float = 0.0) -> list[RepeatedCode]:
    """Group the passing submissions of `rows`' trials (Store.submission_outcomes: file_sha256, median_ms, spread)
    by problem, DSL and file hash; every group graded at least twice, in a stable order."""
    by_trial = {r.trial_id: r for r in rows}
    groups: dict[tuple[str, str, str], list[tuple[float, float | None]]] = defaultdict(list)
    for trial_id, subs in submissions.items():
        row = by_trial.get(trial_id)
        if row is None:
            continue
        for s in subs:
            if s.get("passed") and s.get("file_sha256") and (s.get("median_ms") or 0) > 0:
                groups[(row.problem, row.dsl, s["file_sha256"])].append((s["median_ms"], s.get("spread")))
    out = []
    for (problem, dsl, sha), times in sorted(groups.items()):
        if len(times) < 2:
            continue
        pairs = list(itertools.combinations(times, 2))
        untied = sum(_speed_sign(*a, *b, min_margin)[0] != 0 for a, b in pairs)
        ms = [t for t, _ in times]
        out.append(RepeatedCode(problem, dsl, sha, len(times), min(ms), max(ms), len(pairs), untied))
    return out


# -- paired per problem: skill (or placebo) vs its solo counterpart -------------------------------------------
@dataclass(frozen=True)
class Pair:
    """A treated (skill or placebo) trial and its solo counterpart: same run, model, problem, target DSL, replicate.
    When the treated trial was skipped (its source wrote no skill) and counts as its base, `treated` is that trial
    carrying its solo counterpart's result, and `base_stand_in` is True: nothing was transferred, so it ties."""

    treated: TrialRow
    solo: TrialRow
    comparison: Comparison  # treated versus solo
    base_stand_in: bool = False

    @property
    def outcome(self) -> int:
        return self.comparison.sign

    @property
    def problem(self) -> str:
        return self.treated.problem


def _solo_index(rows: list[TrialRow]) -> dict[tuple, TrialRow]:
    return {(r.run_id, r.model, r.problem, r.dsl, r.replicate): r for r in rows if r.arm == "solo"}


def _counterpart(solo: dict[tuple, TrialRow], r: TrialRow) -> TrialRow | None:
    s = solo.get((r.run_id, r.model, r.problem, r.dsl, r.replicate))
    return s if s is not None and is_finished(s) else None


def pair_trials(rows: Iterable[TrialRow], arm: str = "skill", min_margin: float = 0.0,
                skipped_as_base: bool = True) -> list[Pair]:
    """Every finished `arm` trial with its finished solo counterpart and, with `skipped_as_base` (the paper's rule),
    every skipped one too, counted as its base (a tie, with the solo's result); trials without a finished
    counterpart are left out (see `unpaired`). The run is part of the key, so pairs never cross runs."""
    rows = list(rows)
    solo = _solo_index(rows)
    pairs = []
    for r in rows:
        if r.arm != arm:
            continue
        s = _counterpart(solo, r)
        if s is None:
            continue
        if is_finished(r):
            pairs.append(Pair(r, s, compare(r, s, min_margin)))
        elif skipped_as_base and r.status == "skipped":
            stand_in = dataclasses.replace(r, status="finished", result=s.result)
            pairs.append(Pair(stand_in, s, compare(stand_in, s, min_margin), base_stand_in=True))
    return pairs


def unpaired(rows: Iterable[TrialRow], arm: str = "skill", skipped_as_base: bool = True) -> int:
    """How many `arm` trials `pair_trials` leaves out: unfinished (pending, running; skipped too unless
    `skipped_as_base`), or without a finished solo counterpart."""
    rows = list(rows)
    solo = _solo_index(rows)
    return sum(r.arm == arm and not ((is_finished(r) or (skipped_as_base and r.status == "skipped"))
                                     and _counterpart(solo, r) is not None) for r in rows)


def solo_noise_pairs(rows: Iterable[TrialRow], baseline_replicate: int = 0, control_replicate: int | None = None,
                     min_margin: float = 0.0) -> list[Pair]:
    """Solo vs solo: the control replicate (default: the highest solo replicate of each variant) as 'treated'
    against the baseline replicate. No skill differs between them, so their lift is the noise floor."""
    rows = list(rows)
    variants: dict[tuple, dict[int, TrialRow]] = defaultdict(dict)
    for r in rows:
        if r.arm == "solo":
            variants[(r.run_id, r.model, r.problem, r.dsl)][r.replicate] = r
    pairs = []
    for reps in variants.values():
        control = max(reps) if control_replicate is None else control_replicate
        a, b = reps.get(control), reps.get(baseline_replicate)
        if control != baseline_replicate and a and b and is_finished(a) and is_finished(b):
            pairs.append(Pair(a, b, compare(a, b, min_margin)))
    return pairs


@dataclass(frozen=True)
class PairedSummary:
    """Counts and lift over a set of pairs. Rates are None over zero pairs."""

    n: int
    improved: int
    tied: int
    regressed: int
    mean_outcome: float | None  # mean of +1 / 0 / -1
    s_treated: float | None  # S of the treated trials of these pairs
    s_solo: float | None  # S of their solo counterparts
    lift_s: float | None  # s_treated - s_solo
    improvement_rate: float | None  # improved / n
    regression_rate: float | None  # regressed / n
    missing_noise: int  # both-correct pairs in which a trial lacked noise_spread (counted as 0)


def summarise_pairs(pairs: list[Pair], thresholds: tuple[float, ...] = THRESHOLDS) -> PairedSummary:
    """Improved / tied / regressed counts, mean paired outcome, lift in S over exactly these pairs."""
    n = len(pairs)
    counts = {s: sum(p.outcome == s for p in pairs) for s in (1, 0, -1)}
    missing = sum(p.comparison.missing_noise for p in pairs)
    if n == 0:
        return PairedSummary(0, 0, 0, 0, None, None, None, None, None, None, 0)
    s_t = ladder([p.treated for p in pairs], thresholds).s
    s_s = ladder([p.solo for p in pairs], thresholds).s
    return PairedSummary(n, counts[1], counts[0], counts[-1], (counts[1] - counts[-1]) / n, s_t, s_s, s_t - s_s,
                         counts[1] / n, counts[-1] / n, missing)


def pairs_by(pairs: list[Pair], key: str | Callable[[TrialRow], str]) -> dict[str, list[Pair]]:
    """Pairs split by a key of their treated trial: 'model', 'direction', 'family', or a function of a row."""
    fn = GROUP_KEYS[key] if isinstance(key, str) else key
    out: dict[str, list[Pair]] = defaultdict(list)
    for p in pairs:
        out[fn(p.treated)].append(p)
    return dict(sorted(out.items()))


# -- relative standing: was the source DSL's solo ahead of the target DSL's solo? ------------------------------
@dataclass(frozen=True)
class StandingTable:
    """Pairs counted by standing (source solo vs target solo: above / level / below) x paired outcome
    (improved / tied / regressed), overall and split by whether the source solo passed."""

    cells: dict[str, dict[str, int]]  # standing -> outcome name -> count
    improve_rate: dict[str, float | None]  # standing -> improved / pairs in that standing
    regress_rate: dict[str, float | None]  # standing -> regressed / pairs in that standing
    by_source: dict[str, dict[str, dict[str, int]]]  # 'source passed' / 'source failed' -> cells
    missing_source: int  # pairs whose source solo is absent or unfinished, left out


def _empty_cells() -> dict[str, dict[str, int]]:
    return {s: {o: 0 for o in OUTCOME_NAMES.values()} for s in STANDING_NAMES.values()}


def standings(rows: Iterable[TrialRow], pairs: list[Pair], min_margin: float = 0.0) -> list[int | None]:
    """Each pair's standing: its source solo (same run, model, problem and replicate, in the source DSL) compared
    with its target solo by the same rule as `compare`: +1 above (the skill came from a better solo than the
    target's), 0 level, -1 below; None when the source solo is absent or unfinished."""
    solo = _solo_index(list(rows))
    out: list[int | None] = []
    for p in pairs:
        t = p.treated
        src = solo.get((t.run_id, t.model, t.problem, t.source_dsl, t.replicate))
        out.append(compare(src, p.solo, min_margin).sign if src is not None and is_finished(src) else None)
    return out


def standing_cells(pairs: list[Pair], signs: list[int | None]) -> dict[str, dict[str, int]]:
    """Pairs counted by standing x paired outcome, given each pair's standing (`standings`); None left out."""
    cells = _empty_cells()
    for p, sign in zip(pairs, signs):
        if sign is not None:
            cells[STANDING_NAMES[sign]][OUTCOME_NAMES[p.outcome]] += 1
    return cells


def relative_standing(rows: Iterable[TrialRow], pairs: list[Pair], min_margin: float = 0.0,
                      signs: list[int | None] | None = None) -> StandingTable:
    """Pairs counted by standing x paired outcome, overall and split by whether the source solo passed; `signs`:
    the pairs' `standings`, when the caller has them already."""
    rows = list(rows)
    solo = _solo_index(rows)
    signs = standings(rows, pairs, min_margin) if signs is None else signs
    cells = standing_cells(pairs, signs)
    split = {"source passed": _empty_cells(), "source failed": _empty_cells()}
    for p, sign in zip(pairs, signs):
        if sign is None:
            continue
        t = p.treated
        src = solo[(t.run_id, t.model, t.problem, t.source_dsl, t.replicate)]
        split["source passed" if outcome(src).passed else "source failed"][STANDING_NAMES[sign]][
            OUTCOME_NAMES[p.outcome]] += 1
    missing = sum(sign is None for sign in signs)

    def rate(standing: str, name: str) -> float | None:
        total = sum(cells[standing].values())
        return cells[standing][name] / total if total else None

    return StandingTable(cells, {s: rate(s, "improved") for s in cells}, {s: rate(s, "regressed") for s in cells},
                         split, missing)
