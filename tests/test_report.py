"""`mkb report` recovers a synthetic store's known truth through metrics.py / stats.py, embeds every plot and table in
a self-contained HTML file, defines every JSON field, and turns every unusable store into one line, not a traceback."""
from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys

import pytest

from metakernelbench.analysis import metrics as m
from metakernelbench.analysis import stats as st
from metakernelbench.analysis.report import LEGEND, NEED_SKILL, report_store
from metakernelbench.protocol import plan
from metakernelbench.store import Store

# per problem: (solo replicate 0, solo replicate 1 = control, skill, placebo); speedup vs eager, None = failed.
# Identical in both DSLs, so every source solo is level with its target solo.
TRUTH = {
    "a/1": (None, None, 2.0, None),  # skill improved, placebo tied, control tied
    "a/2": (1.5, 1.5, 3.0, 1.5),  # improved, tied, tied
    "a/3": (0.8, 0.8, 1.2, None),  # improved, regressed, tied
    "b/1": (None, 0.6, 0.6, None),  # improved, tied, control improved
    "b/2": (2.5, 2.5, 5.0, 2.5),  # improved, tied, tied
    "b/3": (1.1, None, None, 1.1),  # regressed, tied, control regressed
}
DSLS = ["cute", "tirx"]
TOKENS = {"solo": 1000, "skill": 2000, "placebo": 1500}


def _result(speed):
    if speed is None:
        return {"passed": False, "speedup_vs_eager": None, "median_ms": None, "noise_spread": None,
                "offline_client": False}
    return {"passed": True, "speedup_vs_eager": speed, "median_ms": 1.0 / speed, "noise_spread": 0.0,
            "offline_client": False}


def make_store(path, arms=("solo", "skill", "placebo")):
    store = Store(path)
    store.ensure_run("r", {"synthetic": True}, {})
    specs = plan("r", "m", list(TRUTH), DSLS, list(arms), replicates=1, seed=0, solo_control=True)
    store.add_trials(specs)
    for s in specs:
        solo0, solo1, skill, placebo = TRUTH[s.problem]
        speed = {"solo": solo0 if s.replicate == 0 else solo1, "skill": skill, "placebo": placebo}[s.arm]
        audit = ({"words": 100 if s.replicate == 0 else 50, "leaks_code": s.problem == "a/1"}
                 if s.arm == "solo" else None)
        store.start_trial(s.trial_id, {})
        store.finish_trial(s.trial_id, _result(speed), "a skill" if audit else None, audit,
                           {"output_tokens": TOKENS[s.arm], "cost_usd": 0.1, "wall_s": 10.0})
    return store


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    store = make_store(tmp / "s.sqlite")
    rows = store.trials("r")
    report_store(store, tmp / "out", "r", n_boot=500)
    store.close()
    return tmp, rows, json.loads((tmp / "out" / "report.json").read_text())


def mkb(*args):
    return subprocess.run([sys.executable, "-m", "metakernelbench", *args], capture_output=True, text=True,
                          timeout=120)


def test_ladders_equal_metrics_and_hand_truth(full):
    _, rows, rep = full
    skill = rep["ladders"]["arm"]["skill"]
    # skill speeds 2, 3, 1.2, 0.6, 5, fail in each direction: R@t = 5, 5, 4, 2, 1 of 6
    assert skill["r_at"] == pytest.approx({"0": 5 / 6, "0.5": 5 / 6, "1": 4 / 6, "2": 2 / 6, "4": 1 / 6})
    assert skill["s"] == pytest.approx(1700 / 30) and skill["n"] == 12 and skill["passed"] == 10
    assert skill["fast_p1"] == pytest.approx(4 / 6)
    assert skill["pass_rate"]["low"] == pytest.approx(st.wilson(10, 12).low)
    for key in m.GROUP_KEYS:
        for name, lad in m.ladders_by(rows, key).items():
            got = rep["ladders"][key][name]
            assert got["s"] == pytest.approx(lad.s) and got["n"] == lad.n and got["passed"] == lad.passed
            assert got["r_at"] == pytest.approx({f"{t:g}": v for t, v in lad.r_at.items()})
            assert got["geomean_speedup"] == pytest.approx(lad.geomean_speedup)
    assert set(rep["ladders"]["family"]) == {"a", "b"}
    assert set(rep["ladders"]["direction"]) == {"cute", "tirx", "cute→tirx", "tirx→cute"}
    assert rep["usage"]["skill"]["output_tokens"] == 12 * 2000 and rep["usage"]["solo"]["wall_s"] == 240.0
    assert rep["skill_audit"]["solo"]["mean_words"] == pytest.approx(75.0)
    assert rep["skill_audit"]["solo"]["leaking_code_share"] == pytest.approx(4 / 24)


