"""A run's full report, answer first: the paper's Table 1 and its two figures open it, every other measurement of
docs/metrics.md follows, as JSON (with a legend), Markdown and self-contained HTML.

All numbers come from `metrics` (definitions), `stats` (uncertainty) and `transfer` (Table 1 and its tests); nothing
here re-defines a metric. The report is built as one JSON-ready dict (`build_report`), then rendered
(`write_report`): the page is a list of blocks (tables, figures, legends) rendered alike to Markdown and HTML, the
plots (see `plots`) written as PNG files that the HTML embeds as base64.
"""
from __future__ import annotations

import base64
import dataclasses
import html
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metakernelbench.analysis import metrics as m
from metakernelbench.analysis import power as pw
from metakernelbench.analysis import refinement
from metakernelbench.analysis import stats as st
from metakernelbench.analysis import transfer as tr
from metakernelbench.store import Store, TrialRow

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


# -- verdicts, standing, noise for size -----------------------------------------------------------------------
def _verdict(row: dict, cells: int, alpha: float) -> dict:
    """Whether a row's paired outcome beats noise, in words: the exact sign test and, with a solo control, the exact
    paired test against it on the same baselines; the larger p, Holm-adjusted across the arm's cells."""
    po = row["paired_outcome"]
    if po["estimate"] is None:
        return {"model": row["model"], "direction": row["direction"], "distinguishable": None, "statement": "no pairs"}
    lo, hi = row["noise_range"]
    text = (f"paired outcome {po['estimate']:+.1f}% over {row['pairs']} pairs (sign-flip noise range {lo:+.1f}% to "
            f"{hi:+.1f}%), sign test p = {row['sign_p']:.3g}")
    if row["control_p"] is not None:
        text += (f"; against the solo control on the same {row['matched']} baselines {row['control_diff']:+.1f}%, "
                 f"p = {row['control_p']:.3g}")
    where = "pooled, unadjusted" if row["model"] == "all" else f"Holm-adjusted over {cells} cells"
    beats = po["beats_noise"]
    text += (f"; {where} p = {po['p_holm']:.3g} " + (f"<= {alpha:g}: beats noise" if beats else
                                                      f"> {alpha:g}: indistinguishable from noise"))
    return {"model": row["model"], "direction": row["direction"], "distinguishable": beats, "statement": text}


def _standing(rows: list[TrialRow], pairs: list[m.Pair], min_margin: float, signs: list[int | None]) -> dict:
    t = m.relative_standing(rows, pairs, min_margin, signs)
    return {"cells": t.cells, "improve_rate": t.improve_rate, "regress_rate": t.regress_rate,
            "by_source": t.by_source, "missing_source": t.missing_source}


def _standing_section(rows: list[TrialRow], pairs: dict[str, list[m.Pair]], signs: dict[str, list[int | None]],
                      min_margin: float, n_boot: int) -> dict:
    """Standing tables of the skill arm, the placebo arm and the solo control put in the skill arm's place; the skill
    arm's excess over each, with problem-bootstrap intervals and a sentence; the caveat when there is no control."""
    skill = pairs["skill"]
    arms = {"skill": skill, "placebo": pairs["placebo"],
            "solo_control": tr.control_in_place(skill, pairs["solo_control"])}
    arms = {a: ps for a, ps in arms.items() if ps}
    place = {a: signs[a] if a in signs else m.standings(rows, ps, min_margin) for a, ps in arms.items()}
    out: dict[str, Any] = {a: _standing(rows, ps, min_margin, place[a]) for a, ps in arms.items()}
    names = {"placebo": "placebo arm", "solo_control": "solo control in the skill arm's place"}
    out["excess"] = {f"over_{a}": tr.standing_excess(skill, place["skill"], arms[a], place[a], n_boot, CONFIDENCE)
                     for a in ("placebo", "solo_control") if a in arms}
    out["sentences"] = {k: tr.excess_sentence(v, names[k[5:]]) for k, v in out["excess"].items()}
    out["caveat"] = None if "solo_control" in arms else tr.NO_CONTROL_CAVEAT
    def cells_of(arm: str, model: str) -> dict:
        kept = [(p, x) for p, x in zip(arms[arm], place[arm]) if p.treated.model == model]
        return m.standing_cells([p for p, _ in kept], [x for _, x in kept])

    out["by_model"] = {model: {a: cells_of(a, model) for a in arms if a != "placebo"}
                       for model in sorted({p.treated.model for p in skill})}
    return out


