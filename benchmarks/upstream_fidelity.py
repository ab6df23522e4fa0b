"""The published benchmark's own problem modules, loaded unchanged, against our references: for every upstream module
whose number is also one of ours, grade our bundled reference of each DSL against the upstream module (its
semantics, generator and sizes), so a false rejection of a correct kernel, or a difference between our problem and
upstream's, shows up as a failed grading. GPU; trusted code.

    python benchmarks/upstream_fidelity.py --suite UPSTREAM/problems [--dsl cute,tirx] --out FILE.jsonl
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from metakernelbench.grader import Grader, GraderConfig
from metakernelbench.grader.validation import environment
from metakernelbench.suite import load_suite


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", type=Path, required=True, help="upstream's problems/ folder")
    parser.add_argument("--dsl", default="cute,tirx")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ours = {p.number: p for p in load_suite()}
    upstream = load_suite(args.suite)
    pairs = [(u, ours[u.number], dsl) for u in upstream if u.number in ours
             for dsl in args.dsl.split(",") if ours[u.number].solution_path(dsl).is_file()]
    print(f"{len(upstream)} upstream problems; {len(pairs)} gradings of our references against them", flush=True)
    env = environment(device)
    config = GraderConfig(device=device, compile_baseline=False, preload_dsls=tuple(args.dsl.split(",")))
    with Grader(config) as grader, open(args.out, "a") as out:
        for theirs, mine, dsl in pairs:
            verdict = grader.grade(theirs, dsl, mine.graded_solution(dsl))
            row = {"upstream": theirs.id, "ours": mine.id, "dsl": dsl, "sha256": verdict.file_sha256,
                   "passed": verdict.passed, "failed_check": verdict.failed_check, "reason": verdict.reason,
                   "median_ms": verdict.runtime.get("median_ms"), "kernel_ms": verdict.runtime.get("kernel_ms"),
                   "speedup_vs_eager": verdict.speedup_vs_eager, "environment": env}
            out.write(json.dumps(row, default=str) + "\n")
            out.flush()
            mark = "ok  " if verdict.passed else "FAIL"
            print(f"{mark} {theirs.id} [{dsl}] {row['median_ms'] or 0:.4f} ms {verdict.failed_check or ''} "
                  f"{(verdict.reason or '')[:300]}", flush=True)


if __name__ == "__main__":
    main()
