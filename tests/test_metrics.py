"""Metrics and statistics recover known truths from synthetic trials: hand-computed tiny cases and generated ones."""
from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
from scipy import stats as st

from metakernelbench.analysis import metrics as m
from metakernelbench.analysis import stats as s
from metakernelbench.store import TrialRow

_ids = itertools.count()


def row(arm: str, problem: str, dsl: str, passed: bool | None, speed: float | None = None, ms: float | None = None,
        spread: float | None = 0.0, rep: int = 0, src: str | None = None, model: str = "m", run: str = "r",
        status: str = "finished") -> TrialRow:
    result = None
    if status == "finished":
        result = {"passed": bool(passed), "speedup_vs_eager": speed if passed else None,
                  "median_ms": (ms if ms is not None else 1.0) if passed else None,
                  "noise_spread": spread if passed else None}
    elif status == "skipped":
        result = {"skipped": "the source solo trial wrote no skill"}
    return TrialRow(f"t{next(_ids)}", run, model, problem, dsl, arm, rep, src, None, status, 1, result, None, None,
                    None)


# -- ladders -------------------------------------------------------------------------------------------------
def ladder_rows():
    return [row("solo", "a/1", "cute", False), row("solo", "a/2", "cute", True, 0.4),
            row("solo", "b/1", "cute", True, 0.8), row("solo", "b/2", "cute", True, 1.5),
            row("solo", "b/3", "cute", True, 5.0), row("skill", "b/4", "cute", None, src="tirx", status="skipped"),
            row("solo", "b/5", "cute", None, status="pending")]


def test_ladder_hand_computed():
    lad = m.ladder(ladder_rows())
    assert (lad.n, lad.excluded, lad.passed) == (5, 2, 4)
    assert lad.r_at == pytest.approx({0.0: 0.8, 0.5: 0.6, 1.0: 0.4, 2.0: 0.2, 4.0: 0.2})
    assert lad.s == pytest.approx(44.0)  # 100 * (0.8 + 0.6 + 0.4 + 0.2 + 0.2) / 5
    assert lad.geomean_speedup == pytest.approx((0.4 * 0.8 * 1.5 * 5.0) ** 0.25)


def test_fast_p_is_strict_and_fast_0_is_pass_rate():
    rows = ladder_rows() + [row("solo", "c/1", "cute", True, 1.0)]  # exactly 1.0x is not faster than 1.0
    assert m.fast_p(rows, 0) == pytest.approx(5 / 6)
    assert m.fast_p(rows, 1.0) == pytest.approx(2 / 6)
    assert m.fast_p(rows, 0.9) == pytest.approx(3 / 6)
    assert m.fast_p([], 1.0) is None
    # a pass without a measured speedup counts at t = 0 only
    assert m.ladder([row("solo", "x/1", "cute", True, None)]).r_at == {0.0: 1.0, 0.5: 0.0, 1.0: 0.0, 2.0: 0.0,
                                                                       4.0: 0.0}


def test_r_at_counts_speedup_at_least_t_as_the_paper_does():
    """The paper's R@t is speedup >= t: a kernel exactly at a threshold reaches that rung (KernelBench's fast_p,
    strict, does not)."""
    rows = [row("solo", f"e/{i}", "cute", True, t) for i, t in enumerate((0.5, 1.0, 2.0, 4.0))]
    lad = m.ladder(rows)
    assert lad.r_at == pytest.approx({0.0: 1.0, 0.5: 1.0, 1.0: 0.75, 2.0: 0.5, 4.0: 0.25})
    assert lad.s == pytest.approx(100 * (1 + 1 + 0.75 + 0.5 + 0.25) / 5)
    assert m.fast_p(rows, 1.0) == pytest.approx(0.5) and m.fast_p(rows, 4.0) == 0.0


def test_empty_ladder_and_unfinished_outcome():
    lad = m.ladder([row("skill", "a/1", "cute", None, status="skipped")])
    assert (lad.n, lad.excluded, lad.s, lad.geomean_speedup) == (0, 1, None, None)
    with pytest.raises(ValueError, match="is_finished"):
        m.outcome(row("solo", "a/1", "cute", None, status="running"))