def test_paired_counts_lift_and_tests(full):
    _, rows, rep = full
    skill = rep["paired"]["skill"]["overall"]
    assert (skill["n"], skill["improved"], skill["tied"], skill["regressed"]) == (12, 10, 0, 2)
    assert skill["mean_outcome"] == pytest.approx(8 / 12)
    assert skill["lift_s"] == pytest.approx(500 / 30)  # S 1700/30 (skill) - 1200/30 (solo)
    summ = m.summarise_pairs(m.pair_trials(rows, "skill"))
    assert skill["lift_s"] == pytest.approx(summ.lift_s) and skill["s_solo"] == pytest.approx(summ.s_solo)
    placebo = rep["paired"]["placebo"]["overall"]
    assert (placebo["improved"], placebo["tied"], placebo["regressed"]) == (0, 10, 2)
    control = rep["paired"]["solo_control"]["overall"]
    assert (control["improved"], control["tied"], control["regressed"]) == (2, 8, 2) and control["mean_outcome"] == 0
    # McNemar: treated-only correct = a/1, b/1 per direction (4); solo-only = b/3 (2)
    assert (skill["mcnemar"]["treated_only"], skill["mcnemar"]["solo_only"]) == (4, 2)
    assert skill["mcnemar"]["p_value"] == pytest.approx(st.mcnemar_p(4, 2))
    pairs = m.pair_trials(rows, "skill")
    assert skill["wilcoxon"]["p_value"] == pytest.approx(st.wilcoxon_speed(pairs).p_value)
    assert skill["regression_rate_ci"]["high"] == pytest.approx(st.wilson(2, 12).high)
    boot = st.bootstrap_mean_ci([p.outcome for p in pairs], [p.problem for p in pairs], n_boot=500)
    assert skill["mean_outcome_ci"]["low"] == pytest.approx(boot.low)
    flip = st.sign_flip_range([p.outcome for p in pairs])
    assert skill["noise_range"]["low"] == pytest.approx(flip.low) and skill["noise_range"]["high"] == pytest.approx(flip.high)
    cells = rep["paired"]["skill"]["cells"]
    assert {c["direction"]: (c["improved"], c["tied"], c["regressed"]) for c in cells} == {
        "cute→tirx": (5, 0, 1), "tirx→cute": (5, 0, 1)}
    raw = [c["mcnemar"]["p_value"] for c in cells]
    assert [c["mcnemar"]["p_holm"] for c in cells] == pytest.approx(st.holm(raw))


def test_verdicts_and_standing(full):
    _, rows, rep = full
    v = rep["verdicts"]
    assert v["skill"]["overall"]["outside_noise_range"] is True
    assert v["skill"]["overall"]["outside_control_range"] is True and v["skill"]["overall"]["distinguishable"]
    assert "indistinguishable from noise" in v["placebo"]["overall"]["statement"]
    assert v["placebo"]["overall"]["distinguishable"] is False
    sk = rep["standing"]["skill"]
    direct = m.relative_standing(rows, m.pair_trials(rows, "skill"))
    assert sk["cells"] == direct.cells
    assert sk["cells"]["level"] == {"improved": 10, "tied": 0, "regressed": 2}  # identical DSLs: all level
    assert rep["standing"]["placebo"]["cells"]["level"] == {"improved": 0, "tied": 10, "regressed": 2}
    assert rep["standing"]["solo_control"]["cells"]["level"] == {"improved": 2, "tied": 8, "regressed": 2}
    ex = rep["standing"]["skill_excess"]
    assert ex["over_placebo"]["level"]["improve_rate"] == pytest.approx(10 / 12)
    assert ex["over_solo_control"]["level"]["improve_rate"] == pytest.approx(8 / 12)


