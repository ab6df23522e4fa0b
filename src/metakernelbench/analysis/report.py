"""A run's full report: every measurement of docs/metrics.md, as JSON (with a legend), Markdown and self-contained HTML.

All numbers come from `metrics` (definitions) and `stats` (uncertainty); nothing here re-defines a metric. The
report is built as one JSON-ready dict (`build_report`), then rendered (`write_report`): tables to Markdown and
HTML, plots (see `plots`) to PNG files that the HTML embeds as base64.
"""
from __future__ import annotations

import base64
import dataclasses
import html
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from metakernelbench.analysis import metrics as m
from metakernelbench.analysis import power as pw
from metakernelbench.analysis import refinement
from metakernelbench.analysis import stats as st
from metakernelbench.store import Store, TrialRow

PAIRED_ARMS = ("skill", "placebo", "solo_control")  # solo_control: solo vs solo (solo_noise_pairs), the noise floor
CONFIDENCE = 0.95
NEED_SKILL = ("paired statistics need skill trials: this run has none finished with a finished solo counterpart "
              "(run the skill arm, e.g. `mkb run --arms solo,skill,placebo`)")


class ReportError(Exception):
    """Nothing can be reported; the message names why and the fix."""


# -- JSON helpers ---------------------------------------------------------------------------------------------
def _clean(v: Any) -> Any:
    """Dataclasses to dicts, float keys (thresholds) to strings, NaN/inf to None: strict JSON."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return _clean(dataclasses.asdict(v))
    if isinstance(v, dict):
        return {(_threshold_key(k) if isinstance(k, float) else str(k)): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _threshold_key(t: float) -> str:
    return f"{t:g}"


def _interval(iv: st.Interval) -> dict:
    return {"estimate": iv.estimate, "low": iv.low, "high": iv.high, "confidence": iv.confidence}


# -- per-group ladders ----------------------------------------------------------------------------------------
def _ladder_entry(rows: list[TrialRow]) -> dict:
    lad = m.ladder(rows)
    return {"n": lad.n, "excluded": lad.excluded, "passed": lad.passed, "r_at": _clean(lad.r_at), "s": lad.s,
            "fast_p1": m.fast_p(rows, 1.0), "geomean_speedup": lad.geomean_speedup,
            "pass_rate": _interval(st.wilson(lad.passed, lad.n, CONFIDENCE))}


def _usage(rows: list[TrialRow]) -> dict:
    used = [r.usage for r in rows if r.usage]

    def total(key):
        vals = [u.get(key) for u in used if u.get(key) is not None]
        return (sum(vals), sum(vals) / len(vals)) if vals else (None, None)

    (tok, tok_mean), (cost, cost_mean), (wall, wall_mean) = total("output_tokens"), total("cost_usd"), total("wall_s")
    return {"trials_with_usage": len(used), "output_tokens": tok, "output_tokens_mean": tok_mean, "cost_usd": cost,
            "cost_usd_mean": cost_mean, "wall_s": wall, "wall_s_mean": wall_mean}


def _skill_audit(rows: list[TrialRow]) -> dict:
    audits = [r.skill_audit for r in rows if r.skill_audit]
    words = [a["words"] for a in audits if a.get("words") is not None]
    leaks = [bool(a.get("leaks_code")) for a in audits if "leaks_code" in a]
    return {"skills": len(audits), "mean_words": sum(words) / len(words) if words else None,
            "leaking_code": sum(leaks), "leaking_code_share": sum(leaks) / len(leaks) if leaks else None}


# -- pairs ----------------------------------------------------------------------------------------------------
def _cell_key(row: TrialRow) -> str:
    return f"{row.model} | {m.direction(row)}"


def paired_stats(pairs: list[m.Pair], n_boot: int = 2000) -> dict:
    """Every paired statistic over one set of pairs (one arm, one cell or all)."""
    summ = m.summarise_pairs(pairs)
    mean_ci = st.bootstrap_mean_ci([p.outcome for p in pairs], [p.problem for p in pairs], n_boot=n_boot,
                                   confidence=CONFIDENCE)
    lift_ci = st.bootstrap_lift_s_ci(pairs, n_boot=n_boot, confidence=CONFIDENCE)  # bootstrap_ci of lift_s
    mc, wx = st.mcnemar_exact(pairs), st.wilcoxon_speed(pairs)
    flip = st.sign_flip_range([p.outcome for p in pairs], confidence=CONFIDENCE)
    return {"n": summ.n, "improved": summ.improved, "tied": summ.tied, "regressed": summ.regressed,
            "mean_outcome": summ.mean_outcome, "mean_outcome_ci": _interval(mean_ci),
            "s_treated": summ.s_treated, "s_solo": summ.s_solo, "lift_s": summ.lift_s, "lift_s_ci": _interval(lift_ci),
            "improvement_rate": summ.improvement_rate, "regression_rate": summ.regression_rate,
            "regression_rate_ci": _interval(st.wilson(summ.regressed, summ.n, CONFIDENCE)),
            "missing_noise": summ.missing_noise,
            "mcnemar": _clean(mc), "wilcoxon": _clean(wx), "noise_range": _clean(flip)}


def _outside(value: float | None, low: float | None, high: float | None) -> bool | None:
    if value is None or low is None or high is None:
        return None
    return value < low or value > high


def _verdict(stats: dict, control: dict | None) -> dict:
    """Whether a mean paired outcome leaves the sign-flip noise range for its own size, and the solo-vs-solo
    control's range (the bootstrap interval of the control's mean paired outcome)."""
    obs, nr = stats["mean_outcome"], stats["noise_range"]
    out_noise = _outside(obs, nr["low"], nr["high"])
    ctl = control["mean_outcome_ci"] if control and control["n"] else None
    out_ctl = _outside(obs, ctl["low"], ctl["high"]) if ctl else None
    if obs is None:
        text = "no pairs"
    elif out_noise and out_ctl is not False:
        side = "above" if obs > nr["high"] else "below"
        ctl_text = (f" and outside the solo-vs-solo control's range [{ctl['low']:+.3f}, {ctl['high']:+.3f}]" if out_ctl
                    else " (no solo-vs-solo control to compare)")
        text = (f"mean paired outcome {obs:+.3f} lies {side} the noise range [{nr['low']:+.3f}, {nr['high']:+.3f}]"
                f"{ctl_text}")
    else:
        where = (f"inside the noise range [{nr['low']:+.3f}, {nr['high']:+.3f}]" if not out_noise else
                 f"inside the solo-vs-solo control's range [{ctl['low']:+.3f}, {ctl['high']:+.3f}]")
        text = f"mean paired outcome {obs:+.3f} is {where}: indistinguishable from noise"
    return {"outside_noise_range": out_noise, "outside_control_range": out_ctl,
            "distinguishable": bool(out_noise and out_ctl is not False) if obs is not None else None,
            "statement": text}


def _paired_arm(pairs: list[m.Pair], n_boot: int) -> dict:
    cells = []
    for key, ps in m.pairs_by(pairs, _cell_key).items():
        t = ps[0].treated
        cells.append({"model": t.model, "direction": m.direction(t), "target_dsl": t.dsl,
                      **paired_stats(ps, n_boot)})
    for test in ("mcnemar", "wilcoxon"):
        idx = [i for i, c in enumerate(cells) if c[test]["p_value"] is not None]
        adjusted = st.holm([cells[i][test]["p_value"] for i in idx])
        for c in cells:
            c[test]["p_holm"] = None
        for i, a in zip(idx, adjusted):
            cells[i][test]["p_holm"] = a
    return {"overall": paired_stats(pairs, n_boot), "cells": cells}


def _control_pairs_for(skill_pairs: list[m.Pair], control: list[m.Pair]) -> list[m.Pair]:
    """The solo-vs-solo control in place of the treated trial: for each treated pair, the control pair of the same
    baseline solo, its treated row labelled with the treated pair's source DSL and replicate so that
    `relative_standing` finds the same source solo."""
    by_baseline = {p.solo.trial_id: p for p in control}
    out = []
    for p in skill_pairs:
        c = by_baseline.get(p.solo.trial_id)
        if c is not None:
            row = dataclasses.replace(c.treated, source_dsl=p.treated.source_dsl, replicate=p.treated.replicate)
            out.append(m.Pair(row, c.solo, c.comparison))
    return out


def _standing(rows: list[TrialRow], pairs: list[m.Pair], min_margin: float) -> dict:
    t = m.relative_standing(rows, pairs, min_margin)
    return {"cells": t.cells, "improve_rate": t.improve_rate, "regress_rate": t.regress_rate,
            "by_source": t.by_source, "missing_source": t.missing_source}


def _excess(a: dict, b: dict) -> dict:
    def diff(x, y):
        return None if x is None or y is None else x - y
    return {s: {"improve_rate": diff(a["improve_rate"][s], b["improve_rate"][s]),
                "regress_rate": diff(a["regress_rate"][s], b["regress_rate"][s])} for s in m.STANDING_NAMES.values()}


def _noise_for_size(rows: list[TrialRow], paired: dict) -> dict:
    """The lift that noise alone produces for this run's size (power.no_transfer_lift_range: problems, replicates
    and model × direction cells of the run), and each treated cell's lift (mean paired outcome × 100) against it."""
    treated = [r for r in rows if r.arm in m.TREATED_ARMS]
    problems = len({r.problem for r in rows})
    replicates = len({r.replicate for r in treated}) or 1
    cells = len({(r.model, m.direction(r)) for r in treated}) or len({(r.model, r.dsl) for r in rows})
    sim = pw.no_transfer_lift_range(problems, replicates, cells)
    control = paired.get("solo_control", {}).get("overall")
    measured = (1.0 - control["tied"] / control["n"]) if control and control["n"] else None
    scale = math.sqrt(measured / sim.disagreement) if measured is not None and sim.disagreement > 0 else None
    lifts = []
    for arm in m.TREATED_ARMS:
        for c in paired.get(arm, {}).get("cells", []):
            lift = None if c["mean_outcome"] is None else 100.0 * c["mean_outcome"]
            inside = None if lift is None else sim.low <= lift <= sim.high
            lifts.append({"arm": arm, "model": c["model"], "direction": c["direction"], "lift_pct": lift,
                          "inside_noise": inside})
    statement = (f"noise alone moves paired lift within ±{sim.half_width:.0f}% per model×direction cell "
                 f"({problems} problems × {replicates} replicate{'s' if replicates != 1 else ''}; expected extremes "
                 f"{sim.cells_low:+.0f}%..{sim.cells_high:+.0f}% across {cells} cells): a lift inside is "
                 "indistinguishable from noise")
    return {"problems": problems, "replicates": replicates, "models_directions": cells, "sigma": sim.sigma,
            "assumed_disagreement": pw.TARGET_DISAGREEMENT, "simulated_disagreement": sim.disagreement,
            "measured_disagreement": measured,
            "per_cell_range": {"low": sim.low, "high": sim.high},
            "across_cells": {"low": sim.cells_low, "high": sim.cells_high},
            "per_cell_range_at_measured": ({"low": sim.low * scale, "high": sim.high * scale} if scale else None),
            "published": dict(pw.PUBLISHED), "lifts": lifts, "statement": statement}