def test_groups():
    rows = [row("solo", "att/1", "cute", True, 2.0), row("solo", "att/2", "tirx", False, model="n"),
            row("skill", "moe/1", "tirx", True, 0.7, src="cute"), row("placebo", "moe/1", "tirx", False, src="cute")]
    assert list(m.ladders_by(rows, "arm")) == ["placebo", "skill", "solo"]
    assert {k: len(v) for k, v in m.group(rows, "direction").items()} == {"cute": 1, "cute→tirx": 2, "tirx": 1}
    fam = m.ladders_by(rows, "family")
    assert fam["att"].r_at[0.0] == 0.5 and fam["moe"].r_at[0.5] == 0.5 and fam["moe"].r_at[1.0] == 0.0
    assert m.ladders_by(rows, "model")["n"].s == 0.0


# -- pairs ---------------------------------------------------------------------------------------------------
# problem: (solo target, skill target, source solo); each (passed, speedup, ms, spread)
F = (False, None, None, None)
TINY = {
    "p/1": (F, (True, 0.6, 1.0, 0.0), (True, 1.0, 1.0, 0.0)),  # improved; source above
    "p/2": ((True, 1.1, 1.0, 0.0), F, F),  # regressed; below
    "p/3": (F, F, F),  # tied; level
    "p/4": ((True, 2.2, 1.0, 0.05), (True, 2.5, 0.9, 0.02), (True, 3.0, 0.5, 0.05)),  # 1/0.9 > 1.05: improved; above
    "p/5": ((True, 1.1, 1.0, 0.2), (True, 1.2, 0.9, 0.0), (True, 1.0, 1.1, 0.0)),  # 1.11 < 1.2: tied; level
    "q/6": ((True, 0.45, 1.0, 0.01), (True, 0.3, 1.5, 0.01), (True, 0.2, 2.0, 0.01)),  # regressed; below
    "q/7": (F, (True, 4.5, 1.0, 0.0), (True, 1.0, 1.0, 0.0)),  # improved; above
}


def tiny_rows():
    rows = []
    for p, (solo, skill, source) in TINY.items():
        rows.append(row("solo", p, "tirx", solo[0], solo[1], solo[2], solo[3]))
        rows.append(row("skill", p, "tirx", skill[0], skill[1], skill[2], skill[3], src="cute"))
        rows.append(row("solo", p, "cute", source[0], source[1], source[2], source[3]))
        # distractors: the solo noise-control replicate, a placebo, another run: none may enter the skill pairs
        rows.append(row("solo", p, "tirx", True, 9.0, 0.01, rep=1))
        rows.append(row("placebo", p, "tirx", True, 9.0, 0.01, src="cute"))
        rows.append(row("solo", p, "tirx", True, 9.0, 0.01, run="other"))
    rows.append(row("skill", "p/8", "tirx", None, src="cute", status="skipped"))
    rows.append(row("solo", "p/8", "tirx", True, 1.0))
    return rows


def test_paired_counts_lift_and_regression_rate():
    rows = tiny_rows()
    pairs = m.pair_trials(rows, "skill", skipped_as_base=False)  # our view: the skipped p/8 is left out
    assert {p.problem: p.outcome for p in pairs} == {"p/1": 1, "p/2": -1, "p/3": 0, "p/4": 1, "p/5": 0, "q/6": -1,
                                                     "q/7": 1}
    assert m.unpaired(rows, "skill", skipped_as_base=False) == 1
    summ = m.summarise_pairs(pairs)
    assert (summ.n, summ.improved, summ.tied, summ.regressed, summ.missing_noise) == (7, 3, 2, 2, 0)
    assert summ.mean_outcome == pytest.approx(1 / 7)
    assert summ.regression_rate == pytest.approx(2 / 7) and summ.improvement_rate == pytest.approx(3 / 7)
    # skill R@t = 5,4,3,2,1 of 7 -> S = 300/7; solo R@t = 4,3,3,1,0 of 7 -> S = 220/7
    assert summ.s_treated == pytest.approx(300 / 7)
    assert summ.s_solo == pytest.approx(220 / 7)
    assert summ.lift_s == pytest.approx(80 / 7)
    p4 = next(p for p in pairs if p.problem == "p/4")
    assert p4.comparison.log_ratio == pytest.approx(math.log(1 / 0.9))
    assert p4.comparison.margin == pytest.approx(math.log(1.05))
    by_family = {k: m.summarise_pairs(v).n for k, v in m.pairs_by(pairs, "family").items()}
    assert by_family == {"p": 5, "q": 2}
    placebo = m.summarise_pairs(m.pair_trials(rows, "placebo"))
    assert (placebo.improved, placebo.tied, placebo.regressed) == (7, 0, 0)  # passing in 0.01 ms beats every solo


