"""What one verification costs, phase by phase, at a problem's timed size: drawing the inputs, the low-precision
reference, the fp64 anchor and the comparison (the reference's own outputs judged, as an honest submission's would
be). Median of a few repeats after a warm-up, with the device synchronised around each phase. GPU or CPU.

    python benchmarks/verify_profile.py mlp_norm/38_residual_rmsnorm_backward_qwen3_4b 28 43 [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from metakernelbench.grader import numerics
from metakernelbench.grader.compare import compare, needs_fp64
from metakernelbench.suite import load_problem


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def profile(which: str, device: str, repeats: int) -> dict:
    problem = load_problem(which)
    size = problem.timed_size(torch.device(device).type)
    anchor = numerics.Anchor(problem)
    phases: dict[str, list[float]] = {"inputs": [], "references": [], "compare": []}
    for repeat in range(repeats + 1):
        _sync(device)
        started = time.perf_counter()
        inputs = problem.make_inputs(repeat, device, size)
        _sync(device)
        drawn = time.perf_counter()
        lp, wide = anchor.references(inputs, size, needs_fp64(problem))
        _sync(device)
        referenced = time.perf_counter()
        got = tuple(t.clone() for t in lp)
        _sync(device)
        compared_from = time.perf_counter()
        checks = compare(problem, got, lp, wide)
        _sync(device)
        finished = time.perf_counter()
        assert all(c.passed for c in checks), [c.reason for c in checks if not c.passed]
        if repeat:  # the first round proves separability and warms the allocator
            for name, value in (("inputs", drawn - started), ("references", referenced - drawn),
                                ("compare", finished - compared_from)):
                phases[name].append(value)
        del inputs, lp, wide, got
    return {"problem": problem.id, "size": size, "fp64_slices": anchor.slices_used,
            **{f"{k}_s": round(statistics.median(v), 4) for k, v in phases.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", nargs="+")
    parser.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    numerics.pin()
    for which in args.problems:
        print(profile(which, args.device, args.repeats), flush=True)


if __name__ == "__main__":
    main()
