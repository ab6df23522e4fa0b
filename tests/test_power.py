"""The no-transfer power simulation (analysis/power.py): calibration, scale, shrinkage with size, determinism."""
from __future__ import annotations

import pytest

from metakernelbench.analysis import power
from metakernelbench.analysis.power import LiftRange, no_transfer_lift_range


def test_calibration_hits_the_assumed_disagreement():
    assert power.calibrate() == pytest.approx(power.SIGMA, abs=0.05)
    assert power.disagreement(power.SIGMA) == pytest.approx(power.TARGET_DISAGREEMENT, abs=0.01)
    r = no_transfer_lift_range(74, 1)
    assert r.disagreement == pytest.approx(power.TARGET_DISAGREEMENT, abs=0.01)


def test_pass_rate_is_about_half():
    import numpy as np
    rng = np.random.default_rng(1)
    q = rng.standard_normal(200_000) + rng.normal(0, power.SIGMA, 200_000)
    assert np.mean(power._levels(q, power.SIGMA) > 0) == pytest.approx(0.5, abs=0.01)


def test_74x1_spans_the_published_scale():
    r = no_transfer_lift_range(74, 1, models_directions=12, seed=0)
    assert isinstance(r, LiftRange)
    assert -25 <= r.cells_low <= -10 and 10 <= r.cells_high <= 25  # expected min..max across 12 cells
    assert -25 <= r.low <= -10 and 10 <= r.high <= 25  # one cell's central 95% range
    assert r.low < r.cells_low and r.cells_high < r.high  # 12 cells: the expected extremes lie inside one cell's 95%


def test_replicates_and_problems_narrow_the_range():
    one, three = no_transfer_lift_range(74, 1), no_transfer_lift_range(74, 3)
    assert three.half_width < one.half_width
    assert 7 <= three.half_width <= 13  # about ±10%
    assert -13 <= three.cells_low and three.cells_high <= 13
    widths = [no_transfer_lift_range(n, 1).half_width for n in (20, 74, 250)]
    assert widths[0] > widths[1] > widths[2]


def test_zero_transfer_mean_is_zero():
    for n, reps in ((74, 1), (74, 3), (20, 1)):
        r = no_transfer_lift_range(n, reps)
        assert abs(r.mean) < 0.5  # % ; standard error ~ sd / sqrt(draws * cells)
        assert r.low < 0 < r.high


def test_deterministic_for_a_seed():
    no_transfer_lift_range.cache_clear()
    a = no_transfer_lift_range(30, 2, 6, draws=300, seed=7)
    no_transfer_lift_range.cache_clear()
    b = no_transfer_lift_range(30, 2, 6, draws=300, seed=7)
    assert a == b
    c = no_transfer_lift_range(30, 2, 6, draws=300, seed=8)
    assert c != a


def test_rejects_empty_sizes():
    with pytest.raises(ValueError):
        no_transfer_lift_range(0, 1)
    with pytest.raises(ValueError):
        no_transfer_lift_range(10, 0)


def test_published_comparison_mentions_both():
    text = power.published_comparison()
    assert "-19%..+29%" in text and "74x1" in text


def test_simultaneous_band_holds_every_cell_at_once():
    """The band that holds all 12 cells at once is wider than one cell's 95% range and than the expected extremes;
    for a single cell it is that cell's own central range (up to one step of the lift's lattice)."""
    many = no_transfer_lift_range(74, 1, models_directions=12)
    assert many.simultaneous > many.half_width and many.simultaneous > max(-many.cells_low, many.cells_high)
    one = no_transfer_lift_range(74, 1, models_directions=1)
    assert abs(one.simultaneous - one.half_width) <= 100 / 74 + 1e-9