def test_a_skipped_skill_trial_counts_as_its_base_as_in_the_paper():
    """p/8's source wrote no skill: by the paper's rule its skill trial is its base (the solo, 1.0x), a tie."""
    rows = tiny_rows()
    pairs = m.pair_trials(rows, "skill")
    p8 = next(p for p in pairs if p.problem == "p/8")
    assert p8.base_stand_in and p8.outcome == 0 and p8.treated.result == p8.solo.result
    assert p8.treated.trial_id != p8.solo.trial_id and p8.treated.arm == "skill"
    assert m.unpaired(rows, "skill") == 0 and sum(p.base_stand_in for p in pairs) == 1
    summ = m.summarise_pairs(pairs)
    assert (summ.n, summ.improved, summ.tied, summ.regressed) == (8, 3, 3, 2)
    # skill R@t (>= t) = 6,5,4,2,1 of 8 -> S = 45; solo = 5,4,4,1,0 of 8 -> S = 35 (1.0x reaches R@1)
    assert summ.s_treated == pytest.approx(45.0) and summ.s_solo == pytest.approx(35.0)
    assert summ.lift_s == pytest.approx(10.0)
    # a skipped trial whose solo counterpart is unfinished is left out either way
    lone = [row("skill", "z/1", "tirx", None, src="cute", status="skipped"),
            row("solo", "z/1", "tirx", None, status="pending")]
    assert m.pair_trials(lone) == [] and m.unpaired(lone) == 1


def test_noise_margin_rules():
    a = row("skill", "x/1", "tirx", True, 1.0, ms=1.0, spread=0.1)
    b = row("solo", "x/1", "tirx", True, 1.0, ms=1.09, spread=0.0)
    assert m.compare(a, b).sign == 0  # 1.09 / 1.0 is not beyond 1 + 0.1 (the larger spread)
    assert m.compare(b, a).sign == 0
    faster = row("solo", "x/1", "tirx", True, 1.0, ms=1.15, spread=0.0)
    assert m.compare(a, faster).sign == 1 and m.compare(faster, a).sign == -1
    assert m.compare(a, faster, min_margin=0.2).sign == 0  # the floor widens the margin
    assert m.compare(row("skill", "x/1", "tirx", False), row("solo", "x/1", "tirx", False)).sign == 0
    c = m.compare(row("skill", "x/1", "tirx", True, 1.0, ms=1.0, spread=None), b)
    assert c.sign == 1 and c.missing_noise  # a missing spread counts as 0, and is flagged
    with pytest.raises(ValueError, match="median_ms"):
        m.compare(row("skill", "x/1", "tirx", True, 1.0, ms=0.0), b)


def test_relative_standing_cells():
    rows = tiny_rows()
    table = m.relative_standing(rows, m.pair_trials(rows, "skill"))
    assert table.cells == {"above": {"improved": 3, "tied": 0, "regressed": 0},
                           "level": {"improved": 0, "tied": 2, "regressed": 0},
                           "below": {"improved": 0, "tied": 0, "regressed": 2}}
    assert table.improve_rate == {"above": 1.0, "level": 0.0, "below": 0.0}
    assert table.regress_rate == {"above": 0.0, "level": 0.0, "below": 1.0}
    assert table.by_source["source passed"] == {"above": {"improved": 3, "tied": 0, "regressed": 0},
                                                "level": {"improved": 0, "tied": 1, "regressed": 0},
                                                "below": {"improved": 0, "tied": 0, "regressed": 1}}
    assert table.by_source["source failed"] == {"above": {"improved": 0, "tied": 0, "regressed": 0},
                                                "level": {"improved": 0, "tied": 1, "regressed": 0},
                                                "below": {"improved": 0, "tied": 0, "regressed": 1}}
    assert table.missing_source == 1  # p/8's skill trial (skipped, counted as its base) has no source solo
    assert m.standings(rows, m.pair_trials(rows, "skill"))[-1] is None


