"""Synthetic runs of known truth for the analysis tests: trials drawn from a latent-quality model, as rows or a store.

Each problem has a difficulty d ~ N(0, 1) shared by every model (so cells are dependent, as real ones are) and a
per-DSL offset g ~ N(0, DSL_SD) (so a source solo can stand above or below its target solo for a reason). An attempt
has quality q = d + g + e, e ~ N(0, SIGMA); it passes when q > 0, at speedup exp(q / 2), with timing spread SPREAD.
Solo, solo-control and placebo attempts are all drawn alike; a skill attempt adds `transfer` to its quality (0: no
transfer, the null every test must hold its rate under). `truth` computes the population value of each Table 1
statistic by drawing the same model a million times, vectorised.
"""
from __future__ import annotations

import json
import math
import time

import numpy as np

from metakernelbench.protocol import TrialSpec, plan
from metakernelbench.store import Store, TrialRow

SIGMA = 1.3  # attempt noise, as analysis/power.py calibrates it (60% of solo replicate pairs disagree)
DSL_SD = 0.5
SPREAD = 0.05
DSLS = ("cute", "tirx")


def _result(q: float) -> dict:
    if q <= 0:
        return {"passed": False, "speedup_vs_eager": None, "median_ms": None, "noise_spread": None,
                "offline_client": False}
    speed = math.exp(q / 2)
    return {"passed": True, "speedup_vs_eager": speed, "median_ms": 1.0 / speed, "noise_spread": SPREAD,
            "offline_client": False}


def trials(seed: int, problems: int = 30, models: int = 2, replicates: int = 1, transfer: float = 0.0,
           control: bool = True, placebo: bool = True, skip: float = 0.0) -> list[TrialRow]:
    """Every trial of a finished run. `skip`: the share of solo trials that write no skill, whose skill (and
    placebo) trials are then skipped."""
    rng = np.random.default_rng(seed)
    names = [f"fam{i % 3}/{i:02d}_p" for i in range(problems)]
    d = dict(zip(names, rng.standard_normal(problems)))
    g = {(p, dsl): rng.normal(0.0, DSL_SD) for p in names for dsl in DSLS}
    arms = ["solo", "skill"] + (["placebo"] if placebo else [])
    specs = [s for k in range(models)
             for s in plan("r", f"model-{k}", names, list(DSLS), arms, replicates, seed=seed, solo_control=control)]
    solo_skill = {}
    for s in specs:
        if s.arm == "solo":
            solo_skill[(s.model, s.problem, s.dsl, s.replicate)] = rng.random() >= skip
    rows = []
    for s in specs:
        source = s.skill_source()
        if source is not None and not solo_skill[(s.model, source[0], source[1], source[2])]:
            rows.append(TrialRow(s.trial_id, s.run_id, s.model, s.problem, s.dsl, s.arm, s.replicate, s.source_dsl,
                                 s.skill_problem, "skipped", 1, {"skipped": "the source solo trial wrote no skill"},
                                 None, None, None))
            continue
        q = d[s.problem] + g[(s.problem, s.dsl)] + rng.normal(0.0, SIGMA) + (transfer if s.arm == "skill" else 0.0)
        skill = "a skill" if s.arm != "solo" or solo_skill[(s.model, s.problem, s.dsl, s.replicate)] else None
        rows.append(TrialRow(s.trial_id, s.run_id, s.model, s.problem, s.dsl, s.arm, s.replicate, s.source_dsl,
                             s.skill_problem, "finished", 1, _result(q), skill, None,
                             {"output_tokens": 1000, "cost_usd": 0.1, "wall_s": 10.0}))
    return rows


def write_store(path, rows: list[TrialRow]) -> Store:
    """The rows as a store that `mkb report` reads (the trial ids are the plan's, so they match)."""
    store = Store(path)
    store.ensure_run("r", {"synthetic": True}, {})
    store.add_trials([TrialSpec(r.run_id, r.model, r.problem, r.dsl, r.arm, r.replicate, r.source_dsl,
                                r.skill_problem) for r in rows])
    now = time.time()
    store.db.execute("BEGIN IMMEDIATE")
    store.db.executemany("UPDATE trials SET status=?, attempts=1, finished=?, result=?, skill=?, usage=? "
                         "WHERE trial_id=?", [(r.status, now, json.dumps(r.result), r.skill, json.dumps(r.usage),
                                               r.trial_id) for r in rows])
    store.db.execute("COMMIT")
    return store


def _sign(qa: np.ndarray, qb: np.ndarray) -> np.ndarray:
    """metrics.compare on qualities: correct beats incorrect; two passes differ when the time ratio exp(|qa - qb| / 2)
    exceeds 1 + SPREAD."""
    pa, pb = qa > 0, qb > 0
    speed = np.where(np.abs(qa - qb) / 2 > math.log1p(SPREAD), np.sign(qa - qb), 0)
    return np.where(pa != pb, np.where(pa, 1, -1), np.where(pa, speed, 0))


def truth(transfer: float, n: int = 1_000_000, seed: int = 12345) -> dict[str, float]:
    """Population values (in %) of one model × direction's Table 1 statistics (the same in every cell)."""
    rng = np.random.default_rng(seed)
    d = rng.standard_normal(n)
    g_src, g_tgt = rng.normal(0, DSL_SD, n), rng.normal(0, DSL_SD, n)
    src = d + g_src + rng.normal(0, SIGMA, n)
    solo = d + g_tgt + rng.normal(0, SIGMA, n)
    skill = d + g_tgt + rng.normal(0, SIGMA, n) + transfer
    out, standing = _sign(skill, solo), _sign(src, solo)
    both = (skill > 0) & (solo > 0)
    return {"correctness_lift": 100 * ((skill > 0).mean() - (solo > 0).mean()),
            "runtime_lift": 100 * math.expm1(((skill - solo)[both] / 2).mean()),
            "paired_outcome": 100 * out.mean(), "regression_rate": 100 * (out == -1).mean(),
            "improve_when_above": 100 * (out[standing == 1] == 1).mean(),
            "regress_when_below": 100 * (out[standing == -1] == -1).mean()}
