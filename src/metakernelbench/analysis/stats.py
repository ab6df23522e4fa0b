"""Uncertainty for the metrics: Wilson intervals, problem-level bootstrap, exact McNemar, Wilcoxon, Holm, sign flips.

Pure functions with fixed seeds, so a report is reproducible to the digit. Problems, not pairs, are the unit of
resampling: the replicates and directions of one problem share its difficulty and are not independent.
Definitions are written out in docs/metrics.md.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence, TypeVar

import numpy as np
from scipy import stats as _st

from metakernelbench.analysis.metrics import THRESHOLDS, Pair, _beats, is_finished, outcome, summarise_pairs

T = TypeVar("T")


@dataclass(frozen=True)
class Interval:
    """A confidence interval [low, high] at `confidence`, around `estimate` (None when there is nothing to estimate)."""

    estimate: float | None
    low: float | None
    high: float | None
    confidence: float


def _z(confidence: float) -> float:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1, not {confidence}")
    return float(_st.norm.ppf(0.5 + confidence / 2))


def wilson(successes: int, n: int, confidence: float = 0.95) -> Interval:
    """Wilson score interval for a proportion: stays inside [0, 1] and is honest at 0/n and n/n, unlike Wald."""
    if not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return Interval(None, None, None, confidence)
    z = _z(confidence)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At 0/n and n/n the bound is exactly 0 or 1; computed, it comes out a rounding error inside (2.8e-17 at 0/6).
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Interval(p, low, high, confidence)


# -- bootstrap over problems ----------------------------------------------------------------------------------
def bootstrap_ci(items: Sequence[T], statistic: Callable[[list[T]], float | None],
                 cluster: Callable[[T], Hashable] = lambda p: p.problem, n_boot: int = 2000,
                 confidence: float = 0.95, seed: int = 0) -> Interval:
    """Percentile interval of `statistic` when whole problems (all their items together) are resampled with
    replacement; a resample on which the statistic is None is dropped."""
    groups: dict[Hashable, list[T]] = defaultdict(list)
    for it in items:
        groups[cluster(it)].append(it)
    keys = sorted(groups, key=repr)
    estimate = statistic(list(items)) if items else None
    if not keys:
        return Interval(None, None, None, confidence)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(keys), size=(n_boot, len(keys)))
    values = []
    for row in draws:
        v = statistic([it for i in row for it in groups[keys[i]]])
        if v is not None:
            values.append(v)
    if not values:
        return Interval(estimate, None, None, confidence)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(values, [alpha, 1 - alpha])
    return Interval(estimate, float(lo), float(hi), confidence)


def bootstrap_lift_s_ci(pairs: Sequence[Pair], n_boot: int = 2000, confidence: float = 0.95,
                        seed: int = 0) -> Interval:
    """`bootstrap_ci(pairs, lambda ps: summarise_pairs(ps).lift_s, ...)`, vectorised and equal to it to the bit:
    the same seeded draws of problems; each resample's R@t is its problems' summed counts of trials beating t over
    their summed pair counts, and S and the lift follow in the same floating-point order as `metrics.ladder`."""
    pairs = list(pairs)
    if not all(is_finished(p.treated) and is_finished(p.solo) for p in pairs):  # pairs are finished; if not, as is
        return bootstrap_ci(pairs, lambda ps: summarise_pairs(ps).lift_s, n_boot=n_boot, confidence=confidence,
                            seed=seed)
    groups: dict[Hashable, list[Pair]] = defaultdict(list)
    for p in pairs:
        groups[p.problem].append(p)
    keys = sorted(groups, key=repr)
    estimate = summarise_pairs(pairs).lift_s if pairs else None
    if not keys:
        return Interval(None, None, None, confidence)
    counts = np.array([len(groups[k]) for k in keys], dtype=np.int64)
    beats = {side: np.array([[sum(_beats(outcome(getattr(p, side)), t) for p in groups[k]) for t in THRESHOLDS]
                             for k in keys], dtype=np.int64) for side in ("treated", "solo")}
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(keys), size=(n_boot, len(keys)))
    n = counts[draws].sum(axis=1)

    def s_of(b: np.ndarray) -> np.ndarray:
        hits = b[draws].sum(axis=1)  # (n_boot, thresholds): exact integer counts
        total = hits[:, 0] / n
        for j in range(1, len(THRESHOLDS)):
            total = total + hits[:, j] / n
        return 100.0 * total / len(THRESHOLDS)

    values = s_of(beats["treated"]) - s_of(beats["solo"])
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(values, [alpha, 1 - alpha])
    return Interval(estimate, float(lo), float(hi), confidence)


def bootstrap_mean_ci(values: Sequence[float], clusters: Sequence[Hashable], n_boot: int = 2000,
                      confidence: float = 0.95, seed: int = 0) -> Interval:
    """The same problem bootstrap for the pooled mean of per-pair values (e.g. paired outcomes), vectorised: a
    resample's mean is its problems' summed values over their summed counts."""
    if len(values) != len(clusters):
        raise ValueError("values and clusters must have the same length")
    if not values:
        return Interval(None, None, None, confidence)
    sums: dict[Hashable, float] = defaultdict(float)
    counts: dict[Hashable, int] = defaultdict(int)
    for v, c in zip(values, clusters):
        sums[c] += v
        counts[c] += 1
    keys = sorted(sums, key=repr)
    s, n = np.array([sums[k] for k in keys]), np.array([counts[k] for k in keys])
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(keys), size=(n_boot, len(keys)))
    means = s[draws].sum(axis=1) / n[draws].sum(axis=1)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return Interval(float(np.mean(values)), float(lo), float(hi), confidence)


# -- tests on pairs -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class McNemar:
    """Exact McNemar: among pairs where exactly one trial is correct, is the treated arm the correct one more often
    than a fair coin would make it?"""

    treated_only: int  # treated correct, solo incorrect
    solo_only: int  # solo correct, treated incorrect
    p_value: float  # two-sided; 1.0 with no discordant pair


def mcnemar_exact(pairs: Sequence[Pair]) -> McNemar:
    """Two-sided exact binomial test of treated_only against Binomial(treated_only + solo_only, 1/2)."""
    b = sum(outcome(p.treated).passed and not outcome(p.solo).passed for p in pairs)
    c = sum(outcome(p.solo).passed and not outcome(p.treated).passed for p in pairs)
    return McNemar(b, c, mcnemar_p(b, c))


def mcnemar_p(b: int, c: int) -> float:
    """P-value of the exact McNemar test from the two discordant counts: min(1, 2 * P[X <= min(b, c)])."""
    n = b + c
    if n == 0:
        return 1.0
    return float(min(1.0, 2 * _st.binom.cdf(min(b, c), n, 0.5)))


@dataclass(frozen=True)
class Wilcoxon:
    """Wilcoxon signed-rank on ln(solo_ms / treated_ms) over pairs correct in both: is the treated arm faster?"""

    n: int  # pairs correct in both
    median_log_ratio: float | None  # > 0: treated faster
    statistic: float | None
    p_value: float | None  # two-sided; None with no non-zero ratio


def wilcoxon_speed(pairs: Sequence[Pair]) -> Wilcoxon:
    """Speed of the pairs where both trials are correct; exact ties (ratio 0) are dropped, as in Wilcoxon's
    original test."""
    ratios = [p.comparison.log_ratio for p in pairs if p.comparison.log_ratio is not None]
    if not ratios:
        return Wilcoxon(0, None, None, None)
    median = float(np.median(ratios))
    if not any(r != 0 for r in ratios):
        return Wilcoxon(len(ratios), median, None, None)
    res = _st.wilcoxon(ratios, zero_method="wilcox", alternative="two-sided")
    return Wilcoxon(len(ratios), median, float(res.statistic), float(res.pvalue))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values, in the input order: the i-th smallest p times (m - i + 1), made
    non-decreasing, capped at 1. Reject where adjusted p <= alpha; controls the family-wise error rate."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


@dataclass(frozen=True)
class SignFlip:
    """The noise range of the mean paired outcome under no transfer, and where the observed mean falls."""

    observed: float | None
    low: float | None  # quantile (1 - confidence) / 2 of the flipped means
    high: float | None  # quantile (1 + confidence) / 2
    p_value: float | None  # two-sided: share of flipped means with |mean| >= |observed|
    confidence: float


def sign_flip_range(outcomes: Sequence[float], n_perm: int = 10000, confidence: float = 0.95,
                    seed: int = 0) -> SignFlip:
    """Under no transfer a pair is as likely to improve as to regress, so each pair's outcome sign is flipped at
    random; the central range of the resulting means is what chance alone produces. A lift must leave it."""
    x = np.asarray(outcomes, dtype=float)
    if x.size == 0:
        return SignFlip(None, None, None, None, confidence)
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2, size=(n_perm, x.size))
    # (bits * 2 - 1) * x row-mean, a block of rows at a time: each row's mean is the same computation, without two
    # more n_perm × n temporaries (the bulk of the time on a large run)
    means = np.empty(n_perm)
    step = max(1, (1 << 22) // x.size)
    for i in range(0, n_perm, step):
        means[i:i + step] = ((bits[i:i + step] * 2 - 1) * x).mean(axis=1)
    observed = float(x.mean())
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    p = float((np.sum(np.abs(means) >= abs(observed) - 1e-12) + 1) / (n_perm + 1))
    return SignFlip(observed, float(lo), float(hi), p, confidence)