def test_solo_noise_pairs():
    rows = tiny_rows()
    noise = m.solo_noise_pairs(rows)
    # per run and DSL: 'r' has tirx reps 0 and 1 for 8 problems (p/8 only rep 0) and cute rep 0 only
    assert len(noise) == 7 and all(p.treated.replicate == 1 and p.solo.replicate == 0 for p in noise)


# problem kinds: (solo, skill, source) built so the outcome and standing are known by construction
KINDS = {
    "gain_correct": (F, (True, 1.5, 1.0, 0.05), F, 1, 0),
    "lose_correct": ((True, 1.5, 1.0, 0.05), F, F, -1, -1),
    "both_fail": (F, F, (True, 1.0, 1.0, 0.05), 0, 1),
    "faster": ((True, 1.0, 2.0, 0.1), (True, 3.0, 1.0, 0.1), (True, 1.0, 2.05, 0.1), 1, 0),
    "slower": ((True, 2.0, 1.0, 0.1), (True, 0.6, 1.5, 0.1), (True, 2.5, 0.5, 0.1), -1, 1),
    "same": ((True, 2.0, 1.0, 0.1), (True, 2.0, 1.03, 0.1), (True, 0.1, 9.0, 0.1), 0, -1),
}


def test_generated_case_recovers_ground_truth():
    rng = random.Random(7)
    rows, truth = [], []
    for i in range(150):
        for src, tgt in (("cute", "tirx"), ("tirx", "cute")):
            kind = rng.choice(sorted(KINDS))
            solo, skill, source, out, standing = KINDS[kind]
            p = f"fam{i % 5}/{i}"
            truth.append((p, src, kind, out, standing))
            rows.append(row("skill", p, tgt, skill[0], skill[1], skill[2], skill[3], src=src, model=f"k{i % 2}",
                            run=f"{p}>{tgt}"))
            rows.append(row("solo", p, tgt, *solo, model=f"k{i % 2}", run=f"{p}>{tgt}"))
            rows.append(row("solo", p, src, *source, model=f"k{i % 2}", run=f"{p}>{tgt}"))
    pairs = m.pair_trials(rows)
    summ = m.summarise_pairs(pairs)
    outs = [t[3] for t in truth]
    assert (summ.n, summ.improved, summ.tied, summ.regressed) == (300, outs.count(1), outs.count(0), outs.count(-1))
    assert summ.mean_outcome == pytest.approx(sum(outs) / 300)
    # S by construction: each kind's skill and solo speed rung
    def s_of(side):
        ladder = []
        for t in (0, 0.5, 1, 2, 4):
            ok = [KINDS[k][side][0] and (t == 0 or KINDS[k][side][1] >= t) for _, _, k, _, _ in truth]
            ladder.append(sum(ok) / len(ok))
        return 100 * sum(ladder) / 5
    assert summ.s_treated == pytest.approx(s_of(1)) and summ.s_solo == pytest.approx(s_of(0))
    assert summ.lift_s == pytest.approx(s_of(1) - s_of(0))
    table = m.relative_standing(rows, pairs)
    names = {1: "above", 0: "level", -1: "below"}
    for st_sign, st_name in names.items():
        for o_sign, o_name in m.OUTCOME_NAMES.items():
            expect = sum(t[4] == st_sign and t[3] == o_sign for t in truth)
            assert table.cells[st_name][o_name] == expect
    assert sum(sum(c.values()) for c in table.by_source["source failed"].values()) == sum(
        KINDS[t[2]][2][0] is False for t in truth)
    by_dir = m.pairs_by(pairs, "direction")
    assert {k: len(v) for k, v in by_dir.items()} == {"cute→tirx": 150, "tirx→cute": 150}


# -- statistics ----------------------------------------------------------------------------------------------
def test_wilson_known_values():
    assert s.wilson(0, 10).high == pytest.approx(0.27753, abs=1e-5)
    assert s.wilson(0, 10).low == 0.0
    i = s.wilson(5, 10)
    assert (i.estimate, round(i.low, 4), round(i.high, 4)) == (0.5, 0.2366, 0.7634)
    assert s.wilson(10, 10).low == pytest.approx(0.72247, abs=1e-5)
    i = s.wilson(1, 3, confidence=0.9)  # z = 1.6449: centre (1/3 + z²/6) / (1 + z²/3), hand formula
    z = 1.6448536269514722
    centre = (1 / 3 + z * z / 6) / (1 + z * z / 3)
    half = z * math.sqrt((1 / 3) * (2 / 3) / 3 + z * z / 36) / (1 + z * z / 3)
    assert (i.low, i.high) == pytest.approx((centre - half, centre + half))
    assert s.wilson(0, 0).estimate is None


