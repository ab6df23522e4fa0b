"""Grading overhead per submission: grade every reference solution twice with one warm grader and report the
median of the verdicts' timings_s.overhead (total − first call at each size − timed loop − baseline), the part the
grader itself costs. Target: ≤ 2 s on an H200.

    python benchmarks/grading_overhead.py [DSL ...] [--out FILE]
"""
from __future__ import annotations

import json
import statistics
import sys
import time

from metakernelbench.grader import Grader, GraderConfig
from metakernelbench.suite import load_suite


def main() -> None:
    args = sys.argv[1:]
    out = args[args.index("--out") + 1] if "--out" in args else None
    dsls = [a for a in args if a in ("cute", "tirx")] or ["cute", "tirx"]
    rows = []
    started = time.monotonic()
    with Grader(GraderConfig(preload_dsls=tuple(dsls))) as grader:
        for round_ in (1, 2):
            for problem in load_suite():
                for dsl in dsls:
                    v = grader.grade(problem, dsl, problem.graded_solution(dsl))
                    rows.append({"round": round_, "problem": problem.id, "dsl": dsl, "passed": v.passed, **v.timings_s})
                    print(f"round {round_} {problem.id:42s} {dsl:5s} passed={v.passed} "
                          f"overhead {v.timings_s['overhead']:6.2f} s  total {v.timings_s['total']:6.2f} s", flush=True)
    warm = [r["overhead"] for r in rows if r["round"] == 2]
    summary = {"median_overhead_s_warm": statistics.median(warm), "max_overhead_s_warm": max(warm),
               "median_overhead_s_all": statistics.median(r["overhead"] for r in rows),
               "wall_s": time.monotonic() - started, "submissions": len(rows)}
    print(json.dumps(summary, indent=2))
    if out:
        with open(out, "w") as f:
            json.dump({"summary": summary, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