# -- the report -----------------------------------------------------------------------------------------------
def load_rows(store: Store, run_id: str | None) -> list[TrialRow]:
    rows = store.trials(run_id)
    if not rows:
        runs = [r for r, _ in store.runs()]
        if run_id and runs:
            raise ReportError(f"no trials of run '{run_id}' in {store.path}: runs there are {', '.join(runs)}")
        raise ReportError(f"{store.path} holds no trials: run `mkb run` first or pass another --db")
    return rows


def _refinement(rows: list[TrialRow], outcomes: dict[str, list[dict]]) -> dict:
    slower, correct = refinement.slower_than_eager(rows)
    share = refinement.variance_share(rows)
    return {"by_round": [dataclasses.asdict(r) for r in refinement.by_round(outcomes)],
            "slower_than_eager": {"correct_trials": correct, "slower": slower,
                                  "share": slower / correct if correct else None},
            "variance_share": dataclasses.asdict(share)}


def _repeated_code(groups: list[m.RepeatedCode], min_margin: float, notes: list[str]) -> dict:
    """Identical code graded more than once: how far apart its times fell, and how many of its pairs the comparison
    rule would have called a difference (each one a false improvement or regression)."""
    pairs, untied = sum(g.pairs for g in groups), sum(g.untied for g in groups)
    largest = max((g.ratio for g in groups), default=None)
    if untied:
        enough = math.floor((largest - 1) * 100) / 100 + 0.01  # the next hundredth strictly above the largest gap
        notes.append(f"identical code graded more than once: {untied} of {pairs} pairs of its gradings were not ties "
                     f"(times up to {largest:.2f}x apart), so paired outcomes at min_margin {min_margin:g} count "
                     f"some noise as improvements and regressions; `mkb report --min-margin {enough:.2f}` "
                     "makes differences that size ties")
    return {"files": [{**dataclasses.asdict(g), "ratio": g.ratio} for g in groups], "pairs": pairs,
            "untied": untied, "largest_ratio": largest}


