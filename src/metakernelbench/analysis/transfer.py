"""The paper's Table 1 for our trials: per model × direction, a treated arm's paired lift in correctness and runtime,
its paired outcome, regression rate and rates by relative standing, each with a problem-bootstrap interval and a
beats-noise mark (a test of no transfer, Holm-adjusted across the model × direction cells).

Holm rather than Benjamini–Hochberg: each cell's mark reads as a claim about that model and direction, so the chance
of any false mark among the cells is what must stay at alpha (the family-wise rate), and Holm keeps it there under
any dependence between cells, which share their problems; Benjamini–Hochberg bounds only the expected share of false
marks, and only under positive dependence. Every test is exact under no transfer, where the two trials of a pair
(and a skill trial and a fresh solo attempt against the same baseline) are exchangeable.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from metakernelbench.analysis import metrics as m
from metakernelbench.analysis import stats as st
from metakernelbench.store import TrialRow


@dataclass(frozen=True)
class Measure:
    """One statistic (in %), its problem-bootstrap interval, the same statistic for the solo control over the
    matched pairs, and the test of no transfer behind its beats-noise mark (None: nothing to test; each measure's
    test is named in report.LEGEND and docs/metrics.md)."""

    estimate: float | None
    low: float | None
    high: float | None
    n: int  # pairs in its denominator
    control: float | None
    p_value: float | None
    p_holm: float | None
    beats_noise: bool | None  # p_holm <= alpha


@dataclass(frozen=True)
class Row:
    """One model × direction (or every pair of the arm: model and direction 'all')."""

    model: str
    direction: str
    pairs: int
    skipped: int  # skipped treated trials counted as their base (ties)
    matched: int  # pairs with a solo-control pair of the same baseline solo
    improved: int
    tied: int
    regressed: int
    missing_noise: int  # both-correct pairs in which a trial lacked noise_spread (counted as 0)
    s_treated: float | None  # S of the pairs' treated trials
    s_solo: float | None  # S of their solo counterparts
    lift_s: st.Interval  # s_treated - s_solo, problem bootstrap
    correctness_lift: Measure  # (treated passed - solo passed) / pairs, percentage points
    runtime_lift: Measure  # exp(mean ln(solo_ms / treated_ms)) - 1 over pairs correct in both, %
    paired_outcome: Measure  # (improved - regressed) / pairs, %
    regression_rate: Measure  # regressed / pairs, %
    improve_when_above: Measure  # improved / pairs whose source solo stood above the target solo, %
    regress_when_below: Measure  # regressed / pairs whose source solo stood below, %
    mcnemar: st.McNemar
    wilcoxon: st.Wilcoxon
    noise_range: tuple[float | None, float | None]  # exact sign-flip range of paired_outcome, %
    sign_p: float | None  # exact sign test of the paired outcome
    control_diff: float | None  # mean (treated outcome - control outcome) over matched pairs, %
    control_p: float | None  # exact paired sign-flip test of control_diff


@dataclass(frozen=True)
class Table:
    """One treated arm's Table 1 (the skill arm's is the paper's)."""

    arm: str
    confidence: float
    alpha: float
    has_control: bool
    rows: list[Row]  # one per model × direction, Holm-adjusted among themselves
    overall: Row  # every pair of the arm, unadjusted


@dataclass(frozen=True)
class Units:
    """The pairs of one arm, each with its standing and its matched solo-control pair (None when unmatched)."""

    pairs: list[m.Pair]
    standing: list[int | None]
    control: list[m.Pair | None]


def units(rows: Sequence[TrialRow], pairs: list[m.Pair], control: list[m.Pair], min_margin: float = 0.0,
          standing: list[int | None] | None = None) -> Units:
    """A solo-control pair matches a treated pair when both compare against the same baseline solo trial: the
    control is then a fresh solo attempt exchangeable with the treated one under no transfer. `standing`: the
    pairs' `metrics.standings`, when the caller has them already."""
    by_baseline = {p.solo.trial_id: p for p in control}
    return Units(pairs, m.standings(rows, pairs, min_margin) if standing is None else standing,
                 [by_baseline.get(p.solo.trial_id) for p in pairs])


def _flags(pairs: Sequence[m.Pair | None], fn: Callable[[m.Pair], float]) -> np.ndarray:
    return np.array([0.0 if p is None else float(fn(p)) for p in pairs])


def _s_of(o: m.TrialOutcome) -> float:
    """One trial's share of S: 100 * mean over thresholds of its rung indicators (S of trials is their mean)."""
    return 100.0 * sum(m._beats(o, t) for t in m.THRESHOLDS) / len(m.THRESHOLDS)