def _noise_for_size(rows: list[TrialRow], paired: dict) -> dict:
    """The lift that noise alone produces for this run's size (power.no_transfer_lift_range: problems, replicates
    and model × direction cells of the run), and each treated cell's lift (paired outcome, %) against the band that
    holds every cell at once, so the labels keep their rate across cells."""
    treated = [r for r in rows if r.arm in m.TREATED_ARMS]
    problems = len({r.problem for r in rows})
    replicates = len({r.replicate for r in treated}) or 1
    cells = len({(r.model, m.direction(r)) for r in treated}) or len({(r.model, r.dsl) for r in rows})
    sim = pw.no_transfer_lift_range(problems, replicates, cells)
    control = paired.get("solo_control", {}).get("overall")
    measured = (1.0 - control["tied"] / control["pairs"]) if control and control["pairs"] else None
    scale = math.sqrt(measured / sim.disagreement) if measured is not None and sim.disagreement > 0 else None
    band = sim.simultaneous * (scale or 1.0)
    lifts = []
    for arm in m.TREATED_ARMS:
        for c in paired.get(arm, {}).get("rows", []):
            lift = c["paired_outcome"]["estimate"]
            lifts.append({"arm": arm, "model": c["model"], "direction": c["direction"], "lift_pct": lift,
                          "inside_noise": None if lift is None else abs(lift) <= band})
    rescaled = ", rescaled to the measured disagreement" if scale else ""
    one = [v * (scale or 1.0) for v in (sim.low, sim.high)]
    statement = (f"noise alone keeps all {cells} model × direction cells within ±{band:.0f}% paired outcome in "
                 f"{CONFIDENCE:.0%} of runs of this size ({problems} problems × {replicates} "
                 f"replicate{'s' if replicates != 1 else ''}{rescaled}; one cell alone within "
                 f"{one[0]:+.0f}%..{one[1]:+.0f}%): a lift inside is indistinguishable from noise")
    return {"problems": problems, "replicates": replicates, "models_directions": cells, "sigma": sim.sigma,
            "assumed_disagreement": pw.TARGET_DISAGREEMENT, "simulated_disagreement": sim.disagreement,
            "measured_disagreement": measured,
            "per_cell_range": {"low": sim.low, "high": sim.high},
            "across_cells": {"low": sim.cells_low, "high": sim.cells_high},
            "simultaneous_band": sim.simultaneous,
            "per_cell_range_at_measured": ({"low": sim.low * scale, "high": sim.high * scale} if scale else None),
            "band": band, "published": dict(pw.PUBLISHED), "lifts": lifts, "statement": statement}


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
    return _build(rows, run_id, n_boot, outcomes, min_margin)[0]


def _build(rows: list[TrialRow], run_id: str | None, n_boot: int, outcomes: dict[str, list[dict]] | None,
           min_margin: float) -> tuple[dict, dict[str, list[m.Pair]]]:
    """The report and the pairs it was computed from (the plots draw the same pairs)."""
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
        "thresholds": [_threshold_key(t) for t in m.THRESHOLDS], "confidence": CONFIDENCE,
        "alpha": round(1 - CONFIDENCE, 10), "bootstrap_resamples": n_boot, "min_margin": min_margin,
        "trials": {"total": len(rows),
                   **{s: statuses.get(s, 0) for s in ("finished", "skipped", "agent_error", "running",
                                                       "pending")}},
        "ladders": {key: {k: _ladder_entry(v) for k, v in m.group(rows, key).items()} for key in m.GROUP_KEYS},
        "usage": {k: _usage(v) for k, v in m.group(rows, "arm").items()},
        "skill_audit": {k: _skill_audit(v) for k, v in m.group(rows, "arm").items() if any(r.skill_audit for r in v)},
    }
    if statuses.get("finished", 0) == 0:
        notes.append("no trial has finished: ladders are empty (S = null)")
    pairs = {"skill": m.pair_trials(rows, "skill", min_margin), "placebo": m.pair_trials(rows, "placebo", min_margin),
             "solo_control": m.solo_noise_pairs(rows, min_margin=min_margin)}
    report["unpaired"] = {a: m.unpaired(rows, a) for a in m.TREATED_ARMS}
    report["skipped_as_base"] = {a: sum(p.base_stand_in for p in pairs[a]) for a in m.TREATED_ARMS}
    control = pairs["solo_control"]
    signs = {a: m.standings(rows, pairs[a], min_margin) for a in m.TREATED_ARMS}
    units = {a: tr.units(rows, ps, control if a != "solo_control" else [], min_margin, signs.get(a))
             for a, ps in pairs.items() if ps}
    report["paired"] = {a: _clean(tr.table(a, u, n_boot, CONFIDENCE)) for a, u in units.items()}
    own = {a: [(p, x) for p, x in zip(pairs[a], signs[a]) if not p.base_stand_in] for a in m.TREATED_ARMS
           if report["skipped_as_base"][a]}
    report["without_skipped"] = {
        a: _clean(tr.table(a, tr.units(rows, [p for p, _ in kept], control, min_margin, [x for _, x in kept]),
                           n_boot, CONFIDENCE)) for a, kept in own.items() if kept}
    if not pairs["skill"]:
        notes.append(NEED_SKILL)
    if not control:
        notes.append("no solo-vs-solo control pairs (run with the solo control replicate): no control noise floor, "
                     "and the relative standing cannot be told from regression to the mean")
    alpha = report["alpha"]
    report["verdicts"] = {a: {"overall": _verdict(report["paired"][a]["overall"], 1, alpha),
                              "cells": [_verdict(c, len(report["paired"][a]["rows"]), alpha)
                                        for c in report["paired"][a]["rows"]]}
                          for a in m.TREATED_ARMS if a in report["paired"]}
    report["noise_for_size"] = _noise_for_size(rows, report["paired"])
    report["refinement"] = _refinement(rows, outcomes or {})
    report["standing"] = (_clean(_standing_section(rows, pairs, signs, min_margin, n_boot)) if pairs["skill"]
                          else {})
    report["repeated_code"] = _repeated_code(m.repeated_code(rows, outcomes or {}, min_margin), min_margin, notes)
    report["notes"] = notes
    report["legend"] = LEGEND
    return _clean(report), pairs