def build_report(rows: list[TrialRow], run_id: str | None = None, n_boot: int = 2000,
                 outcomes: dict[str, list[dict]] | None = None, min_margin: float = 0.0) -> dict:
    """Every measurement of the report as one JSON-ready dict (see LEGEND); `outcomes` (per-submission records, from
    Store.submission_outcomes) adds the by-round refinement measurements and the repeated gradings of identical
    code; `min_margin` is the floor of every comparison's tie margin (metrics.compare)."""
    if not rows:
        raise ReportError("no trials to report")
    notes = []
    statuses = defaultdict(int)
    for r in rows:
        statuses[r.status] += 1
    offline = any((r.result or {}).get("offline_client") for r in rows)
    if offline:
        notes.append("OFFLINE client (replay or reference): these are not a model's results")
    report: dict[str, Any] = {
        "run_id": run_id or ",".join(sorted({r.run_id for r in rows})),
        "models": sorted({r.model for r in rows}), "offline_client": offline,
        "thresholds": [_threshold_key(t) for t in m.THRESHOLDS], "confidence": CONFIDENCE, "bootstrap_resamples": n_boot,
        "min_margin": min_margin,
        "trials": {"total": len(rows), **{s: statuses.get(s, 0) for s in ("finished", "skipped", "running", "pending")}},
        "ladders": {key: {k: _ladder_entry(v) for k, v in m.group(rows, key).items()} for key in m.GROUP_KEYS},
        "usage": {k: _usage(v) for k, v in m.group(rows, "arm").items()},
        "skill_audit": {k: _skill_audit(v) for k, v in m.group(rows, "arm").items() if any(r.skill_audit for r in v)},
    }
    if statuses.get("finished", 0) == 0:
        notes.append("no trial has finished: ladders are empty (S = null)")
    pairs = {"skill": m.pair_trials(rows, "skill", min_margin), "placebo": m.pair_trials(rows, "placebo", min_margin),
             "solo_control": m.solo_noise_pairs(rows, min_margin=min_margin)}
    report["unpaired"] = {"skill": m.unpaired(rows, "skill"), "placebo": m.unpaired(rows, "placebo")}
    report["paired"] = {arm: _paired_arm(ps, n_boot) for arm, ps in pairs.items() if ps}
    if not pairs["skill"]:
        notes.append(NEED_SKILL)
    if not pairs["solo_control"]:
        notes.append("no solo-vs-solo control pairs (run with the solo control replicate): no control noise floor")
    # verdicts: each treated arm's lift against its own noise range and the control's
    control = report["paired"].get("solo_control")
    verdicts: dict[str, Any] = {}
    for arm in ("skill", "placebo"):
        if arm not in report["paired"]:
            continue
        entry = report["paired"][arm]
        ctl_cells = {(c["model"], c["target_dsl"]): c for c in control["cells"]} if control else {}
        verdicts[arm] = {"overall": _verdict(entry["overall"], control["overall"] if control else None),
                         "cells": [{"model": c["model"], "direction": c["direction"],
                                    **_verdict(c, ctl_cells.get((c["model"], c["target_dsl"])))}
                                   for c in entry["cells"]]}
    report["verdicts"] = verdicts
    report["noise_for_size"] = _noise_for_size(rows, report["paired"])
    report["refinement"] = _refinement(rows, outcomes or {})
    # relative standing: skill, placebo, and the solo control in place of the skill arm
    standing: dict[str, Any] = {}
    if pairs["skill"]:
        standing["skill"] = _standing(rows, pairs["skill"], min_margin)
        if pairs["placebo"]:
            standing["placebo"] = _standing(rows, pairs["placebo"], min_margin)
        ctl = _control_pairs_for(pairs["skill"], pairs["solo_control"])
        if ctl:
            standing["solo_control"] = _standing(rows, ctl, min_margin)
        standing["skill_excess"] = {f"over_{arm}": _excess(standing["skill"], standing[arm])
                                    for arm in ("placebo", "solo_control") if arm in standing}
    report["standing"] = standing
    report["repeated_code"] = _repeated_code(m.repeated_code(rows, outcomes or {}, min_margin), min_margin, notes)
    report["notes"] = notes
    report["legend"] = LEGEND
    return _clean(report)