def columns(u: Units) -> dict[str, np.ndarray]:
    """Per-pair columns whose per-problem sums give every statistic of a Row as a ratio of sums (c_*: the matched
    control pair's value; 0 when unmatched)."""
    ps, ctl = u.pairs, u.control
    standing = np.array([np.nan if s is None else s for s in u.standing], dtype=float)
    treated, solo = [m.outcome(p.treated) for p in ps], [m.outcome(p.solo) for p in ps]
    out = {"n": np.ones(len(ps)), "stand_in": _flags(ps, lambda p: p.base_stand_in),
           "s_treated": np.array([_s_of(o) for o in treated]), "s_solo": np.array([_s_of(o) for o in solo]),
           "missing_noise": _flags(ps, lambda p: p.comparison.missing_noise),
           "pass_diff": np.array([a.passed - b.passed for a, b in zip(treated, solo)], dtype=float),
           "c_pass_diff": _flags(ctl, lambda p: m.outcome(p.treated).passed - m.outcome(p.solo).passed)}
    out["s_diff"] = out["s_treated"] - out["s_solo"]
    for prefix, side in (("", ps), ("c_", ctl)):
        out[prefix + "both"] = _flags(side, lambda p: p.comparison.log_ratio is not None)
        out[prefix + "log_ratio"] = _flags(side, lambda p: p.comparison.log_ratio or 0.0)
        out[prefix + "outcome"] = _flags(side, lambda p: p.outcome)
        out[prefix + "improved"] = (out[prefix + "outcome"] == 1).astype(float)
        out[prefix + "regressed"] = (out[prefix + "outcome"] == -1).astype(float)
    out["matched"] = _flags(ctl, lambda p: 1)
    for name, sign, o in (("above", 1, "improved"), ("below", -1, "regressed")):
        out[name] = (standing == sign).astype(float)
        out["m_" + name] = out[name] * out["matched"]
        out[f"{name}_{o}"] = out[name] * out[o]
        out[f"c_{name}_{o}"] = out["m_" + name] * out["c_" + o]
    return out


def _pct(x: float | None) -> float | None:
    return None if x is None else 100.0 * x


def _lift(rs: st.Resampler, num: str, den: str, confidence: float, scale: float = 100.0) -> st.Interval:
    est, vals = rs.ratio(num, den)
    iv = st.percentile(est, vals, confidence)
    return st.Interval(*(None if v is None else scale * v for v in (iv.estimate, iv.low, iv.high)), confidence)


def _rate(rs: st.Resampler, num: str, den: str, confidence: float) -> st.Interval:
    est, vals = rs.ratio(num, den)
    iv = st.cluster_rate_interval(est, vals, int(rs.total(den)), len(rs.problems), confidence)
    return st.Interval(*(_pct(v) for v in (iv.estimate, iv.low, iv.high)), confidence)


def _runtime(rs: st.Resampler, confidence: float, prefix: str = "") -> st.Interval:
    est, vals = rs.ratio(prefix + "log_ratio", prefix + "both")
    iv = st.percentile(est, vals, confidence)
    return st.Interval(*(None if v is None else 100.0 * math.expm1(v) for v in (iv.estimate, iv.low, iv.high)),
                       confidence)


def _discordant(col: dict[str, np.ndarray], mask: np.ndarray, a: str, b: str) -> float | None:
    """Exact McNemar between the treated and the matched control on one 0/1 column, over matched pairs in `mask`;
    None when no pair is in `mask`."""
    if not mask.any():
        return None
    x, y = col[a][mask > 0], col[b][mask > 0]
    return st.mcnemar_p(int(((x > 0) & (y == 0)).sum()), int(((y > 0) & (x == 0)).sum()))


MEASURES = ("correctness_lift", "runtime_lift", "paired_outcome", "regression_rate", "improve_when_above",
            "regress_when_below")