def test_every_field_has_a_legend_entry(full):
    _, _, rep = full
    assert rep["legend"] == LEGEND
    dynamic = {"r_at", "usage", "skill_audit", "plots", "legend"}
    missing = set()

    def walk(obj, parent=None):
        if isinstance(obj, dict):
            for k, v in obj.items():
                if parent in dynamic:
                    walk(v, "_value")
                    continue
                if k not in LEGEND:
                    missing.add(k)
                if parent == "ladders":  # ladders -> key -> group name -> entry
                    for entry in v.values():
                        walk(entry, "_entry")
                else:
                    walk(v, k)
        elif isinstance(obj, list):
            for x in obj:
                walk(x, parent)

    walk(rep)
    assert not missing, missing


def test_html_embeds_every_plot_and_table(full):
    tmp, _, rep = full
    out = tmp / "out"
    page = (out / "report.html").read_text()
    assert set(rep["plots"]) == {"ladders", "paired_outcome", "standing", "speed_scatter", "regression_vs_noise"}
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert {name for name, _ in images} == set(rep["plots"])
    for name, file in rep["plots"].items():
        assert (out / file).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "report.md").read_text()
    titles = re.findall(r"^## (.+)$", md, flags=re.M)
    for title in titles:
        if title != "Plots":
            assert f"<h2>{title}</h2>" in page.replace("&amp;", "&")
    assert page.count("<table") == len([t for t in titles if t != "Plots"]) >= 10
    assert "Relative standing: solo_control" in md and "Lift against noise" in md
    assert "Noise range for this run's size" in md and "<h2>Noise range for this run's size</h2>" in page
    assert "http" not in page.split("</style>", 1)[1].replace("docs/metrics.md", "")  # nothing fetched from outside


