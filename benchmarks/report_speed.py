"""Report speed at full scale: build a synthetic store of about 20,000 finished trials (74 problems × 2 DSLs × every
arm × several models and replicates), then time `mkb report`'s work (load the rows, build the report, write JSON,
Markdown, HTML and the plots). Target: ≤ 10 s on a 2-core CPU machine.

    python benchmarks/report_speed.py [--models N] [--replicates R] [--n-boot B] [--keep DIR] [--profile] [--out FILE]
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import sys
import tempfile
import time
from pathlib import Path

from metakernelbench.analysis.report import report_store
from metakernelbench.protocol import plan
from metakernelbench.store import Store

TARGET_S = 10.0
DSLS = ["cute", "tirx"]
TOKENS = {"solo": 1000, "skill": 2000, "placebo": 1500}


def problems(n: int = 74) -> list[str]:
    return [f"family{i % 8}/problem{i:03d}" for i in range(n)]


def _result(rng: random.Random, arm: str) -> dict:
    if rng.random() < {"solo": 0.35, "skill": 0.3, "placebo": 0.35}[arm]:
        return {"passed": False, "speedup_vs_eager": None, "median_ms": None, "noise_spread": None,
                "offline_client": False}
    speed = rng.lognormvariate(0.1 if arm == "skill" else 0.0, 0.6)
    return {"passed": True, "speedup_vs_eager": speed, "median_ms": 1.0 / speed,
            "noise_spread": rng.uniform(0.0, 0.05), "offline_client": False}


def make_store(path: Path, models: int, replicates: int, seed: int = 0, skip: float = 0.05) -> int:
    """A store of `models` × plan(74 problems, 2 DSLs, solo/skill/placebo, `replicates`, solo control), every trial
    finished with a seeded random result, except that a `skip` share of solo trials write no skill and the skill
    trials fed by them are skipped (so the report also builds its view without them). Trials go in through
    Store.add_trials; results are written through Store.db in one transaction (the same UPDATE as
    Store.finish_trial, one commit instead of 20,000)."""
    rng = random.Random(seed)
    store = Store(path)
    store.ensure_run("bench", {"synthetic": True}, {})
    specs = []
    for k in range(models):
        specs += plan("bench", f"model-{k}", problems(), DSLS, ["solo", "skill", "placebo"], replicates=replicates,
                      seed=seed, solo_control=True)
    store.add_trials(specs)
    now = time.time()
    wrote = {(s.model, s.problem, s.dsl, s.replicate): rng.random() >= skip for s in specs if s.arm == "solo"}
    updates = []
    for s in specs:
        source = s.skill_source()
        if s.arm == "skill" and not wrote[(s.model, *source)]:
            updates.append(("skipped", now, json.dumps({"skipped": "the source solo trial wrote no skill"}), None,
                            None, None, s.trial_id))
            continue
        audit = {"words": rng.randint(50, 400), "leaks_code": rng.random() < 0.1} if s.arm == "solo" else None
        usage = {"output_tokens": TOKENS[s.arm], "cost_usd": 0.1, "wall_s": 10.0}
        skill = "a skill" if audit and wrote[(s.model, s.problem, s.dsl, s.replicate)] else None
        updates.append(("finished", now, json.dumps(_result(rng, s.arm)), skill, json.dumps(audit),
                        json.dumps(usage), s.trial_id))
    store.db.execute("BEGIN IMMEDIATE")
    store.db.executemany("UPDATE trials SET status=?, attempts=1, finished=?, result=?, skill=?, "
                         "skill_audit=?, usage=? WHERE trial_id=?", updates)
    store.db.execute("COMMIT")
    store.close()
    return len(specs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=int, default=4)
    ap.add_argument("--replicates", type=int, default=11)  # 4 models × 74 × 2 × (3·11 + 1) = 20,128 trials
    ap.add_argument("--n-boot", type=int, default=2000)  # `mkb report`'s default
    ap.add_argument("--skip", type=float, default=0.05, help="share of solo trials that write no skill")
    ap.add_argument("--keep", help="write the store and report here instead of a temporary folder")
    ap.add_argument("--profile", action="store_true", help="print the top of a cProfile of the report")
    ap.add_argument("--out", help="write the timings as JSON here")
    args = ap.parse_args()

    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="mkb-report-speed-"))
    tmp.mkdir(parents=True, exist_ok=True)
    db = tmp / "bench.sqlite"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    t0 = time.perf_counter()
    n = make_store(db, args.models, args.replicates, skip=args.skip)
    store_s = time.perf_counter() - t0
    print(f"synthetic store: {n} trials in {store_s:.1f} s ({db})", flush=True)

    store = Store(db)
    prof = cProfile.Profile() if args.profile else None
    load = os.getloadavg()[0]  # other work on the machine: wall time is only comparable at a low load
    t0, c0 = time.perf_counter(), time.process_time()
    if prof:
        prof.enable()
    report_store(store, tmp / "report", "bench", n_boot=args.n_boot)
    if prof:
        prof.disable()
    report_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    store.close()
    verdict = "OK" if report_s <= TARGET_S else "OVER TARGET"
    print(f"report (load + build + write, n_boot={args.n_boot}): {report_s:.2f} s wall, {cpu_s:.2f} s CPU for {n} "
          f"trials on {os.cpu_count()} CPU(s), load average {load:.2f} before; target ≤ {TARGET_S:.0f} s: {verdict}")
    print(f"report files: {tmp / 'report'}")
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(40)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    if args.out:
        Path(args.out).write_text(json.dumps({"trials": n, "store_s": store_s, "report_s": report_s,
                                              "report_cpu_s": cpu_s, "load_average": load, "target_s": TARGET_S,
                                              "cpus": os.cpu_count()}, indent=2))
    sys.exit(0 if report_s <= TARGET_S else 1)


if __name__ == "__main__":
    main()