# -- legend: every field of report.json ----------------------------------------------------------------------
LEGEND: dict[str, str] = {
    "run_id": "the run reported (comma-separated when several runs are reported together; pairs never cross runs)",
    "models": "models whose trials are in the report",
    "offline_client": "true when any trial came from an offline client (replay, reference): not a model's result",
    "thresholds": "the speedup thresholds t of the R@t ladder",
    "confidence": "confidence level of every interval",
    "bootstrap_resamples": "problem-bootstrap resamples per interval (seeded, numpy default_rng(0))",
    "trials": "trial counts by status: total, finished, skipped (no source skill), running (interrupted), pending",
    "total": "number of trials",
    "finished": "trials with a result: the only ones measured",
    "skipped": "skill/placebo trials whose source solo wrote no skill; excluded",
    "running": "interrupted trials; excluded", "pending": "trials not started; excluded",
    "ladders": "ladders per group: keyed by 'arm', 'model', 'direction' (source→target, or the DSL for solo) and "
               "'family' (problem id up to '/'), then by group name",
    "arm": "solo, skill or placebo", "model": "the model", "direction": "source→target for treated trials; DSL for solo",
    "family": "problem id up to its first '/'",
    "n": "finished trials (ladders) or pairs (paired statistics): the denominator",
    "excluded": "trials of the group not finished (skipped, pending, running), left out of every denominator",
    "passed": "finished trials that passed",
    "r_at": "R@t keyed by threshold t: share of finished trials that passed with speedup vs eager > t (R@0 = pass rate)",
    "s": "S = 100 * mean over thresholds of R@t (0-100); null over zero trials",
    "fast_p1": "KernelBench fast_1: share of finished trials passing with speedup vs eager > 1",
    "geomean_speedup": "exp(mean ln speedup vs eager) over passing trials with a measured speedup",
    "pass_rate": "pass rate (passed / n) with its Wilson interval",
    "estimate": "point estimate", "low": "lower end of the interval", "high": "upper end of the interval",
    "usage": "usage per arm, over trials that recorded usage",
    "trials_with_usage": "trials with a usage record",
    "output_tokens": "total output tokens", "output_tokens_mean": "mean output tokens per trial",
    "cost_usd": "total cost in USD (null when no client reported cost)", "cost_usd_mean": "mean cost per trial, USD",
    "wall_s": "total wall time, seconds", "wall_s_mean": "mean wall time per trial, seconds",
    "skill_audit": "per arm, the audits of the skills its trials wrote (agent/trial.py audit_skill)",
    "skills": "trials with a skill audit", "mean_words": "mean words per skill",
    "leaking_code": "skills flagged leaks_code (code fences or DSL identifiers)",
    "leaking_code_share": "leaking_code / skills",
    "unpaired": "per treated arm, trials without a finished pair (unfinished, or solo counterpart missing)",
    "paired": "paired statistics per arm: 'skill' and 'placebo' vs their solo counterpart, 'solo_control' = solo "
              "control replicate vs solo replicate 0 (metrics.solo_noise_pairs), the noise floor",
    "skill": "the skill arm", "placebo": "the placebo arm (a skill from another problem)",
    "solo_control": "the solo-vs-solo control (no skill differs: what no transfer looks like)",
    "overall": "over every pair of the arm", "cells": "one entry per model × direction cell (paired) or standing "
                                                     "→ outcome counts (standing)",
    "target_dsl": "the DSL the treated trial wrote",
    "improved": "pairs where the treated trial beat its solo (+1)", "tied": "pairs level within the noise (0)",
    "regressed": "pairs where the treated trial lost to its solo (-1)",
    "mean_outcome": "(improved - regressed) / n, in [-1, 1]",
    "mean_outcome_ci": "problem-bootstrap interval of mean_outcome (stats.bootstrap_mean_ci)",
    "s_treated": "S of the treated trials of the pairs", "s_solo": "S of their solo counterparts",
    "lift_s": "s_treated - s_solo over exactly the same pairs",
    "lift_s_ci": "problem-bootstrap interval of lift_s (stats.bootstrap_ci)",
    "improvement_rate": "improved / n", "regression_rate": "regressed / n",
    "regression_rate_ci": "Wilson interval of regression_rate",
    "missing_noise": "both-correct pairs where a trial lacked noise_spread (counted as 0)",
    "mcnemar": "exact McNemar test on correctness", "treated_only": "pairs with only the treated trial correct",
    "solo_only": "pairs with only the solo trial correct",
    "p_value": "two-sided p-value (null when the test has nothing to test)",
    "p_holm": "p_value Holm-adjusted across the model × direction cells of the arm (null when p_value is null)",
    "wilcoxon": "Wilcoxon signed-rank on ln(solo_ms / treated_ms) over pairs correct in both",
    "median_log_ratio": "median ln(solo_ms / treated_ms); > 0: treated faster", "statistic": "the test statistic",
    "noise_range": "sign-flip range of mean_outcome for this number of pairs (stats.sign_flip_range, 10000 flips)",
    "observed": "the observed mean paired outcome",
    "verdicts": "per treated arm, overall and per cell: whether mean_outcome leaves the noise range and the "
                "solo_control's mean_outcome_ci (matched by model and target DSL)",
    "outside_noise_range": "mean_outcome lies outside noise_range", "outside_control_range":
        "mean_outcome lies outside the solo_control's mean_outcome_ci (null when there is no control)",
    "distinguishable": "outside the noise range and (if a control exists) outside the control's range",
    "statement": "the verdict in words; 'indistinguishable from noise' otherwise",
    "standing": "relative standing tables (metrics.relative_standing) for the skill arm, the placebo arm and the "
                "solo control put in place of the skill arm (same baseline solo, same source solo)",
    "above": "source solo better than target solo", "level": "source solo level with target solo",
    "below": "source solo worse than target solo",
    "improve_rate": "improved / pairs, per standing", "regress_rate": "regressed / pairs, per standing",
    "by_source": "cells split by whether the source solo passed",
    "source passed": "pairs whose source solo passed", "source failed": "pairs whose source solo failed",
    "missing_source": "pairs without a finished source solo, left out",
    "skill_excess": "skill improve/regress rate minus that of the arm named, per standing",
    "over_placebo": "skill minus placebo", "over_solo_control": "skill minus solo control",
    "by_round": "one entry per submission number (1 = a trial's first submission), over all trials",
    "round": "submission number within a trial", "submissions": "submissions made at that round",
    "compile_rate": "share of those submissions that compiled (imported and ran)",
    "geomean_speedup_of_passing": "geometric-mean speedup over eager of the passing submissions of that round",
    "slower_than_eager": "correct trials whose best speedup over eager PyTorch is below 1",
    "correct_trials": "correct trials with a measured speedup", "slower": "of those, slower than eager",
    "share": "slower / correct_trials",
    "variance_share": "eta squared of the per-trial pass/fail outcome grouped by problem family and by model",
    "refinement": "KernelBench-X's measurements: by_round (per submission number: compile rate, pass rate, geometric-"
                  "mean speedup of passing submissions), slower_than_eager (correct trials slower than eager PyTorch), "
                  "variance_share (eta squared of pass/fail by problem family and by model; null with one level)",
    "noise_for_size": "noise range for this run's size: the paired lift (mean paired outcome x 100, %) that a "
                      "simulation with no transfer produces (analysis/power.py; docs/metrics.md)",
    "problems": "problems in the run (or, under 'published', in the published benchmark)",
    "replicates": "replicates of each treated cell", "models_directions": "model × direction cells",
    "sigma": "simulated attempt noise (problem difficulty has sd 1)",
    "assumed_disagreement": "assumed share of solo-vs-solo replicate pairs not tied (the calibration)",
    "simulated_disagreement": "share of simulated solo-vs-solo pairs not tied",
    "measured_disagreement": "share of this run's solo_control pairs not tied (null without a control)",
    "per_cell_range": "central 95% range of one cell's lift under no transfer, %",
    "across_cells": "expected min..max of the lift across the run's cells under no transfer, %",
    "per_cell_range_at_measured": "per_cell_range rescaled by sqrt(measured / simulated disagreement) (null "
                                  "without a control)",
    "published": "the published benchmark's size and its lift spread across its cells, %, for comparison",
    "lifts": "each treated cell's lift against per_cell_range", "lift_pct": "mean_outcome x 100, %",
    "inside_noise": "lift_pct lies inside per_cell_range: indistinguishable from noise",
    "min_margin": "floor of the tie margin of every comparison (metrics.compare; `mkb report --min-margin`): two "
                  "passing trials are level unless their median times differ by more than 1 + max(spread_a, "
                  "spread_b, min_margin)",
    "repeated_code": "identical code (by file hash) passing in more than one submission of a problem and DSL, each "
                     "graded in a fresh process: the measurement's own noise (metrics.repeated_code)",
    "files": "one entry per file graded passing at least twice", "problem": "the problem id",
    "dsl": "the DSL of the trials that submitted it", "file_sha256": "the file's SHA-256",
    "gradings": "passing submissions of that file", "fastest_ms": "its fastest median time, ms",
    "slowest_ms": "its slowest median time, ms", "ratio": "slowest_ms / fastest_ms",
    "pairs": "pairs of gradings of identical code",
    "untied": "of those pairs, how many the comparison rule at min_margin calls a difference (should be 0)",
    "largest_ratio": "the largest ratio over every file (null when no file was graded twice)",
    "notes": "what could not be computed, and why", "legend": "this legend",
    "plots": "PNG files written beside report.json, by name",
}