def test_cli_report_and_only_solo_store(tmp_path):
    store = make_store(tmp_path / "solo.sqlite", arms=("solo",))
    store.close()
    proc = mkb("report", "--db", str(tmp_path / "solo.sqlite"), "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "paired statistics need skill trials" in proc.stderr
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    assert NEED_SKILL in rep["notes"] and "skill" not in rep["paired"] and rep["ladders"]["arm"]["solo"]["n"] == 24
    assert "ladders" in rep["plots"] and "data:image/png;base64," in (tmp_path / "o" / "report.html").read_text()


def test_unusable_stores_are_one_line_errors(tmp_path):
    empty = tmp_path / "empty.sqlite"
    Store(empty).close()
    other = tmp_path / "other.sqlite"
    make_store(other, arms=("solo",)).close()
    db = sqlite3.connect(other)
    db.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    db.commit()
    db.close()
    good = tmp_path / "good.sqlite"
    make_store(good, arms=("solo",)).close()
    cases = [(tmp_path / "missing.sqlite", "no store at"), (empty, "holds no trials"), (other, "schema 99"),
             (good, "no trials of run 'nope'")]
    for path, message in cases:
        args = ["report", "--db", str(path), "--out", str(tmp_path / "x")]
        if path == good:
            args += ["--run-id", "nope"]
        proc = mkb(*args)
        assert proc.returncode == 2, (path, proc.stdout, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert message in proc.stderr, proc.stderr


def test_noise_range_for_this_runs_size(full):
    from metakernelbench.analysis.power import no_transfer_lift_range

    _, rows, rep = full
    nz = rep["noise_for_size"]
    sim = no_transfer_lift_range(nz["problems"], nz["replicates"], nz["models_directions"])
    assert nz["problems"] == len({r.problem for r in rows}) and nz["replicates"] == 1
    assert nz["per_cell_range"] == {"low": sim.low, "high": sim.high}
    assert nz["measured_disagreement"] is not None and nz["per_cell_range_at_measured"] is not None
    cells = [c for arm in ("skill", "placebo") for c in rep["paired"][arm]["cells"]]
    assert len(nz["lifts"]) == len(cells)
    for lift, c in zip(nz["lifts"], cells):
        assert lift["lift_pct"] == pytest.approx(100 * c["mean_outcome"])
        assert lift["inside_noise"] == (sim.low <= lift["lift_pct"] <= sim.high)
    assert "indistinguishable from noise" in nz["statement"]


def _repeat_store(path):
    """One problem: in cute the same file passes in solo r0 (1.0 ms), solo r1 (1.0 ms) and skill (1.25 ms), each with
    spread 0.1, plus a failed grading of it that must not count; in tirx every trial submits its own file."""
    store = Store(path)
    store.ensure_run("r", {}, {})
    specs = plan("r", "m", ["a/1"], DSLS, ["solo", "skill"], replicates=1, seed=0, solo_control=True)
    store.add_trials(specs)
    for s in specs:
        ms = 1.25 if (s.dsl, s.arm) == ("cute", "skill") else 1.0
        sha = "same" if s.dsl == "cute" else f"own-{s.trial_id}"
        store.start_trial(s.trial_id, {})
        store.add_submission(s.trial_id, 0, "x", {"compiled": True, "passed": False, "file_sha256": sha})
        store.add_submission(s.trial_id, 1, "x", {"compiled": True, "passed": True, "speedup_vs_eager": 1 / ms,
                                                  "file_sha256": sha, "runtime": {"median_ms": ms, "spread": 0.1}})
        store.finish_trial(s.trial_id, {"passed": True, "speedup_vs_eager": 1 / ms, "median_ms": ms,
                                        "noise_spread": 0.1, "offline_client": False}, None, None, {})
    return store


def test_identical_code_graded_twice_measures_the_noise_and_min_margin_ties_it(tmp_path):
    store = _repeat_store(tmp_path / "s.sqlite")
    strict = report_store(store, tmp_path / "strict", "r", n_boot=50)
    (same,) = strict["repeated_code"]["files"]
    assert (same["problem"], same["dsl"], same["file_sha256"], same["gradings"]) == ("a/1", "cute", "same", 3)
    assert same["fastest_ms"] == 1.0 and same["slowest_ms"] == 1.25 and same["ratio"] == pytest.approx(1.25)
    # 1.0 vs 1.0 is a tie; both 1.0 vs 1.25 pairs pass 1 + spread 0.1, so the rule calls them differences
    assert (same["pairs"], same["untied"]) == (3, 2) and strict["repeated_code"]["untied"] == 2
    assert strict["min_margin"] == 0 and strict["paired"]["skill"]["overall"]["regressed"] == 1
    (note,) = [n for n in strict["notes"] if "identical code" in n]
    assert "2 of 3 pairs" in note and "1.25x" in note and "--min-margin 0.26" in note
    assert "Identical code graded more than once" in (tmp_path / "strict" / "report.md").read_text()
    assert set(same) | set(strict["repeated_code"]) | {"min_margin", "repeated_code"} <= set(LEGEND)

    tied = report_store(store, tmp_path / "tied", "r", n_boot=50, min_margin=0.26)
    assert tied["min_margin"] == 0.26 and tied["repeated_code"]["untied"] == 0
    assert tied["paired"]["skill"]["overall"]["regressed"] == 0 and tied["paired"]["skill"]["overall"]["tied"] == 2
    assert not [n for n in tied["notes"] if "identical code" in n]
    store.close()


def test_min_margin_on_the_command_line(tmp_path):
    _repeat_store(tmp_path / "s.sqlite").close()
    ok = mkb("report", "--db", str(tmp_path / "s.sqlite"), "--out", str(tmp_path / "out"), "--min-margin", "0.26")
    assert ok.returncode == 0, ok.stderr
    assert json.loads((tmp_path / "out" / "report.json").read_text())["repeated_code"]["untied"] == 0
    bad = mkb("report", "--db", str(tmp_path / "s.sqlite"), "--out", str(tmp_path / "out"), "--min-margin", "-0.1")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--min-margin" in bad.stderr
