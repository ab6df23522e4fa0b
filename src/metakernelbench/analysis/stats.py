"""Uncertainty for the metrics: Wilson intervals, problem bootstrap, exact McNemar, Wilcoxon, Holm, exact sign flips.

Pure functions with fixed seeds, so a report is reproducible to the digit. Problems, not pairs, are the unit of
resampling: the replicates and directions of one problem share its difficulty and are not independent.
Definitions are written out in docs/metrics.md.
"""
from __future__ import annotations

import functools
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence, TypeVar

import numpy as np
from scipy import signal as _sig
from scipy import stats as _st

from metakernelbench.analysis.metrics import Pair, outcome

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
    return _wilson(successes / n, float(n), confidence)


def _wilson(p: float, n: float, confidence: float) -> Interval:
    """Wilson's interval for an observed share p of n (n may be an effective, fractional count)."""
    z = _z(confidence)
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(max(0.0, p * (1 - p)) / n + z * z / (4 * n * n)) / denom
    # At 0/n and n/n the bound is exactly 0 or 1; computed, it comes out a rounding error inside (2.8e-17 at 0/6).
    low = 0.0 if p == 0 else max(0.0, centre - half)
    high = 1.0 if p == 1 else min(1.0, centre + half)
    return Interval(p, low, high, confidence)


