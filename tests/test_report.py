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
from metakernelbench.analysis.report import LEGEND, NEED_SKILL, blocks, report_store
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
    # skill speeds 2, 3, 1.2, 0.6, 5, fail in each direction: R@t (speedup >= t) = 5, 5, 4, 3, 1 of 6
    assert skill["r_at"] == pytest.approx({"0": 5 / 6, "0.5": 5 / 6, "1": 4 / 6, "2": 3 / 6, "4": 1 / 6})
    assert skill["s"] == pytest.approx(1800 / 30) and skill["n"] == 12 and skill["passed"] == 10
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
    assert (skill["pairs"], skill["improved"], skill["tied"], skill["regressed"]) == (12, 10, 0, 2)
    assert skill["paired_outcome"]["estimate"] == pytest.approx(100 * 8 / 12)
    assert skill["lift_s"]["estimate"] == pytest.approx(20.0)  # S 1800/30 (skill) - 1200/30 (solo)
    pairs = m.pair_trials(rows, "skill")
    summ = m.summarise_pairs(pairs)
    assert skill["lift_s"]["estimate"] == pytest.approx(summ.lift_s) and skill["s_solo"] == pytest.approx(summ.s_solo)
    # correctness: a/1 and b/1 gain a pass, b/3 loses one, per direction: (4 - 2) / 12
    assert skill["correctness_lift"]["estimate"] == pytest.approx(100 * 2 / 12)
    # runtime over the 6 pairs correct in both: ratios 3/1.5, 1.2/0.8, 5/2.5 per direction
    assert skill["runtime_lift"]["estimate"] == pytest.approx(100 * ((2 * 1.5 * 2) ** (1 / 3) - 1))
    placebo = rep["paired"]["placebo"]["overall"]
    assert (placebo["improved"], placebo["tied"], placebo["regressed"]) == (0, 10, 2)
    control = rep["paired"]["solo_control"]["overall"]
    assert (control["improved"], control["tied"], control["regressed"]) == (2, 8, 2)
    assert control["paired_outcome"]["estimate"] == 0
    assert (skill["mcnemar"]["treated_only"], skill["mcnemar"]["solo_only"]) == (4, 2)
    assert skill["mcnemar"]["p_value"] == pytest.approx(st.mcnemar_p(4, 2))
    assert skill["wilcoxon"]["p_value"] == pytest.approx(st.wilcoxon_speed(pairs).p_value)
    regs = st.resampler([p.problem for p in pairs], {"r": [p.outcome == -1 for p in pairs], "n": [1] * 12}, 500)
    reg = st.cluster_rate_interval(*regs.ratio("r", "n"), 12, 6)
    assert (skill["regression_rate"]["low"], skill["regression_rate"]["high"]) == pytest.approx(
        (100 * reg.low, 100 * reg.high))
    rs = st.resampler([p.problem for p in pairs], {"o": [p.outcome for p in pairs], "n": [1] * 12}, 500)
    boot = st.bootstrap_ci(pairs, lambda ps: sum(p.outcome for p in ps) / len(ps), n_boot=500)
    assert skill["paired_outcome"]["low"] == pytest.approx(100 * boot.low)
    assert st.percentile(*rs.ratio("o", "n")).low == pytest.approx(boot.low)
    flip = st.sign_flip_range([p.outcome for p in pairs])
    assert skill["noise_range"] == pytest.approx([100 * flip.low, 100 * flip.high])
    cells = rep["paired"]["skill"]["rows"]
    assert {c["direction"]: (c["improved"], c["tied"], c["regressed"]) for c in cells} == {
        "cute→tirx": (5, 0, 1), "tirx→cute": (5, 0, 1)}
    raw = [c["mcnemar"]["p_value"] for c in cells]
    assert [c["correctness_lift"]["p_holm"] for c in cells] == pytest.approx(st.holm(raw))