def _row(model: str, direction: str, col: dict[str, np.ndarray], problems: list[str], n_boot: int,
         confidence: float) -> tuple[Row, dict[str, float | None]]:
    """A Row with p_holm unset, and the raw p-value of each measure."""
    rs = st.resampler(problems, col, n_boot)
    matched = col["matched"] > 0
    has_ctl = bool(matched.any())

    def ctl(num: str, den: str) -> float | None:
        return _pct(rs.ratio(num, den)[0]) if has_ctl else None

    sign = st.sign_flip_range(col["outcome"])
    vs_ctl = st.sign_flip_range((col["outcome"] - col["c_outcome"])[matched]) if has_ctl else None
    outcome_p = max(sign.p_value, vs_ctl.p_value) if vs_ctl else sign.p_value
    b, c = int((col["pass_diff"] > 0).sum()), int((col["pass_diff"] < 0).sum())
    wx = st.wilcoxon_ratios(col["log_ratio"][col["both"] > 0])
    raw = {"correctness_lift": st.mcnemar_p(b, c) if b + c else None,
           "runtime_lift": wx.p_value,
           "paired_outcome": outcome_p,
           "regression_rate": _discordant(col, col["matched"], "regressed", "c_regressed"),
           "improve_when_above": _discordant(col, col["m_above"], "above_improved", "c_above_improved"),
           "regress_when_below": _discordant(col, col["m_below"], "below_regressed", "c_below_regressed")}
    ivs = {"correctness_lift": (_lift(rs, "pass_diff", "n", confidence), "n", ctl("c_pass_diff", "matched")),
           "runtime_lift": (_runtime(rs, confidence), "both",
                            _runtime(rs, confidence, "c_").estimate if has_ctl else None),
           "paired_outcome": (_lift(rs, "outcome", "n", confidence), "n", ctl("c_outcome", "matched")),
           "regression_rate": (_rate(rs, "regressed", "n", confidence), "n", ctl("c_regressed", "matched")),
           "improve_when_above": (_rate(rs, "above_improved", "above", confidence), "above",
                                  ctl("c_above_improved", "m_above")),
           "regress_when_below": (_rate(rs, "below_regressed", "below", confidence), "below",
                                  ctl("c_below_regressed", "m_below"))}
    measures = {k: Measure(iv.estimate, iv.low, iv.high, int(rs.total(den)), c, raw[k], None, None)
                for k, (iv, den, c) in ivs.items()}
    n = len(problems)
    s_t, s_s = rs.ratio("s_treated", "n")[0], rs.ratio("s_solo", "n")[0]
    counts = {k: int(rs.total(k)) for k in ("improved", "regressed")}
    row = Row(model, direction, n, int(rs.total("stand_in")), int(rs.total("matched")), counts["improved"],
              n - counts["improved"] - counts["regressed"], counts["regressed"], int(rs.total("missing_noise")),
              s_t, s_s, _lift(rs, "s_diff", "n", confidence, scale=1.0), **measures,
              mcnemar=st.McNemar(b, c, st.mcnemar_p(b, c)), wilcoxon=wx,
              noise_range=(_pct(sign.low), _pct(sign.high)), sign_p=sign.p_value,
              control_diff=_pct(vs_ctl.observed) if vs_ctl else None, control_p=vs_ctl.p_value if vs_ctl else None)
    return row, raw


def _with_holm(row: Row, adjusted: dict[str, float | None], alpha: float) -> Row:
    def mark(meas: Measure, p: float | None) -> Measure:
        return dataclasses.replace(meas, p_holm=p, beats_noise=None if p is None else p <= alpha)
    return dataclasses.replace(row, **{k: mark(getattr(row, k), adjusted[k]) for k in MEASURES})


def table(arm: str, u: Units, n_boot: int = 2000, confidence: float = 0.95) -> Table:
    """Table 1 of one treated arm: a row per model × direction, each measure's p Holm-adjusted across those rows
    (one family per measure), and the pooled row with its own, unadjusted tests."""
    alpha = round(1 - confidence, 10)  # 0.05, not 0.050000000000000044
    col = columns(u)
    problems = [p.problem for p in u.pairs]
    cells: dict[tuple[str, str], list[int]] = {}
    for i, p in enumerate(u.pairs):
        cells.setdefault((p.treated.model, m.direction(p.treated)), []).append(i)
    built = []
    for (model, d), idx in sorted(cells.items()):
        ix = np.array(idx)
        built.append(_row(model, d, {k: v[ix] for k, v in col.items()}, [problems[i] for i in idx], n_boot,
                          confidence))
    adjusted: list[dict[str, float | None]] = [dict.fromkeys(MEASURES) for _ in built]
    for k in MEASURES:
        idx = [i for i, (_, raw) in enumerate(built) if raw[k] is not None]
        for i, a in zip(idx, st.holm([built[i][1][k] for i in idx])):
            adjusted[i][k] = a
    rows = [_with_holm(r, adjusted[i], alpha) for i, (r, _) in enumerate(built)]
    overall, raw = _row("all", "all", col, problems, n_boot, confidence)
    return Table(arm, confidence, alpha, any(c is not None for c in u.control), rows, _with_holm(overall, raw, alpha))


