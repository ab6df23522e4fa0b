"""CI's test phases timed on this machine, and the whole of CI extrapolated to a suite of N problems x D DSLs.

What grows with the suite is timed per unit: the compile check of each graded reference (in CI's one process per
DSL, with an empty CuTe DSL cache as on a fresh machine), the spec and seed audit of each problem, and the ledger
check of each variant, and the tests parametrized by a problem (their ids name it). Everything else in the test suite
is timed once and taken as fixed. Installing the packages is not timed here: pass CI's install time (`--install-s`,
the seconds `.ci/run` prints as "installed after N s" before pytest starts).

    python benchmarks/ci_phases.py --install-s 89 --problems 77 --dsls 2 --out validation/ci-phases.json
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PER_VARIANT_TESTS = ("tests/test_reference_compile.py",)


def timed(fn):
    started = time.monotonic()
    value = fn()
    return value, time.monotonic() - started


def compile_phase(variants) -> dict:
    from metakernelbench.grader.validation import compile_references

    checks, wall = timed(lambda: compile_references(variants, "sm_90a"))
    per_dsl: dict[str, list[float]] = {}
    for _, check in checks:
        per_dsl.setdefault(check.dsl, []).append(check.seconds)
    busiest = max(sum(v) for v in per_dsl.values())
    return {"wall_s": wall, "failed": sum(not c.ok for _, c in checks),
            "per_variant_s": {d: sum(v) / len(v) for d, v in per_dsl.items()},
            "startup_s": max(0.0, wall - busiest)}


def audit_phase(problems) -> dict:
    from metakernelbench.suite.audit import audit_problem
    from metakernelbench.suite.spec import check_work

    _, wall = timed(lambda: [(check_work(p), audit_problem(p, "cpu")) for p in problems])
    return {"wall_s": wall, "per_problem_s": wall / len(problems)}


def ledger_phase(variants) -> dict:
    _, wall = timed(lambda: [p.solution_sha256(d) for p, d in variants])
    return {"wall_s": wall, "per_variant_s": wall / len(variants)}


def rest_phase(problems) -> dict:
    """The rest of the test suite, as CI runs it, with every test's duration: those parametrized by a problem of the
    suite (their ids name it) grow with it and are reported apart from the fixed remainder."""
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=0", "--durations-min=0"]
    args += [f"--ignore={t}" for t in PER_VARIANT_TESTS]
    done, wall = timed(lambda: subprocess.run(args, cwd=ROOT, capture_output=True, text=True))
    names = [p.name for p in problems] + [f"{p.number:02d}-" for p in problems] + [p.id for p in problems]
    per_problem = 0.0
    for line in done.stdout.splitlines():
        found = re.match(r"^([\d.]+)s (?:call|setup|teardown)\s+(\S+)", line)
        if found and "[" in found.group(2) and any(n in found.group(2).split("[", 1)[1] for n in names):
            per_problem += float(found.group(1))
    summary = next((line for line in reversed(done.stdout.splitlines()) if " passed" in line or " failed" in line), "")
    return {"wall_s": wall, "summary": summary, "per_problem_tests_s": per_problem}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--install-s", type=float, default=0.0, help="CI's install time before pytest (seconds)")
    parser.add_argument("--problems", type=int, default=77, help="problems to extrapolate to")
    parser.add_argument("--dsls", type=int, default=2, help="DSLs to extrapolate to")
    parser.add_argument("--out", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args()
    os.environ["CUTE_DSL_CACHE_DIR"] = tempfile.mkdtemp(prefix="mkb-ci-cute-cache-")  # a fresh machine's cold cache

    from metakernelbench.dsl import dsl_names
    from metakernelbench.suite import load_suite

    problems = load_suite()
    variants = [(p, d) for p in problems for d in dsl_names() if p.solution_path(d).is_file()]
    phases = {"compile": compile_phase(variants), "audit": audit_phase(problems), "ledger": ledger_phase(variants),
              "rest": rest_phase(problems)}
    now = {"problems": len(problems), "variants": len(variants)}
    scaled_tests = phases["rest"]["per_problem_tests_s"]
    fixed = (args.install_s + phases["rest"]["wall_s"] - phases["audit"]["wall_s"] - phases["ledger"]["wall_s"]
             - scaled_tests + phases["compile"]["startup_s"])
    variants_then = args.problems * args.dsls
    # The DSLs compile side by side (two cores), so the slowest DSL's per-variant cost sets the pace.
    compile_then = max(phases["compile"]["per_variant_s"].values()) * args.problems
    then = {"fixed_s": fixed, "compile_s": compile_then,
            "audit_s": phases["audit"]["per_problem_s"] * args.problems,
            "ledger_s": phases["ledger"]["per_variant_s"] * variants_then,
            "per_problem_tests_s": scaled_tests / len(variants) * variants_then}
    then["total_s"] = sum(then.values())
    record = {"legend": {"phases": "measured now, wall seconds (compile per_variant_s: mean per graded reference)",
                         "now": "the suite measured", "extrapolated": f"CI for {args.problems} problems x "
                         f"{args.dsls} DSLs: fixed (install + rest of the tests + compile start-up), plus the "
                         "per-unit phases"},
              "now": now, "install_s": args.install_s, "phases": phases, "extrapolated": then}
    print(f"measured on {now['problems']} problems, {now['variants']} variants:")
    for name, phase in phases.items():
        print(f"  {name:8s} {phase['wall_s']:7.1f} s  " + ", ".join(
            f"{k} {json.dumps(v) if isinstance(v, dict) else v}" for k, v in phase.items() if k != "wall_s"))
    print(f"extrapolated to {args.problems} x {args.dsls}: " + ", ".join(f"{k} {v / 60:.1f} min"
                                                                       for k, v in then.items()))
    if args.out:
        args.out.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