@pytest.mark.parametrize("n", range(1, 41))
def test_wilson_bounds_are_exact_at_none_and_all(n):
    """At 0/n and n/n the interval must touch 0 and 1 exactly: a bound a rounding error inside (0/6 gave 2.8e-17)
    made the report's error bars negative and the H200 demo's report fail."""
    assert s.wilson(0, n).low == 0.0 and s.wilson(n, n).high == 1.0
    for k in range(n + 1):
        i = s.wilson(k, n)
        assert i.low <= i.estimate <= i.high


def test_mcnemar_matches_binomtest():
    for b, c in [(0, 0), (3, 0), (7, 2), (2, 7), (10, 10), (15, 4), (1, 30)]:
        expect = 1.0 if b + c == 0 else st.binomtest(b, b + c, 0.5).pvalue
        assert s.mcnemar_p(b, c) == pytest.approx(expect, rel=1e-9)
    rows = tiny_rows()
    res = s.mcnemar_exact(m.pair_trials(rows))
    assert (res.treated_only, res.solo_only) == (2, 1)
    assert res.p_value == pytest.approx(st.binomtest(2, 3, 0.5).pvalue)


def test_wilcoxon_on_pairs_correct_in_both():
    rows = tiny_rows()
    res = s.wilcoxon_speed(m.pair_trials(rows, skipped_as_base=False))
    ratios = [math.log(1 / 0.9), math.log(1 / 0.9), math.log(1 / 1.5)]
    assert res.n == 3 and res.median_log_ratio == pytest.approx(math.log(1 / 0.9))
    assert res.p_value == pytest.approx(st.wilcoxon(ratios).pvalue)
    assert s.wilcoxon_speed([]).p_value is None


def test_holm_hand_example():
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> monotone 0.06
    assert s.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert s.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert s.holm([]) == []


def _mean_ci(values, problems, n_boot, confidence=0.95, seed=0):
    """The problem-bootstrap interval of a pooled mean, through the vectorised Resampler."""
    rs = s.resampler(problems, {"x": values, "n": [1.0] * len(values)}, n_boot, seed)
    return s.percentile(*rs.ratio("x", "n"), confidence)


def test_bootstrap_generic_equals_vectorised_and_resamples_problems():
    vals = [1, 0, -1, 1, 1, 0, 1, -1, 1, 1]
    probs = ["a", "a", "b", "b", "c", "c", "d", "d", "e", "e"]
    items = list(zip(vals, probs))
    g = s.bootstrap_ci(items, lambda xs: sum(v for v, _ in xs) / len(xs), cluster=lambda x: x[1], n_boot=500,
                       seed=3)
    v = _mean_ci(vals, probs, n_boot=500, seed=3)
    assert (g.estimate, g.low, g.high) == pytest.approx((v.estimate, v.low, v.high))
    # a problem whose pairs all agree moves as one: one problem holding every pair gives a zero-width interval
    one = _mean_ci(vals, ["z"] * 10, n_boot=200)
    assert one.low == one.high == pytest.approx(0.4)


def test_bootstrap_ci_coverage():
    # 40 problems, 2 pairs each sharing the problem's difficulty; true mean outcome 0.5 * 0.5 + 0.5 * 0.0 = 0.25
    rng = np.random.default_rng(11)
    easy, hard, truth = [0.1, 0.3, 0.6], [0.3, 0.4, 0.3], 0.25
    covered = 0
    for draw in range(200):
        is_easy = rng.random(40) < 0.5
        vals, probs = [], []
        for i in range(40):
            vals += list(rng.choice([-1, 0, 1], size=2, p=easy if is_easy[i] else hard))
            probs += [i, i]
        ci = _mean_ci(vals, probs, n_boot=1000, confidence=0.9, seed=draw)
        covered += ci.low <= truth <= ci.high
    assert 0.80 * 200 <= covered <= 0.97 * 200