# -- bootstrap over problems ----------------------------------------------------------------------------------
def _draws(k: int, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, k) problem indices: resample b draws k problems with replacement. Every bootstrap here draws these."""
    return np.random.default_rng(seed).integers(0, k, size=(n_boot, k))


def bootstrap_ci(items: Sequence[T], statistic: Callable[[list[T]], float | None],
                 cluster: Callable[[T], Hashable] = lambda p: p.problem, n_boot: int = 2000,
                 confidence: float = 0.95, seed: int = 0) -> Interval:
    """Percentile interval of `statistic` when whole problems (all their items together) are resampled with
    replacement; a resample on which the statistic is None is dropped. The definition; `Resampler` computes the
    same resamples of ratio-of-sums statistics at once."""
    groups: dict[Hashable, list[T]] = defaultdict(list)
    for it in items:
        groups[cluster(it)].append(it)
    keys = sorted(groups, key=repr)
    estimate = statistic(list(items)) if items else None
    if not keys:
        return Interval(None, None, None, confidence)
    values = []
    for row in _draws(len(keys), n_boot, seed):
        v = statistic([it for i in row for it in groups[keys[i]]])
        if v is not None:
            values.append(v)
    return percentile(estimate, np.array(values, dtype=float), confidence)


def percentile(estimate: float | None, values: np.ndarray, confidence: float = 0.95) -> Interval:
    """The (1 - c)/2 and (1 + c)/2 quantiles of resampled values, NaN (a resample without the statistic) dropped."""
    values = values[~np.isnan(values)]
    if estimate is None or values.size == 0:
        return Interval(estimate, None, None, confidence)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(values, [alpha, 1 - alpha])
    return Interval(estimate, float(lo), float(hi), confidence)


@dataclass(frozen=True)
class Resampler:
    """Per-problem sums of per-pair columns and their problem-bootstrap resamples (the draws of `bootstrap_ci`).
    Every statistic of the report is a ratio of two such sums (a rate, a mean, a lift), so one matrix product
    resamples all of them together: paired statistics of two arms over the same problems move as one."""

    problems: tuple[Hashable, ...]
    columns: tuple[str, ...]
    sums: np.ndarray  # (problems, columns)
    boot: np.ndarray  # (n_boot, columns): the column sums of each resample

    def total(self, column: str) -> float:
        return float(self.sums[:, self.columns.index(column)].sum())

    def ratio(self, num: str, den: str) -> tuple[float | None, np.ndarray]:
        """sum(num) / sum(den) and its resampled values (NaN where a resample's denominator is 0)."""
        i, j = self.columns.index(num), self.columns.index(den)
        d = self.total(den)
        estimate = self.total(num) / d if d else None
        den_b = self.boot[:, j]
        values = np.full(den_b.shape, np.nan)
        np.divide(self.boot[:, i], den_b, out=values, where=den_b > 0)
        return estimate, values


def resampler(clusters: Sequence[Hashable], columns: dict[str, Sequence[float]], n_boot: int = 2000,
              seed: int = 0) -> Resampler:
    """Sum every column per problem (`clusters` names each item's problem) and resample the problems."""
    keys = sorted(set(clusters), key=repr)
    names = tuple(columns)
    index = {k: i for i, k in enumerate(keys)}
    idx = np.fromiter((index[c] for c in clusters), dtype=np.int64, count=len(clusters))
    sums = np.zeros((len(keys), len(names)))
    for j, name in enumerate(names):
        sums[:, j] = np.bincount(idx, weights=np.asarray(columns[name], dtype=float), minlength=len(keys))
    if not keys:
        return Resampler((), names, sums, np.zeros((0, len(names))))
    return Resampler(tuple(keys), names, sums, _counts(len(keys), n_boot, seed) @ sums)


@functools.lru_cache(maxsize=16)
def _counts(k: int, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, k): how often each of k problems is drawn in each resample of `_draws` (shared by every cell of a
    report with the same number of problems; read-only)."""
    rows = _draws(k, n_boot, seed) + (np.arange(n_boot) * k)[:, None]
    counts = np.bincount(rows.ravel(), minlength=n_boot * k).reshape(n_boot, k).astype(float)
    counts.flags.writeable = False
    return counts


def cluster_rate_interval(estimate: float | None, values: np.ndarray, n: int, problems: int,
                          confidence: float = 0.95) -> Interval:
    """A rate's interval that respects that pairs of one problem are correlated: the Wilson interval on the
    effective number of independent pairs, n_eff = p(1 - p) / (problem-bootstrap variance of the rate), at most n;
    at 0/n or n/n, where the variance is 0, n_eff = the number of problems. Wilson keeps the bounds honest near 0
    and 1, where a percentile interval collapses to a point."""
    if estimate is None or n == 0:
        return Interval(None, None, None, confidence)
    values = values[~np.isnan(values)]
    var = float(values.var()) if values.size > 1 else 0.0
    p = estimate
    n_eff = min(float(n), p * (1 - p) / var) if var > 0 and 0 < p < 1 else float(min(n, problems))
    return _wilson(p, n_eff, confidence)


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
    return wilcoxon_ratios([p.comparison.log_ratio for p in pairs if p.comparison.log_ratio is not None])


def wilcoxon_ratios(ratios: Sequence[float]) -> Wilcoxon:
    """`wilcoxon_speed` on the log ratios themselves."""
    ratios = [float(r) for r in ratios]
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
    """The noise range of a mean of paired differences under no transfer, and where the observed mean falls."""

    observed: float | None
    low: float | None  # quantile (1 - confidence) / 2 of the sign-flip distribution of the mean
    high: float | None  # quantile (1 + confidence) / 2
    p_value: float | None  # two-sided: P(|flipped sum| >= |observed sum|)
    confidence: float


def _sign_flip_pmf(x: np.ndarray) -> tuple[np.ndarray, int]:
    """Exact distribution of sum(eps_i * x_i), eps_i independent fair signs, for integer x: (pmf, offset), pmf[j]
    the probability of the sum j - offset. Each magnitude a held by k values adds a * (2 * Binomial(k, 1/2) - k)."""
    mags, counts = np.unique(np.abs(x[x != 0]), return_counts=True)
    pmf, offset = np.ones(1), 0
    for a, k in zip(mags.astype(int), counts):
        part = np.zeros(2 * a * k + 1)
        part[::2 * a] = _st.binom.pmf(np.arange(k + 1), k, 0.5)
        big = pmf.size * part.size > 4_000_000  # direct convolution is exact; FFT is the fast one for long sums
        pmf = np.clip(_sig.fftconvolve(pmf, part), 0, None) if big else np.convolve(pmf, part)
        offset += a * k
    return pmf / pmf.sum(), offset


def sign_flip_range(values: Sequence[float], confidence: float = 0.95) -> SignFlip:
    """Under no transfer the two trials of a pair are exchangeable, so each paired difference is as likely to have
    either sign: the exact distribution of the mean over all 2^n sign flips is what chance alone produces (for
    +1/0/-1 outcomes, the exact sign test). A lift must leave its central range. Integer differences only."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return SignFlip(None, None, None, None, confidence)
    if not np.all(x == np.round(x)):
        raise ValueError("sign_flip_range takes integer paired differences (outcomes +1/0/-1, or their differences)")
    x = x.astype(np.int64)
    pmf, offset = _sign_flip_pmf(x)
    support = np.arange(pmf.size) - offset
    cdf = np.cumsum(pmf)
    alpha = (1 - confidence) / 2
    lo = support[min(np.searchsorted(cdf, alpha - 1e-12), pmf.size - 1)]
    hi = support[min(np.searchsorted(cdf, 1 - alpha - 1e-12), pmf.size - 1)]
    total = int(x.sum())
    p = float(min(1.0, pmf[np.abs(support) >= abs(total)].sum()))
    return SignFlip(total / x.size, float(lo) / x.size, float(hi) / x.size, p, confidence)