def test_verdicts_and_standing(full):
    _, rows, rep = full
    v = rep["verdicts"]
    skill = rep["paired"]["skill"]["overall"]
    # sign test 10 of 12 non-ties; against the control on the same 12 baselines the differences are 8 × (+1), 4 × 0
    assert skill["sign_p"] == pytest.approx(st.mcnemar_p(10, 2))
    assert skill["control_diff"] == pytest.approx(100 * 8 / 12) and skill["control_p"] == pytest.approx(2 / 2 ** 8)
    assert skill["paired_outcome"]["p_value"] == pytest.approx(max(skill["sign_p"], skill["control_p"]))
    assert v["skill"]["overall"]["distinguishable"] is True and "beats noise" in v["skill"]["overall"]["statement"]
    assert "indistinguishable from noise" in v["placebo"]["overall"]["statement"]
    assert v["placebo"]["overall"]["distinguishable"] is False
    sk = rep["standing"]["skill"]
    direct = m.relative_standing(rows, m.pair_trials(rows, "skill"))
    assert sk["cells"] == direct.cells
    assert sk["cells"]["level"] == {"improved": 10, "tied": 0, "regressed": 2}  # identical DSLs: all level
    assert rep["standing"]["placebo"]["cells"]["level"] == {"improved": 0, "tied": 10, "regressed": 2}
    assert rep["standing"]["solo_control"]["cells"]["level"] == {"improved": 2, "tied": 8, "regressed": 2}
    ex = {(name, e["standing"], e["rate"]): e for name, es in rep["standing"]["excess"].items() for e in es}
    assert ex[("over_placebo", "level", "improve_rate")]["excess"] == pytest.approx(100 * 10 / 12)
    over_ctl = ex[("over_solo_control", "level", "improve_rate")]
    assert over_ctl["excess"] == pytest.approx(100 * 8 / 12)
    assert over_ctl["low"] <= over_ctl["excess"] <= over_ctl["high"]
    assert ex[("over_solo_control", "above", "improve_rate")]["excess"] is None  # nothing stood above
    assert rep["standing"]["caveat"] is None and rep["standing"]["by_model"]["m"]["skill"] == sk["cells"]
    sentence = rep["standing"]["sentences"]["over_solo_control"]
    assert sentence.startswith("Against the solo control in the skill arm's place: no pairs of both arms stood above")


def test_every_field_has_a_legend_entry(full):
    _, _, rep = full
    assert rep["legend"] == LEGEND
    dynamic = {"r_at", "usage", "skill_audit", "plots", "legend", "by_model"}
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


def test_front_page_answers_first(full):
    """Table 1 opens the page, then the paper's two figures with captions, then the legends; the tables follow."""
    tmp, _, rep = full
    out = tmp / "out"
    page = (out / "report.html").read_text()
    assert set(rep["plots"]) == {"paired_lift", "standing", "ladders", "speed_scatter", "regression_vs_noise"}
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert [name for name, _ in images][:2] == ["paired_lift", "standing"] and len(images) == 5
    for name, file in rep["plots"].items():
        assert (out / file).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "report.md").read_text()
    titles = re.findall(r"^## (.+)$", md, flags=re.M)
    assert titles[:4] == ["Table 1: skill vs solo, per model and direction", "Paired outcome by problem",
                          "Outcomes by relative standing", "How to read the numbers"]
    for title in titles:
        assert f"<h2>{title}</h2>" in page.replace("&amp;", "&")
    kinds = [b.kind for b in blocks(rep)]
    assert page.count("<table") == kinds.count("table") + kinds.count("legend") >= 10
    assert page.count("<figcaption>Figure 1. Paired outcome by problem") == 1 and "Figure 2." in page
    for term in ("R@t", "S", "p-values", "tests", "intervals"):
        assert f"<td>{term}</td>" in page
    assert "Relative standing: solo_control" in md and "Lift against noise" in md
    assert "Noise range for this run's size" in md and "<h2>Noise range for this run's size</h2>" in page
    assert "http" not in page.split("</style>", 1)[1].replace("docs/metrics.md", "")  # nothing fetched from outside


def test_table1_cells_are_the_json_with_marks(full):
    tmp, _, rep = full
    t1 = blocks(rep)[0]
    skill = rep["paired"]["skill"]
    first = skill["rows"][0]
    assert t1.rows[0][:4] == [first["model"], first["direction"], "skill", "6 (0 skipped)"]
    po = first["paired_outcome"]
    assert t1.rows[0][6] == f"{po['estimate']:+.1f} [{po['low']:+.1f}, {po['high']:+.1f}]" + (
        " ✓" if po["beats_noise"] else "")
    assert t1.rows[1][2] == "solo control" and t1.rows[1][6] == f"{po['control']:+.1f}"
    pooled = skill["overall"]["paired_outcome"]
    assert pooled["beats_noise"] and t1.rows[-2][6].endswith(" ✓")  # the pooled skill row, above its control row
    md = (tmp / "out" / "report.md").read_text()
    assert "| " + " | ".join(t1.rows[-2]) + " |" in md


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
    assert nz["simultaneous_band"] == sim.simultaneous >= sim.half_width  # all cells at once: no narrower than one
    assert nz["measured_disagreement"] == pytest.approx(4 / 12) and nz["per_cell_range_at_measured"] is not None
    assert nz["band"] == pytest.approx(sim.simultaneous * (nz["measured_disagreement"] / sim.disagreement) ** 0.5)
    cells = [c for arm in ("skill", "placebo") for c in rep["paired"][arm]["rows"]]
    assert len(nz["lifts"]) == len(cells)
    for lift, c in zip(nz["lifts"], cells):
        assert lift["lift_pct"] == pytest.approx(c["paired_outcome"]["estimate"])
        assert lift["inside_noise"] == (abs(lift["lift_pct"]) <= nz["band"])
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


