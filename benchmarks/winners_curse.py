"""How much did scoring a trial by the fastest of its own gradings flatter it? Identical code, graded many times in
fresh processes, compared under the old rule (the fastest of `--selected` gradings, as a trial of that many equal
submissions was scored) and the new one (the median of `--regrades` further fresh gradings of the chosen file).

    python benchmarks/winners_curse.py --store validation/h200-2026-12-01-demo.sqlite.gz   (gradings already made)
    python benchmarks/winners_curse.py --grade PROBLEM[,PROBLEM] --dsl tirx --device cpu [--rounds R] [--out FILE]

With --store it reads every file graded more than once in a store (`Store.submission_outcomes`: passing gradings of
one file_sha256) and prints, per file, fastest / median: what the old rule claimed against the typical grading.
With --grade it grades each problem's reference `selected + regrades` times per round and prints old / new.
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path


def from_store(path: Path) -> list[dict]:
    from metakernelbench.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        if path.suffix == ".gz":
            unpacked = Path(tmp, path.stem)
            unpacked.write_bytes(gzip.decompress(path.read_bytes()))
            path = unpacked
        store = Store(path)
        groups: dict[str, list[float]] = {}
        for outcomes in store.submission_outcomes().values():
            for s in outcomes:
                if s["passed"] and s["file_sha256"] and s["median_ms"]:
                    groups.setdefault(s["file_sha256"], []).append(s["median_ms"])
        store.close()
    return [{"file_sha256": sha[:12], "gradings": len(times), "fastest_ms": min(times),
             "median_ms": statistics.median(times), "fastest_over_median": min(times) / statistics.median(times)}
            for sha, times in sorted(groups.items()) if len(times) > 1]


def by_grading(problems: list[str], dsl: str, device: str, selected: int, regrades: int, rounds: int) -> list[dict]:
    from metakernelbench.grader import Grader, GraderConfig
    from metakernelbench.suite import load_problem

    rows = []
    with Grader(GraderConfig(device=device)) as grader:
        for name in problems:
            problem = load_problem(name)
            path = problem.graded_solution(dsl)
            for round_ in range(rounds):
                times = []
                for _ in range(selected + regrades):
                    verdict = grader.grade(problem, dsl, path)
                    if not verdict.passed:
                        raise SystemExit(f"{problem.id} [{dsl}] failed: {verdict.failed_check}: {verdict.reason}")
                    times.append(verdict.runtime["median_ms"])
                old, new = min(times[:selected]), statistics.median(times[selected:])
                rows.append({"problem": problem.id, "round": round_, "old_rule_ms": old, "new_rule_ms": new,
                             "old_over_new": old / new, "gradings_ms": times})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path)
    parser.add_argument("--grade", help="comma-separated problems")
    parser.add_argument("--dsl", default="tirx")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--selected", type=int, default=10, help="gradings the old rule took the fastest of")
    parser.add_argument("--regrades", type=int, default=2, help="fresh gradings the new rule takes the median of")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    started = time.monotonic()
    if args.store:
        rows = from_store(args.store)
        ratios = [r["fastest_over_median"] for r in rows]
        summary = {"files": len(rows), "median_fastest_over_median": statistics.median(ratios),
                   "min_fastest_over_median": min(ratios)}
    elif args.grade:
        rows = by_grading(args.grade.split(","), args.dsl, args.device, args.selected, args.regrades, args.rounds)
        ratios = [r["old_over_new"] for r in rows]
        summary = {"rounds": len(rows), "median_old_over_new": statistics.median(ratios),
                   "min_old_over_new": min(ratios), "max_old_over_new": max(ratios)}
    else:
        raise SystemExit("pass --store PATH or --grade PROBLEMS")
    record = {"command": " ".join(["python", "benchmarks/winners_curse.py", *sys.argv[1:]]),
              "seconds": time.monotonic() - started, "summary": summary, "rows": rows}
    print(json.dumps(summary))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