# -- standing: the skill arm's rates against a control's, by standing -----------------------------------------
def control_in_place(pairs: list[m.Pair], control: list[m.Pair]) -> list[m.Pair]:
    """The solo control in the treated arm's place: for each treated pair, the control pair of the same baseline
    solo, its treated row labelled with the treated pair's source DSL and replicate so that `metrics.standings`
    finds the same source solo."""
    by_baseline = {p.solo.trial_id: p for p in control}
    out = []
    for p in pairs:
        c = by_baseline.get(p.solo.trial_id)
        if c is not None:
            row = dataclasses.replace(c.treated, source_dsl=p.treated.source_dsl, replicate=p.treated.replicate)
            out.append(m.Pair(row, c.solo, c.comparison))
    return out


@dataclass(frozen=True)
class Excess:
    """The skill arm's improve (or regress) rate in one standing minus a control arm's, in percentage points, with
    the problem-bootstrap interval that resamples both arms' pairs of a problem together."""

    standing: str
    rate: str  # 'improve_rate' or 'regress_rate'
    skill: float | None
    control: float | None
    excess: float | None
    low: float | None
    high: float | None
    pairs: int  # skill pairs in this standing
    control_pairs: int


def standing_excess(skill: list[m.Pair], skill_standing: list[int | None], other: list[m.Pair],
                    other_standing: list[int | None], n_boot: int = 2000, confidence: float = 0.95) -> list[Excess]:
    """Per standing, the skill rate minus the other arm's (placebo, or the solo control put in the skill arm's
    place), each over its own pairs; one problem bootstrap resamples both arms' pairs of a problem together."""
    n_s, n_o = len(skill), len(other)
    cols: dict[str, np.ndarray] = {}
    for arm, ps, stds, before, after in (("s", skill, skill_standing, 0, n_o), ("o", other, other_standing, n_s, 0)):
        pad = (np.zeros(before), np.zeros(after))
        for sign, name in m.STANDING_NAMES.items():
            inside = np.array([x == sign for x in stds], dtype=float)
            cols[f"{arm}_{name}"] = np.concatenate([pad[0], inside, pad[1]])
            for rate, val in (("improve_rate", 1), ("regress_rate", -1)):
                hit = inside * np.array([p.outcome == val for p in ps], dtype=float)
                cols[f"{arm}_{name}_{rate}"] = np.concatenate([pad[0], hit, pad[1]])
    rs = st.resampler([p.problem for p in skill] + [p.problem for p in other], cols, n_boot)
    out = []
    for name in m.STANDING_NAMES.values():
        for rate in ("improve_rate", "regress_rate"):
            es, vs = rs.ratio(f"s_{name}_{rate}", f"s_{name}")
            eo, vo = rs.ratio(f"o_{name}_{rate}", f"o_{name}")
            iv = st.percentile(None if es is None or eo is None else es - eo, vs - vo, confidence)
            out.append(Excess(name, rate, _pct(es), _pct(eo), _pct(iv.estimate), _pct(iv.low), _pct(iv.high),
                              int(rs.total(f"s_{name}")), int(rs.total(f"o_{name}"))))
    return out


def excess_sentence(excess: list[Excess], control: str) -> str:
    """The standing comparison in one plain sentence: improvement where the source stood above, regression where it
    stood below, each against `control` in the skill arm's place."""
    by = {(e.standing, e.rate): e for e in excess}
    parts = []
    for standing, rate, verb in (("above", "improve_rate", "improved"), ("below", "regress_rate", "regressed")):
        e = by[(standing, rate)]
        if e.excess is None or e.low is None:
            parts.append(f"no pairs of both arms stood {standing}")
            continue
        verdict = "beyond noise" if e.low > 0 or e.high < 0 else "within noise (the interval includes 0)"
        parts.append(f"where the source solo stood {standing} the target's solo, skill trials {verb} in "
                     f"{e.skill:.0f}% of {e.pairs} pairs against {e.control:.0f}% of {e.control_pairs}: "
                     f"{e.excess:+.1f} points (95% CI {e.low:+.1f} to {e.high:+.1f}, problem bootstrap), {verdict}")
    return f"Against the {control}: " + "; ".join(parts) + "."


NO_CONTROL_CAVEAT = ("No solo control in this run, so this table cannot tell transfer from regression to the mean: a "
                     "target solo that stood below its source was likely an unlucky attempt, so any fresh attempt "
                     "tends to improve on it, and one that stood above tends to fall back, with no skill at all. "
                     "Run with the solo control replicate to measure that pattern.")