# -- legend: every field of report.json ----------------------------------------------------------------------
LEGEND: dict[str, str] = {
    "run_id": "the run reported (comma-separated when several runs are reported together; pairs never cross runs)",
    "models": "models whose trials are in the report",
    "offline_client": "true when any trial came from an offline client (replay, reference): not a model's result",
    "thresholds": "the speedup thresholds t of the R@t ladder",
    "confidence": "confidence level of every interval",
    "alpha": "level of every beats-noise mark: 1 - confidence",
    "bootstrap_resamples": "problem-bootstrap resamples per interval (seeded, numpy default_rng(0))",
    "trials": "trial counts by status: total, finished, skipped (no source skill), agent_error (set-up failures, in "
              "no metric), running (interrupted), pending",
    "total": "number of trials",
    "finished": "trials with a result: the only ones in the ladders",
    "skipped": "skill/placebo trials whose source solo wrote no skill (trials); in a paired row, those of its pairs "
               "counted as their base",
    "running": "interrupted trials; excluded", "pending": "trials not started; excluded",
    "agent_error": "trials whose agent could not be set up (never attempted the task); excluded, retried on resume",
    "ladders": "ladders per group: keyed by 'arm', 'model', 'direction' (source→target, or the DSL for solo) and "
               "'family' (problem id up to '/'), then by group name",
    "arm": "solo, skill, placebo or solo_control", "model": "the model ('all': every pair of the arm)",
    "direction": "source→target for treated trials; the DSL for solo ('all': every pair of the arm)",
    "family": "problem id up to its first '/'",
    "n": "finished trials (ladders) or pairs in the denominator (a measure)",
    "excluded": "trials of the group not finished (skipped, pending, running), left out of every denominator",
    "passed": "finished trials that passed",
    "r_at": "R@t keyed by threshold t: share of finished trials that passed with speedup vs eager >= t (R@0 = pass "
            "rate)",
    "s": "S = 100 * mean over thresholds of R@t (0-100); null over zero trials",
    "fast_p1": "KernelBench fast_1: share of finished trials passing with speedup vs eager > 1 (strict)",
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
    "unpaired": "per treated arm, trials left out of the pairs (pending, running, or no finished solo counterpart)",
    "skipped_as_base": "per treated arm, skipped trials counted as their base (the paper's rule): ties with the "
                       "solo's result",
    "paired": "per arm, the paired table (transfer.table; the skill arm's is the paper's Table 1): 'skill' and "
              "'placebo' vs their solo counterpart, skipped trials counted as their base; 'solo_control' = solo "
              "control replicate vs solo replicate 0 (metrics.solo_noise_pairs), the noise floor",
    "without_skipped": "our unpaired view beside the paper's: the same table over the arm's pairs with the skipped "
                       "trials left out (only when some were skipped)",
    "skill": "the skill arm", "placebo": "the placebo arm (a skill from another problem)",
    "solo_control": "the solo-vs-solo control (no skill differs: what no transfer looks like)",
    "has_control": "the arm's pairs were matched with solo-control pairs (the tests against the control ran)",
    "rows": "one row per model × direction; tests Holm-adjusted across these rows, one family per measure",
    "overall": "every pair of the arm pooled; its tests unadjusted",
    "pairs": "pairs in the row (repeated_code: pairs of gradings of identical code)",
    "matched": "pairs with a solo-control pair of the same baseline solo (the tests against the control use these)",
    "improved": "pairs where the treated trial beat its solo (+1)", "tied": "pairs level within the noise (0)",
    "regressed": "pairs where the treated trial lost to its solo (-1)",
    "missing_noise": "both-correct pairs where a trial lacked noise_spread (counted as 0)",
    "s_treated": "S of the treated trials of the pairs", "s_solo": "S of their solo counterparts",
    "lift_s": "s_treated - s_solo over exactly the same pairs, with its problem-bootstrap interval",
    "correctness_lift": "(treated passed - solo passed) / pairs, percentage points; test: exact McNemar",
    "runtime_lift": "exp(mean ln(solo_ms / treated_ms)) - 1 over pairs correct in both, %; test: Wilcoxon "
                    "signed-rank",
    "paired_outcome": "(improved - regressed) / pairs, %; test: exact sign test and, with a solo control, the exact "
                      "paired sign-flip test against it (the larger p)",
    "regression_rate": "regressed / pairs, %; interval: Wilson on the effective sample size; test: exact McNemar on "
                       "regressions, treated vs the matched solo control",
    "improve_when_above": "improved / pairs whose source solo stood above the target solo, %; test: exact McNemar on "
                          "improvements vs the matched solo control in that standing",
    "regress_when_below": "regressed / pairs whose source solo stood below, %; test: exact McNemar on regressions vs "
                          "the matched solo control in that standing",
    "control": "the same statistic for the matched solo control pairs (null without a control); excess: the other "
               "arm's rate",
    "p_value": "two-sided p-value of the measure's test of no transfer (null: nothing to test)",
    "p_holm": "p_value Holm-adjusted across the arm's model × direction rows (the pooled row: unadjusted)",
    "beats_noise": "p_holm <= alpha (null: nothing to test)",
    "mcnemar": "exact McNemar test on correctness", "treated_only": "pairs with only the treated trial correct",
    "solo_only": "pairs with only the solo trial correct",
    "wilcoxon": "Wilcoxon signed-rank on ln(solo_ms / treated_ms) over pairs correct in both",
    "median_log_ratio": "median ln(solo_ms / treated_ms); > 0: treated faster", "statistic": "the test statistic",
    "noise_range": "exact sign-flip range (central 95%) of paired_outcome for this row's pairs, %",
    "sign_p": "exact two-sided sign test of paired_outcome",
    "control_diff": "mean (treated outcome - control outcome) over matched pairs, % (null without a control)",
    "control_p": "exact paired sign-flip test of control_diff (null without a control)",
    "verdicts": "per treated arm, overall and per cell: whether the paired outcome beats noise (its beats_noise), in "
                "words",
    "distinguishable": "the row's paired_outcome beats noise",
    "statement": "the verdict (or the noise range) in words; 'indistinguishable from noise' otherwise",
    "standing": "relative standing tables (metrics.relative_standing) for the skill arm, the placebo arm and the "
                "solo control put in place of the skill arm (same baseline solo, same source solo)",
    "cells": "standing -> outcome -> pairs",
    "above": "source solo better than target solo", "level": "source solo level with target solo",
    "below": "source solo worse than target solo",
    "improve_rate": "improved / pairs, per standing", "regress_rate": "regressed / pairs, per standing",
    "by_source": "cells split by whether the source solo passed",
    "source passed": "pairs whose source solo passed", "source failed": "pairs whose source solo failed",
    "missing_source": "pairs without a finished source solo, left out",
    "excess": "skill rate minus the other arm's, per standing and rate, with problem-bootstrap intervals "
              "(transfer.standing_excess)",
    "over_placebo": "skill minus placebo", "over_solo_control": "skill minus the solo control in its place",
    "rate": "improve_rate or regress_rate", "control_pairs": "the other arm's pairs in this standing",
    "sentences": "each excess in one plain sentence", "caveat": "why a standing table without a solo control "
                                                                "cannot show transfer (null with a control)",
    "by_model": "standing cells per model (both directions pooled), for the skill arm and the solo control in its "
                "place: the figure's data",
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
    "noise_for_size": "noise range for this run's size: the paired outcome (%) that a simulation with no transfer "
                      "produces (analysis/power.py; docs/metrics.md)",
    "problems": "problems in the run (or, under 'published', in the published benchmark)",
    "replicates": "replicates of each treated cell", "models_directions": "model × direction cells",
    "sigma": "simulated attempt noise (problem difficulty has sd 1)",
    "assumed_disagreement": "assumed share of solo-vs-solo replicate pairs not tied (the calibration)",
    "simulated_disagreement": "share of simulated solo-vs-solo pairs not tied",
    "measured_disagreement": "share of this run's solo_control pairs not tied (null without a control)",
    "per_cell_range": "central 95% range of one cell's lift under no transfer, %",
    "across_cells": "expected min..max of the lift across the run's cells under no transfer, %",
    "simultaneous_band": "± this much holds all the run's cells at once in 95% of simulated no-transfer runs, %",
    "per_cell_range_at_measured": "per_cell_range rescaled by sqrt(measured / simulated disagreement) (null "
                                  "without a control)",
    "band": "simultaneous_band, rescaled to the measured disagreement when there is a control: the lifts' yardstick",
    "published": "the published benchmark's size and its lift spread across its cells, %, for comparison",
    "lifts": "each treated cell's lift against band", "lift_pct": "the cell's paired outcome, %",
    "inside_noise": "|lift_pct| <= band: indistinguishable from noise",
    "min_margin": "floor of the tie margin of every comparison (metrics.compare; `mkb report --min-margin`): two "
                  "passing trials are level unless their median times differ by more than 1 + max(spread_a, "
                  "spread_b, min_margin)",
    "repeated_code": "identical code (by file hash) passing in more than one submission of a problem and DSL, each "
                     "graded in a fresh process: the measurement's own noise (metrics.repeated_code)",
    "files": "one entry per file graded passing at least twice", "problem": "the problem id",
    "dsl": "the DSL of the trials that submitted it", "file_sha256": "the file's SHA-256",
    "gradings": "passing submissions of that file", "fastest_ms": "its fastest median time, ms",
    "slowest_ms": "its slowest median time, ms", "ratio": "slowest_ms / fastest_ms",
    "untied": "of those pairs, how many the comparison rule at min_margin calls a difference (should be 0)",
    "largest_ratio": "the largest ratio over every file (null when no file was graded twice)",
    "notes": "what could not be computed, and why", "legend": "this legend",
    "plots": "PNG files written beside report.json, by name",
}