def test_without_a_control_the_standing_carries_its_caveat(tmp_path):
    """No solo control: the tests against it are n/t, and the standing table and Table 1 say that regression to the
    mean alone produces the pattern."""
    import synthetic as sy
    from metakernelbench.analysis.transfer import NO_CONTROL_CAVEAT

    store = sy.write_store(tmp_path / "s.sqlite", sy.trials(1, problems=12, models=1, control=False))
    rep = report_store(store, tmp_path / "out", "r", n_boot=100)
    store.close()
    assert rep["standing"]["caveat"] == NO_CONTROL_CAVEAT and "solo_control" not in rep["paired"]
    assert "regression to the mean" in NO_CONTROL_CAVEAT and "over_solo_control" not in rep["standing"]["excess"]
    t1 = blocks(rep)[0]
    assert NO_CONTROL_CAVEAT in t1.caption and all(r[2] == "skill" for r in t1.rows)
    assert all(r[7].endswith(" n/t") for r in t1.rows)  # regression rate: nothing to test it against
    md = (tmp_path / "out" / "report.md").read_text()
    assert md.count(NO_CONTROL_CAVEAT) == 2 and any("regression to the mean" in n for n in rep["notes"])


def test_skipped_skill_trials_counted_as_base_beside_our_view(tmp_path):
    import synthetic as sy

    rows = sy.trials(2, problems=12, models=1, skip=0.3)
    store = sy.write_store(tmp_path / "s.sqlite", rows)
    rep = report_store(store, tmp_path / "out", "r", n_boot=100)
    store.close()
    skipped = sum(r.status == "skipped" and r.arm == "skill" for r in rows)
    assert skipped > 0 and rep["skipped_as_base"]["skill"] == skipped and rep["unpaired"]["skill"] == 0
    paper, ours = rep["paired"]["skill"]["overall"], rep["without_skipped"]["skill"]["overall"]
    assert paper["pairs"] == 24 and ours["pairs"] == 24 - skipped and paper["skipped"] == skipped
    assert paper["tied"] - ours["tied"] == skipped  # each skipped trial is a tie with its base
    own = m.summarise_pairs(m.pair_trials(rows, "skill", skipped_as_base=False))
    assert ours["lift_s"]["estimate"] == pytest.approx(own.lift_s)
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Skipped trials: counted as their base (paper) and left out (ours)" in md


def test_a_planted_transfer_reads_as_beating_noise_end_to_end(tmp_path):
    import synthetic as sy

    store = sy.write_store(tmp_path / "s.sqlite", sy.trials(5, problems=40, models=1, transfer=2.0))
    rep = report_store(store, tmp_path / "out", "r", n_boot=200)
    store.close()
    assert all(v["distinguishable"] for v in rep["verdicts"]["skill"]["cells"])
    assert all("beats noise" in v["statement"] for v in rep["verdicts"]["skill"]["cells"])
    assert not rep["verdicts"]["placebo"]["overall"]["distinguishable"]
    assert all(r[6].endswith(" ✓") for r in blocks(rep)[0].rows if r[2] == "skill")


def test_synthetic_rows_are_what_their_store_returns(tmp_path):
    """The statistical tests draw tests/synthetic.py's rows directly (fast); they are the store's own records."""
    import synthetic as sy

    rows = sy.trials(6, problems=5, models=2, skip=0.3)
    store = sy.write_store(tmp_path / "s.sqlite", rows)
    back = {r.trial_id: r for r in store.trials("r")}
    store.close()
    assert len(back) == len(rows)
    for r in rows:
        b = back[r.trial_id]
        assert (b.status, b.result, b.skill, b.arm, b.dsl, b.source_dsl, b.replicate, b.problem, b.model) == (
            r.status, r.result, r.skill, r.arm, r.dsl, r.source_dsl, r.replicate, r.problem, r.model)


def test_no_plot_title_claims_transfer(tmp_path, monkeypatch):
    """On a run with no transfer at all, no figure or plot title asserts that transfer happened."""
    import synthetic as sy
    from metakernelbench.analysis import plots

    titles = []
    save = plots._save

    def recording(fig, path):
        titles.append(fig._suptitle.get_text() if fig._suptitle else "")
        titles.extend(ax.get_title() for ax in fig.axes)
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", recording)
    store = sy.write_store(tmp_path / "s.sqlite", sy.trials(7, problems=10, models=1))
    rep = report_store(store, tmp_path / "out", "r", n_boot=50)
    store.close()
    assert len(rep["plots"]) == 5 and any(titles)
    headings = [b.title for b in blocks(rep)]
    assert not [t for t in titles + headings if "transfer" in t.lower()], titles + headings