# -- rendering ------------------------------------------------------------------------------------------------
def _f(v: Any, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _ci(iv: dict | None, digits: int = 3) -> str:
    if not iv or iv.get("low") is None:
        return "–"
    return f"[{iv['low']:.{digits}f}, {iv['high']:.{digits}f}]"


def tables(report: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """Every table of the report as (title, header, rows), rendered alike to Markdown and HTML."""
    out = []
    th = report["thresholds"]
    for key in ("arm", "model", "direction", "family"):
        rows = [[name, _f(e["n"]), _f(e["excluded"]), *[_f(e["r_at"].get(t)) for t in th], _f(e["s"], 1),
                 _f(e["fast_p1"]), _f(e["geomean_speedup"], 2), _f(e["pass_rate"]["estimate"]), _ci(e["pass_rate"])]
                for name, e in report["ladders"][key].items()]
        out.append((f"Ladder by {key}", [key, "n", "excluded", *[f"R@{t}" for t in th], "S", "fast_1",
                                          "geomean speedup (x)", "pass rate", "pass rate 95% CI"], rows))
    out.append(("Usage per arm", ["arm", "trials with usage", "output tokens", "mean output tokens", "cost (USD)",
                                  "wall time (s)", "mean wall time (s)"],
                [[a, _f(u["trials_with_usage"]), _f(u["output_tokens"]), _f(u["output_tokens_mean"], 0),
                  _f(u["cost_usd"], 2), _f(u["wall_s"], 1), _f(u["wall_s_mean"], 1)]
                 for a, u in report["usage"].items()]))
    out.append(("Skill audit", ["arm", "skills", "mean words", "leaking code", "share leaking code"],
                [[a, _f(s["skills"]), _f(s["mean_words"], 1), _f(s["leaking_code"]), _f(s["leaking_code_share"])]
                 for a, s in report["skill_audit"].items()]))
    if report["paired"]:
        header = ["arm", "model", "direction", "n", "improved", "tied", "regressed", "mean outcome", "95% CI",
                  "noise range", "lift S", "lift S 95% CI", "regression rate", "95% CI", "McNemar p", "Holm p",
                  "Wilcoxon p", "Holm p"]
        rows = []
        for arm, e in report["paired"].items():
            for label, c in [(("all", "all"), e["overall"])] + [((c["model"], c["direction"]), c) for c in e["cells"]]:
                rows.append([arm, *label, _f(c["n"]), _f(c["improved"]), _f(c["tied"]), _f(c["regressed"]),
                             _f(c["mean_outcome"]), _ci(c["mean_outcome_ci"]), _ci(c["noise_range"]),
                             _f(c["lift_s"], 1), _ci(c["lift_s_ci"], 1), _f(c["regression_rate"]),
                             _ci(c["regression_rate_ci"]), _f(c["mcnemar"]["p_value"], 4),
                             _f(c["mcnemar"].get("p_holm"), 4), _f(c["wilcoxon"]["p_value"], 4),
                             _f(c["wilcoxon"].get("p_holm"), 4)])
        out.append(("Paired outcomes (treated vs solo)", header, rows))
        vrows = []
        for arm, v in report["verdicts"].items():
            vrows.append([arm, "all", "all", v["overall"]["statement"]])
            vrows += [[arm, c["model"], c["direction"], c["statement"]] for c in v["cells"]]
        out.append(("Lift against noise", ["arm", "model", "direction", "verdict"], vrows))
    nz = report.get("noise_for_size")
    if nz:
        pc, ac, pub = nz["per_cell_range"], nz["across_cells"], nz["published"]
        rows = [["size", f"{nz['problems']} problems × {nz['replicates']} replicates, {nz['models_directions']} "
                         "model × direction cells"],
                ["noise alone, one cell (95%)", f"{pc['low']:+.1f}% .. {pc['high']:+.1f}%"],
                [f"noise alone, expected extremes across {nz['models_directions']} cells",
                 f"{ac['low']:+.1f}% .. {ac['high']:+.1f}%"],
                ["solo-vs-solo disagreement: assumed / simulated / measured",
                 f"{_f(nz['assumed_disagreement'], 2)} / {_f(nz['simulated_disagreement'], 2)} / "
                 f"{_f(nz['measured_disagreement'], 2)}"]]
        if nz["per_cell_range_at_measured"]:
            r = nz["per_cell_range_at_measured"]
            rows.append(["one cell (95%), rescaled to the measured disagreement",
                         f"{r['low']:+.1f}% .. {r['high']:+.1f}%"])
        rows.append([f"published benchmark ({pub['problems']} problems × {pub['replicates']}, "
                     f"{pub['models_directions']} cells)", f"{pub['low']:+.0f}% .. {pub['high']:+.0f}%"])
        for c in nz["lifts"]:
            verdict = ("–" if c["inside_noise"] is None else
                       "inside: indistinguishable from noise" if c["inside_noise"] else "outside the noise range")
            rows.append([f"{c['arm']} lift, {c['model']} | {c['direction']}",
                         f"{_f(c['lift_pct'], 1)}% ({verdict})"])
        rows.append(["statement", nz["statement"]])
        out.append(("Noise range for this run's size", ["quantity", "value"], rows))
    ref = report.get("refinement")
    if ref:
        out.append(("Refinement by submission round", ["round", "submissions", "compile rate", "pass rate",
                                                        "geomean speedup of passing (x)"],
                    [[str(r["round"]), str(r["submissions"]), _f(r["compile_rate"]), _f(r["pass_rate"]),
                      _f(r["geomean_speedup_of_passing"], 2)] for r in ref["by_round"]]))
        slow, share = ref["slower_than_eager"], ref["variance_share"]
        out.append(("Correct but slow; what explains outcomes", ["quantity", "value"],
                    [["correct trials slower than eager", f"{slow['slower']} of {slow['correct_trials']} "
                                                          f"({_f(slow['share'])})"],
                     ["outcome variance explained by family (eta²)", _f(share["family"])],
                     ["outcome variance explained by model (eta²)", _f(share["model"])]]))
    rc = report.get("repeated_code")
    if rc and rc["files"]:
        rows = [[f["problem"], f["dsl"], f["file_sha256"][:12], _f(f["gradings"]), _f(f["fastest_ms"], 4),
                 _f(f["slowest_ms"], 4), _f(f["ratio"], 3), f"{f['untied']} of {f['pairs']}"] for f in rc["files"]]
        out.append((f"Identical code graded more than once (min margin {report['min_margin']:g})",
                    ["problem", "DSL", "file", "gradings", "fastest (ms)", "slowest (ms)", "slowest / fastest",
                     "pairs not tied"], rows))
    for arm, t in report["standing"].items():
        if arm == "skill_excess":
            rows = [[name, s, _f(d["improve_rate"]), _f(d["regress_rate"])]
                    for name, ex in t.items() for s, d in ex.items()]
            out.append(("Skill excess over placebo and solo control, by standing",
                        ["comparison", "standing", "improve rate excess", "regress rate excess"], rows))
            continue
        rows = [[s, *[_f(t["cells"][s][o]) for o in m.OUTCOME_NAMES.values()], _f(t["improve_rate"][s]),
                 _f(t["regress_rate"][s])] for s in m.STANDING_NAMES.values()]
        out.append((f"Relative standing: {arm}", ["source solo vs target solo", "improved", "tied", "regressed",
                                                   "improve rate", "regress rate"], rows))
    return out


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(map(esc, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(esc, r)) + " |" for r in rows]
    return "\n".join(lines)


def _html_table(title: str, header: list[str], rows: list[list[str]]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return (f'<h2>{e(title, quote=False)}</h2>\n<table class="mkb">'
            f'<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')


def render_markdown(report: dict, plot_files: dict[str, Path]) -> str:
    parts = [f"# MetaKernelBench report: run `{report['run_id']}`", "",
             f"Models: {', '.join(report['models'])}. Trials: " +
             ", ".join(f"{k} {v}" for k, v in report["trials"].items()) + "."]
    if report["offline_client"]:
        parts += ["", "**OFFLINE client (replay or reference): not a model's result.**"]
    for n in report["notes"]:
        parts += ["", f"> Note: {n}"]
    for title, header, rows in tables(report):
        parts += ["", f"## {title}", "", _md_table(header, rows) if rows else "(none)"]
    if plot_files:
        parts += ["", "## Plots", ""] + [f"![{name}]({p.name})" for name, p in plot_files.items()]
    parts += ["", "Definitions: docs/metrics.md; every field of report.json is defined in its \"legend\"."]
    return "\n".join(parts) + "\n"


def render_html(report: dict, plot_files: dict[str, Path]) -> str:
    e = html.escape
    parts = [f"<h1>MetaKernelBench report: run {e(report['run_id'])}</h1>",
             f"<p>Models: {e(', '.join(report['models']))}. Trials: " +
             e(", ".join(f"{k} {v}" for k, v in report["trials"].items())) + ".</p>"]
    if report["offline_client"]:
        parts.append("<p><strong>OFFLINE client (replay or reference): not a model's result.</strong></p>")
    parts += [f'<p class="note">Note: {e(n)}</p>' for n in report["notes"]]
    for title, header, rows in tables(report):
        parts.append(_html_table(title, header, rows))
    if plot_files:
        parts.append("<h2>Plots</h2>")
        for name, p in plot_files.items():
            data = base64.b64encode(p.read_bytes()).decode("ascii")
            parts.append(f'<figure><img alt="{e(name)}" src="data:image/png;base64,{data}">'
                         f"<figcaption>{e(name)}</figcaption></figure>")
    style = ("body{font-family:sans-serif;margin:2em}table.mkb{border-collapse:collapse;margin-bottom:1em;"
             "font-size:90%}table.mkb td,table.mkb th{border:1px solid #bbb;padding:2px 6px}"
             "img{max-width:100%}.note{color:#a40}")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>MKB report {e(report['run_id'])}</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n")


def write_report(rows: list[TrialRow], out: Path, run_id: str | None = None, n_boot: int = 2000,
                 outcomes: dict[str, list[dict]] | None = None, min_margin: float = 0.0) -> dict:
    """Build the report from `rows` and write report.json, report.md, report.html and the plot PNGs into `out`.
    Returns the report dict (with "plots": name -> file name)."""
    from metakernelbench.analysis import plots

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    report = build_report(rows, run_id, n_boot, outcomes, min_margin)
    plot_files = plots.make_plots(rows, report, out)
    report["plots"] = {name: p.name for name, p in plot_files.items()}
    (out / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False, allow_nan=False))
    (out / "report.md").write_text(render_markdown(report, plot_files))
    (out / "report.html").write_text(render_html(report, plot_files))
    return report


def report_store(store: Store, out: Path, run_id: str | None = None, n_boot: int = 2000,
                 min_margin: float = 0.0) -> dict:
    """The whole report of a store's run (every run when run_id is None); ReportError when it holds no trials."""
    return write_report(load_rows(store, run_id), out, run_id, n_boot, store.submission_outcomes(run_id), min_margin)