# -- rendering: the page as blocks ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Block:
    """One piece of the page: a table (header, rows), a figure (a plot's name) or a legend (term, meaning rows);
    `caption` says what to read in it."""

    kind: str  # 'table', 'figure' or 'legend'
    title: str
    header: list[str] = dataclasses.field(default_factory=list)
    rows: list[list[str]] = dataclasses.field(default_factory=list)
    figure: str | None = None
    caption: str | None = None
    muted: frozenset[int] = frozenset()  # rows shown as reference values (the solo control beneath a skill row)


MEASURE_COLUMNS = (("correctness_lift", "correctness lift (pp)", True),
                   ("runtime_lift", "runtime lift (%)", True),
                   ("paired_outcome", "paired outcome (%)", True),
                   ("regression_rate", "regression rate (%)", False),
                   ("improve_when_above", "improve when above (%)", False),
                   ("regress_when_below", "regress when below (%)", False))
MARK, UNTESTED = "✓", "n/t"


def _f(v: Any, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _p(v: float | None) -> str:
    return "–" if v is None else "<0.0001" if v < 1e-4 else f"{v:.4f}"


def _ci(iv: dict | None, digits: int = 3) -> str:
    if not iv or iv.get("low") is None:
        return "–"
    return f"[{iv['low']:.{digits}f}, {iv['high']:.{digits}f}]"


def _signed(v: float | None, signed: bool) -> str:
    return "–" if v is None else f"{v:+.1f}" if signed else f"{v:.1f}"


def _measure(meas: dict, signed: bool) -> str:
    """'+12.3 [+4.0, +20.1] ✓': estimate, interval, and the beats-noise mark (n/t: nothing to test)."""
    if meas["estimate"] is None:
        return "–"
    text = _signed(meas["estimate"], signed)
    if meas["low"] is not None:
        text += f" [{_signed(meas['low'], signed)}, {_signed(meas['high'], signed)}]"
    mark = {True: f" {MARK}", False: "", None: f" {UNTESTED}"}[meas["beats_noise"]]
    return text + mark


def _table1(report: dict) -> Block:
    """The paper's Table 1: the skill arm per model × direction, each with the solo control's value beneath."""
    t = report["paired"]["skill"]
    rows = []
    for r in t["rows"] + [t["overall"]]:
        rows.append([r["model"], r["direction"], "skill", f"{r['pairs']} ({r['skipped']} skipped)",
                     *[_measure(r[k], signed) for k, _, signed in MEASURE_COLUMNS]])
        if t["has_control"]:
            rows.append(["", "", "solo control", str(r["matched"]),
                         *[_signed(r[k]["control"], signed) for k, _, signed in MEASURE_COLUMNS]])
    caption = ("Each skill row compares a model's skill trials in the target DSL with its own solo attempts at the "
               "same problems and replicates; skipped skill trials (the source wrote no skill) count as their base, "
               f"as in the paper. {MARK} marks a measure that beats noise: its test of no transfer, Holm-adjusted "
               f"across the model × direction rows (one family per column), gives p <= {report['alpha']:g}; "
               f"{UNTESTED}: nothing to test. Intervals: {report['confidence']:.0%}, problem bootstrap. ")
    if t["has_control"]:
        caption += ("The solo control row beneath is a second solo attempt against the same baseline solo: what the "
                    "same numbers look like with no skill at all. ")
    else:
        caption += ("This run has no solo control: regression rates and the standing columns cannot be tested "
                    "against noise (" + tr.NO_CONTROL_CAVEAT + ")")
    return Block("table", "Table 1: skill vs solo, per model and direction",
                 ["model", "direction", "arm", "pairs", *[name for _, name, _ in MEASURE_COLUMNS]], rows,
                 caption=caption, muted=frozenset(i for i, r in enumerate(rows) if r[2] == "solo control"))


FIGURE_CAPTIONS = {
    "paired_lift": ("Figure 1. Paired outcome by problem. Each row is a model and direction (skill vs the target's "
                    "solo) or, marked solo control, a model and DSL (a second solo attempt vs the first); each column "
                    "a problem. Blue: the treated trial beat its solo (mean over replicates); red: it lost; white: "
                    "tied; grey: no pair. Read whether gains spread across problems or sit in a few, and compare "
                    "with the solo-control rows: the colour noise alone paints."),
    "standing": ("Figure 2. Outcomes by relative standing: the share of pairs improved, tied and regressed, by whether "
                 "the skill's source solo stood above, level with or below the target's solo (both directions pooled "
                 "per model). Compare each skill bar with the solo-control bar beside it: a target solo below its "
                 "source was probably an unlucky attempt, so any fresh attempt tends to beat it (regression to the "
                 "mean). Only the difference between the bars is transfer."),
    "ladders": "R@t per arm: the share of finished trials passing with speedup ≥ t over PyTorch eager.",
    "speed_scatter": ("Speed of pairs correct in both: each point a pair; above the diagonal the treated trial was "
                      "faster than its solo."),
    "regression_vs_noise": ("Regression rate per model and direction with its interval (Wilson on the effective "
                            "sample size), and the solo control's rate: a skill rate inside the control's band is what "
                            "noise alone gives."),
}


def _legends(report: dict) -> Block:
    th = ", ".join(report["thresholds"])
    rows = [["R@t", f"share of finished trials that passed with speedup vs PyTorch eager ≥ t, t ∈ {{{th}}}; R@0 is "
                    "the pass rate"],
            ["S", "100 × the mean of R@t over those thresholds (0–100), the paper's score"],
            ["fast_1", "KernelBench's: share passing with speedup > 1 (strict, where R@1 is ≥)"],
            ["paired outcome", "(improved − regressed) / pairs: a pair improves when the treated trial is correct "
                               "and its solo is not, or both are correct and it is faster beyond the timing noise"],
            ["correctness lift", "treated pass rate − solo pass rate over the same pairs, percentage points"],
            ["runtime lift", "geometric mean of solo time / treated time over pairs correct in both, − 1"],
            ["improve when above / regress when below", "improve (regress) rate of the pairs whose source solo stood "
                                                         "above (below) the target's solo"],
            ["tests", "correctness lift: exact McNemar; runtime lift: Wilcoxon signed-rank on the log time ratios; "
                      "paired outcome: exact sign test and, with a solo control, the exact paired sign-flip test "
                      "against it on the same baselines (the larger p counts); regression rate and the standing "
                      "columns: exact McNemar against the matched solo control (without one: n/t)"],
            ["p-values", f"two-sided; 'Holm': adjusted across the model × direction rows of an arm, one family per "
                         f"column, so the chance of any false {MARK} among them stays at {report['alpha']:g}; the "
                         "pooled row is unadjusted"],
            ["intervals", f"{report['confidence']:.0%}; lifts: percentile problem bootstrap "
                          f"({report['bootstrap_resamples']} resamples of whole problems); rates: Wilson on the "
                          "effective sample size from that bootstrap"]]
    return Block("legend", "How to read the numbers", ["term", "meaning"], rows)


def _paired_detail(report: dict) -> Block:
    header = ["arm", "model", "direction", "pairs", "improved", "tied", "regressed", "paired outcome (%)",
              "noise range (%)", "sign p", "lift S", "lift S 95% CI", "McNemar p", "Holm p", "Wilcoxon p", "Holm p"]
    rows = []
    for arm, t in report["paired"].items():
        for r in [t["overall"]] + t["rows"]:
            lo, hi = r["noise_range"]
            rows.append([arm, r["model"], r["direction"], _f(r["pairs"]), _f(r["improved"]), _f(r["tied"]),
                         _f(r["regressed"]), _f(r["paired_outcome"]["estimate"], 1),
                         "–" if lo is None else f"{lo:+.1f} .. {hi:+.1f}", _p(r["sign_p"]),
                         _f(r["lift_s"]["estimate"], 1), _ci(r["lift_s"], 1), _p(r["mcnemar"]["p_value"]),
                         _p(r["correctness_lift"]["p_holm"]), _p(r["wilcoxon"]["p_value"]),
                         _p(r["runtime_lift"]["p_holm"])])
    return Block("table", "Paired outcomes, every arm (treated vs solo)", header, rows,
                 caption="The Holm p of McNemar and Wilcoxon are the correctness and runtime columns' of Table 1; "
                         "solo_control is a second solo attempt against the first: the noise floor.")


def _without_skipped(report: dict) -> Block | None:
    if not report["without_skipped"]:
        return None
    rows = []
    for arm, t in report["without_skipped"].items():
        table = report["paired"][arm]
        paper = {(r["model"], r["direction"]): r for r in table["rows"] + [table["overall"]]}
        for r in t["rows"] + [t["overall"]]:
            p = paper[(r["model"], r["direction"])]
            rows.append([arm, r["model"], r["direction"], str(p["skipped"]), str(p["pairs"]),
                         _measure(p["paired_outcome"], True), _signed(p["lift_s"]["estimate"], True), str(r["pairs"]),
                         _measure(r["paired_outcome"], True), _signed(r["lift_s"]["estimate"], True)])
    return Block("table", "Skipped trials: counted as their base (paper) and left out (ours)",
                 ["arm", "model", "direction", "skipped", "pairs (paper)", "paired outcome (%), paper", "lift S, paper",
                  "pairs (ours)", "paired outcome (%), ours", "lift S, ours"], rows,
                 caption="The paper counts a skill trial whose source wrote no skill as its base, a tie: nothing was "
                         "transferred. Ours leaves it out, measuring only skills that exist. Each view's marks are "
                         "Holm-adjusted within it.")


def _standing_blocks(report: dict) -> list[Block]:
    sd = report["standing"]
    if not sd:
        return []
    out = []
    for arm in ("skill", "placebo", "solo_control"):
        if arm not in sd:
            continue
        t = sd[arm]
        rows = [[s, *[_f(t["cells"][s][o]) for o in m.OUTCOME_NAMES.values()], _f(t["improve_rate"][s]),
                 _f(t["regress_rate"][s])] for s in m.STANDING_NAMES.values()]
        out.append(Block("table", f"Relative standing: {arm}", ["source solo vs target solo", "improved", "tied",
                                                                "regressed", "improve rate", "regress rate"], rows,
                         caption=sd["caveat"] if arm == "skill" else None))
    rows = []
    for name, excess in sd["excess"].items():
        for e in excess:
            rows.append([name, e["standing"], e["rate"], _signed(e["skill"], False), _signed(e["control"], False),
                         _signed(e["excess"], True), "–" if e["low"] is None else
                         f"[{e['low']:+.1f}, {e['high']:+.1f}]"])
    if rows:
        out.append(Block("table", "Skill excess over placebo and solo control, by standing",
                         ["comparison", "standing", "rate", "skill (%)", "other arm (%)", "excess (pp)", "95% CI"],
                         rows, caption=" ".join(sd["sentences"].values())))
    return out


def blocks(report: dict) -> list[Block]:
    """The page in reading order: Table 1, the paper's two figures, the legends, then every other table and plot."""
    out: list[Block] = []
    if "skill" in report["paired"]:
        out.append(_table1(report))
    out += [Block("figure", "Paired outcome by problem", figure="paired_lift", caption=FIGURE_CAPTIONS["paired_lift"]),
            Block("figure", "Outcomes by relative standing", figure="standing", caption=FIGURE_CAPTIONS["standing"]),
            _legends(report)]
    if report["verdicts"]:
        vrows = []
        for arm, v in report["verdicts"].items():
            vrows.append([arm, "all", "all", v["overall"]["statement"]])
            vrows += [[arm, c["model"], c["direction"], c["statement"]] for c in v["cells"]]
        out.append(Block("table", "Lift against noise", ["arm", "model", "direction", "verdict"], vrows))
    skipped = _without_skipped(report)
    if skipped:
        out.append(skipped)
    out += _standing_blocks(report)
    if report["paired"]:
        out.append(_paired_detail(report))
    th = report["thresholds"]
    for key in ("arm", "model", "direction", "family"):
        rows = [[name, _f(e["n"]), _f(e["excluded"]), *[_f(e["r_at"].get(t)) for t in th], _f(e["s"], 1),
                 _f(e["fast_p1"]), _f(e["geomean_speedup"], 2), _f(e["pass_rate"]["estimate"]), _ci(e["pass_rate"])]
                for name, e in report["ladders"][key].items()]
        out.append(Block("table", f"Ladder by {key}", [key, "n", "excluded", *[f"R@{t}" for t in th], "S", "fast_1",
                                                       "geomean speedup (x)", "pass rate", "pass rate 95% CI"], rows))
    nz = report.get("noise_for_size")
    if nz:
        out.append(_noise_block(nz))
    out.append(Block("table", "Usage per arm", ["arm", "trials with usage", "output tokens", "mean output tokens",
                                                "cost (USD)", "wall time (s)", "mean wall time (s)"],
                     [[a, _f(u["trials_with_usage"]), _f(u["output_tokens"]), _f(u["output_tokens_mean"], 0),
                       _f(u["cost_usd"], 2), _f(u["wall_s"], 1), _f(u["wall_s_mean"], 1)]
                      for a, u in report["usage"].items()]))
    out.append(Block("table", "Skill audit", ["arm", "skills", "mean words", "leaking code", "share leaking code"],
                     [[a, _f(s["skills"]), _f(s["mean_words"], 1), _f(s["leaking_code"]),
                       _f(s["leaking_code_share"])] for a, s in report["skill_audit"].items()]))
    ref = report.get("refinement")
    if ref:
        out.append(Block("table", "Refinement by submission round", ["round", "submissions", "compile rate",
                                                                     "pass rate", "geomean speedup of passing (x)"],
                         [[str(r["round"]), str(r["submissions"]), _f(r["compile_rate"]), _f(r["pass_rate"]),
                           _f(r["geomean_speedup_of_passing"], 2)] for r in ref["by_round"]]))
        slow, share = ref["slower_than_eager"], ref["variance_share"]
        out.append(Block("table", "Correct but slow; what explains outcomes", ["quantity", "value"],
                         [["correct trials slower than eager", f"{slow['slower']} of {slow['correct_trials']} "
                                                               f"({_f(slow['share'])})"],
                          ["outcome variance explained by family (eta²)", _f(share["family"])],
                          ["outcome variance explained by model (eta²)", _f(share["model"])]]))
    rc = report.get("repeated_code")
    if rc and rc["files"]:
        rows = [[f["problem"], f["dsl"], f["file_sha256"][:12], _f(f["gradings"]), _f(f["fastest_ms"], 4),
                 _f(f["slowest_ms"], 4), _f(f["ratio"], 3), f"{f['untied']} of {f['pairs']}"] for f in rc["files"]]
        out.append(Block("table", f"Identical code graded more than once (min margin {report['min_margin']:g})",
                         ["problem", "DSL", "file", "gradings", "fastest (ms)", "slowest (ms)", "slowest / fastest",
                          "pairs not tied"], rows))
    out += [Block("figure", title, figure=name, caption=FIGURE_CAPTIONS[name])
            for name, title in (("ladders", "R@t ladder per arm"), ("speed_scatter", "Speed of pairs correct in both"),
                                ("regression_vs_noise", "Regression rate and the solo control's"))]
    return out


def _noise_block(nz: dict) -> Block:
    pc, ac, pub = nz["per_cell_range"], nz["across_cells"], nz["published"]
    rows = [["size", f"{nz['problems']} problems × {nz['replicates']} replicates, {nz['models_directions']} "
                     "model × direction cells"],
            ["noise alone, one cell (95%)", f"{pc['low']:+.1f}% .. {pc['high']:+.1f}%"],
            [f"noise alone, expected extremes across {nz['models_directions']} cells",
             f"{ac['low']:+.1f}% .. {ac['high']:+.1f}%"],
            [f"noise alone, all {nz['models_directions']} cells at once (95% of runs)",
             f"±{nz['simultaneous_band']:.1f}%"],
            ["solo-vs-solo disagreement: assumed / simulated / measured",
             f"{_f(nz['assumed_disagreement'], 2)} / {_f(nz['simulated_disagreement'], 2)} / "
             f"{_f(nz['measured_disagreement'], 2)}"]]
    if nz["per_cell_range_at_measured"]:
        r = nz["per_cell_range_at_measured"]
        rows.append(["one cell (95%), rescaled to the measured disagreement", f"{r['low']:+.1f}% .. {r['high']:+.1f}%"])
    rows.append(["yardstick for the lifts below (all cells at once)", f"±{nz['band']:.1f}%"])
    rows.append([f"published benchmark ({pub['problems']} problems × {pub['replicates']}, "
                 f"{pub['models_directions']} cells)", f"{pub['low']:+.0f}% .. {pub['high']:+.0f}%"])
    for c in nz["lifts"]:
        verdict = ("–" if c["inside_noise"] is None else
                   "inside: indistinguishable from noise" if c["inside_noise"] else "outside the band of noise")
        rows.append([f"{c['arm']} lift, {c['model']} | {c['direction']}", f"{_f(c['lift_pct'], 1)}% ({verdict})"])
    rows.append(["statement", nz["statement"]])
    return Block("table", "Noise range for this run's size", ["quantity", "value"], rows)


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(map(esc, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(esc, r)) + " |" for r in rows]
    return "\n".join(lines)


def _html_table(title: str, header: list[str], rows: list[list[str]], css: str = "mkb",
                muted: frozenset[int] = frozenset()) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    body = "".join(("<tr class=\"muted\">" if i in muted else "<tr>") + "".join(f"<td>{e(str(c))}</td>" for c in r)
                   + "</tr>" for i, r in enumerate(rows))
    return (f'<h2>{e(title, quote=False)}</h2>\n<table class="{css}">'
            f'<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')


def _present(page: list[Block], plot_files: dict[str, Path]) -> list[Block]:
    return [b for b in page if b.kind != "figure" or b.figure in plot_files]


def render_markdown(report: dict, plot_files: dict[str, Path]) -> str:
    parts = [f"# MetaKernelBench report: run `{report['run_id']}`", "",
             f"Models: {', '.join(report['models'])}. Trials: " +
             ", ".join(f"{k} {v}" for k, v in report["trials"].items()) + "."]
    if report["offline_client"]:
        parts += ["", "**OFFLINE client (replay or reference): not a model's result.**"]
    for n in report["notes"]:
        parts += ["", f"> Note: {n}"]
    for b in _present(blocks(report), plot_files):
        parts += ["", f"## {b.title}", ""]
        if b.kind == "figure":
            parts.append(f"![{b.figure}]({plot_files[b.figure].name})")
        else:
            parts.append(_md_table(b.header, b.rows) if b.rows else "(none)")
        if b.caption:
            parts += ["", f"*{b.caption.strip()}*"]
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
    for b in _present(blocks(report), plot_files):
        if b.kind == "figure":
            data = base64.b64encode(plot_files[b.figure].read_bytes()).decode("ascii")
            parts.append(f"<h2>{e(b.title, quote=False)}</h2>\n<figure><img alt=\"{e(b.figure)}\" "
                         f"src=\"data:image/png;base64,{data}\"><figcaption>{e(b.caption or '')}</figcaption></figure>")
            continue
        css = "mkb legend" if b.kind == "legend" else "mkb nowrap" if b.muted else "mkb"
        parts.append(_html_table(b.title, b.header, b.rows, css, b.muted))
        if b.caption:
            parts.append(f'<p class="caption">{e(b.caption)}</p>')
    style = ("body{font-family:'DejaVu Sans',sans-serif;margin:2em;max-width:1500px}"
             "table.mkb{border-collapse:collapse;margin-bottom:.4em;font-size:85%}"
             "table.mkb td,table.mkb th{border:1px solid #bbb;padding:2px 6px;vertical-align:top}"
             "table.mkb th{background:#f0f0f0}table.legend td:first-child{font-weight:bold;white-space:nowrap}"
             "table.nowrap td{white-space:nowrap}tr.muted td{color:#666;background:#fafafa;font-size:92%}"
             "img{max-width:100%}figure{margin:0 0 1em 0}figcaption,.caption{color:#333;font-size:90%;"
             "max-width:1100px;margin:.3em 0 1.2em 0}.note{color:#a40}")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>MKB report {e(report['run_id'])}</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n")


def write_report(rows: list[TrialRow], out: Path, run_id: str | None = None, n_boot: int = 2000,
                 outcomes: dict[str, list[dict]] | None = None, min_margin: float = 0.0) -> dict:
    """Build the report from `rows` and write report.json, report.md, report.html and the plot PNGs into `out`.
    Returns the report dict (with "plots": name -> file name)."""
    from metakernelbench.analysis import plots

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    report, pairs = _build(rows, run_id, n_boot, outcomes, min_margin)
    plot_files = plots.make_plots(pairs, report, out)
    report["plots"] = {name: p.name for name, p in plot_files.items()}
    (out / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False, allow_nan=False))
    (out / "report.md").write_text(render_markdown(report, plot_files))
    (out / "report.html").write_text(render_html(report, plot_files))
    return report


def report_store(store: Store, out: Path, run_id: str | None = None, n_boot: int = 2000,
                 min_margin: float = 0.0) -> dict:
    """The whole report of a store's run (every run when run_id is None); ReportError when it holds no trials."""
    return write_report(load_rows(store, run_id), out, run_id, n_boot, store.submission_outcomes(run_id), min_margin)
