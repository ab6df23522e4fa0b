"""Grading throughput through N local lanes: the same mixed batch of reference solutions (each graded `--rounds`
times, all queued at once as concurrent trials would) through one lane per device given, with the grader's default
settings; prints each lane's gradings and throughput and the overall gradings per minute, and writes a JSON record.

Timing starts once every lane is warm: each lane first grades every reference of the batch once, which starts its
fork server and computes the eager (and torch.compile) baselines it caches per problem, one-off costs a long run
amortises; the figure is the steady state.

    python benchmarks/lane_throughput.py --devices cuda:0 --out validation/lane-throughput-h200x1.json
    python benchmarks/lane_throughput.py --devices cuda:0,cuda:1 --out validation/lane-throughput-h200x2.json
    python benchmarks/lane_throughput.py --devices cpu,cpu --out /tmp/lanes-cpu2.json   # TIRx on the CPU
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from concurrent.futures import ThreadPoolExecutor

from metakernelbench.execute import GradingLanes
from metakernelbench.grader import GraderConfig
from metakernelbench.suite import load_suite


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", required=True, help="one lane per entry: cuda:0,cuda:1 or cpu,cpu")
    parser.add_argument("--problems", default=None, help="comma-separated numbers (default: the demo set)")
    parser.add_argument("--dsls", default=None, help="default: cute,tirx on GPUs, tirx on the CPU")
    parser.add_argument("--rounds", type=int, default=3, help="gradings of each reference in the batch")
    parser.add_argument("--out", default=None, help="JSON record of the run")
    args = parser.parse_args()
    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    on_cpu = all(d == "cpu" for d in devices)
    dsls = args.dsls.split(",") if args.dsls else (["tirx"] if on_cpu else ["cute", "tirx"])
    wanted = {int(n) for n in args.problems.split(",")} if args.problems else None
    suite = [p for p in load_suite() if (p.number in wanted if wanted else getattr(p.module, "DEMO", False))]
    batch = [(p, dsl) for p in suite for dsl in dsls if p.solution_path(dsl).is_file()
             and (not on_cpu or p.solution_runs_on_cpu(dsl))]
    if not batch:
        parser.error("no reference of those problems and DSLs runs on these devices")
    jobs = [(p, dsl, p.graded_solution(dsl)) for _ in range(args.rounds) for p, dsl in batch]

    with GradingLanes(devices, GraderConfig(preload_dsls=tuple(dsls))) as lanes:
        warm_started = time.monotonic()
        with ThreadPoolExecutor(len(devices)) as pool:  # all lanes idle: each takes one of the N copies
            for p, dsl in batch:
                list(pool.map(lambda _: lanes.grade(p, dsl, p.graded_solution(dsl)), devices))
        warm_up = time.monotonic() - warm_started
        before = {s.index: (s.graded, s.busy_s) for s in lanes.stats()}
        started = time.monotonic()
        with ThreadPoolExecutor(len(jobs)) as pool:
            verdicts = list(pool.map(lambda job: lanes.grade(*job), jobs))
        wall = time.monotonic() - started
        stats, name = lanes.stats(), lanes.lanes()[0].environment["device_name"]  # the driver never touches a GPU

    per_lane = []
    for s in stats:
        graded, busy = s.graded - before[s.index][0], s.busy_s - before[s.index][1]
        per_lane.append({"lane": s.index, "device": s.label, "cpus": list(s.cpus), "graded": graded,
                         "busy_s": round(busy, 2), "gradings_per_min": round(60 * graded / wall, 2),
                         "utilisation": round(busy / wall, 3), "restarts": s.restarts})
        print(f"lane {s.index} {s.label:8s} CPUs {list(s.cpus)}: {graded:3d} gradings, "
              f"{60 * graded / wall:6.2f} /min, busy {busy / wall:5.1%}", flush=True)
    failed = [f"{v.problem} [{v.dsl}]: {v.failed_check}: {v.reason}" for v in verdicts if not v.passed]
    summary = {"devices": devices, "device_name": name, "lanes": len(devices),
               "gradings": len(jobs), "passed": len(jobs) - len(failed), "wall_s": round(wall, 2),
               "warm_up_s": round(warm_up, 2),
               "gradings_per_min": round(60 * len(jobs) / wall, 2),
               "batch": [f"{p.id} [{dsl}]" for p, dsl in batch], "rounds": args.rounds,
               "host_cpus": len(os.sched_getaffinity(0)), "python": platform.python_version()}
    print(f"{len(devices)} lane(s) on {', '.join(devices)}: {len(jobs)} gradings in {wall:.1f} s = "
          f"{summary['gradings_per_min']:.2f} gradings/min ({summary['passed']} passed)")
    for line in failed:
        print("failed:", line)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"summary": summary, "lanes": per_lane, "failed": failed}, f, indent=2)


if __name__ == "__main__":
    main()