def test_sign_flip_range_contains_zero_and_shrinks():
    rng = np.random.default_rng(5)
    small = s.sign_flip_range(list(rng.choice([-1, 0, 1], size=20)))
    large = s.sign_flip_range(list(rng.choice([-1, 0, 1], size=200)))
    assert small.low < 0 < small.high and large.low < 0 < large.high
    assert large.high - large.low < 0.5 * (small.high - small.low)
    strong = s.sign_flip_range([1] * 30 + [0] * 10)  # a real lift leaves the range
    assert strong.observed > strong.high and strong.p_value < 0.001
    assert s.sign_flip_range([]).low is None
    with pytest.raises(ValueError, match="integer"):
        s.sign_flip_range([0.5, -1])


def test_sign_flip_is_exact():
    """For +1/0/-1 outcomes it is the exact sign test; for mixed magnitudes, every one of the 2^n flips counted."""
    outcomes = [1] * 9 + [-1] * 3 + [0] * 5
    assert s.sign_flip_range(outcomes).p_value == pytest.approx(st.binomtest(9, 12, 0.5).pvalue, rel=1e-12)
    x = [2, -1, 1, 0, 2, -2, 1, 1, -1, 2]
    sums = np.array([sum(e * v for e, v in zip(eps, x)) for eps in itertools.product([-1, 1], repeat=len(x))])
    res = s.sign_flip_range(x)
    assert res.p_value == pytest.approx(np.mean(np.abs(sums) >= abs(sum(x))), rel=1e-12)
    cdf = lambda v: np.mean(sums <= v)  # noqa: E731
    assert cdf(res.low * len(x)) >= 0.025 > cdf(res.low * len(x) - 1)  # the smallest sum with CDF >= 2.5%
    assert cdf(res.high * len(x)) >= 0.975 > cdf(res.high * len(x) - 1)


def test_resampler_draws_the_problem_bootstrap():
    """Every ratio-of-sums statistic from one Resampler equals the generic bootstrap_ci on the same draws."""
    rng = np.random.default_rng(2)
    probs = [f"p{i // 3}" for i in range(30)] + ["q"]
    num, den = rng.integers(-1, 2, size=31).astype(float), (rng.random(31) < 0.6).astype(float)
    items = list(zip(num, den, probs))
    rs = s.resampler(probs, {"num": num, "den": den}, n_boot=300, seed=4)
    est, vals = rs.ratio("num", "den")
    fast = s.percentile(est, vals)
    slow = s.bootstrap_ci(items, lambda xs: (sum(a for a, _, _ in xs) / sum(b for _, b, _ in xs)
                                             if sum(b for _, b, _ in xs) else None),
                          cluster=lambda t: t[2], n_boot=300, seed=4)
    assert (fast.estimate, fast.low, fast.high) == pytest.approx((slow.estimate, slow.low, slow.high))
    assert rs.total("den") == den.sum() and len(rs.problems) == 11


def test_rate_interval_holds_its_rate_when_pairs_of_a_problem_are_correlated():
    """30 problems × 4 pairs, each problem with its own regression chance (Beta(0.5, 1), mean 1/3): Wilson over the
    120 pairs treats them as independent and covers the true rate far less than 95% of the time; the interval on
    the effective sample size from the problem bootstrap holds it."""
    rng = np.random.default_rng(8)
    truth, draws = 1 / 3, 300
    wilson_hits = cluster_hits = 0
    for d in range(draws):
        chance = rng.beta(0.5, 1, size=30)
        regressed = (rng.random((30, 4)) < chance[:, None]).astype(float).ravel()
        probs = np.repeat(np.arange(30), 4)
        k = int(regressed.sum())
        w = s.wilson(k, 120)
        wilson_hits += w.low <= truth <= w.high
        rs = s.resampler(list(probs), {"r": regressed, "n": np.ones(120)}, n_boot=400, seed=d)
        c = s.cluster_rate_interval(*rs.ratio("r", "n"), 120, 30)
        cluster_hits += c.low <= truth <= c.high
    assert wilson_hits / draws < 0.85
    assert cluster_hits / draws >= 0.92
    # at 0/n the interval has width, over the problems as the independent units
    zero = s.cluster_rate_interval(0.0, np.zeros(10), 40, 10)
    assert zero.low == 0.0 and zero.high == pytest.approx(s.wilson(0, 10).high)
