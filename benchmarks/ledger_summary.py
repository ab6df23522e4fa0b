"""The suite's GPU standing as a Markdown table: per variant, the ledger record that vouches for today's graded file
and the newest kernel time measured for it, so docs/measurements.md is regenerated, not retyped.

    python benchmarks/ledger_summary.py [--gpu H200]

Columns: grader median (the official end-to-end runtime), speedup over eager [fastest..slowest eager process],
speedup over torch.compile, kernel time (CUPTI, `benchmarks/reference_roofline.py`, newest file in
validation/kernels/) and that time against the measured copy bandwidth; `-` where nothing was measured.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def newest_kernel_rows(folder: Path) -> dict[tuple[str, str], dict]:
    rows = {}
    for path in sorted(folder.glob("*.json")):  # named by date: the newest file wins
        record = json.loads(path.read_text())
        for row in record["rows"]:
            rows[(row["problem"], row["solution"])] = row
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="H200")
    args = parser.parse_args()

    from metakernelbench.dsl import dsl_names
    from metakernelbench.grader.validation import read_awaiting, read_ledger
    from metakernelbench.suite import load_suite

    ledger = read_ledger(ROOT / "validation" / "ledger")
    kernels = newest_kernel_rows(ROOT / "validation" / "kernels")
    awaiting = read_awaiting(ROOT / "validation" / "awaiting-gpu.json")
    print("| problem | DSL | graded sha256 | grader median (ms) | vs eager [range] | vs compile | kernel (µs) | "
          "kernel / copy bw | recorded |")
    print("|---|---|---|---|---|---|---|---|---|")
    missing = 0
    for problem in load_suite():
        for dsl in dsl_names():
            if not problem.solution_path(dsl).is_file():
                continue
            sha = problem.solution_sha256(dsl)
            records = [r for r in ledger if r.vouches_for(problem.id, dsl, sha, args.gpu)]
            kernel = kernels.get((problem.id, dsl))
            timing = (f"{kernel['kernel_ms'] * 1e3:.1f} | {kernel['kernel_fraction_of_copy_bandwidth']:.0%}"
                      if kernel else "- | -")
            if not records:
                missing += 1
                state = "awaiting its GPU record" if (problem.id, dsl) in awaiting else "no passing record"
                print(f"| {problem.id} | {dsl} | {sha[:10]} | {state} | | | {timing} | |")
                continue
            r = max(records, key=lambda r: r.date)
            low, high = r.speedup_vs_eager_range or (None, None)
            span = f" [{low:.2f}–{high:.2f}]" if low else ""
            compiled = f"{r.speedup_vs_compile:.2f}x" if r.speedup_vs_compile else "-"
            print(f"| {problem.id} | {dsl} | {sha[:10]} | {r.median_ms:.3f} | {r.speedup_vs_eager:.2f}x{span} | "
                  f"{compiled} | {timing} | {r.date[:10]} |")
    if missing:
        print(f"\n{missing} variant(s) have no passing {args.gpu} record for today's graded file.")


if __name__ == "__main__":
    main()
