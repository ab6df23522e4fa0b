"""Why does identical code time differently in different processes? Runs the grader's timed call (child.Runner.call:
fresh inputs, read flush, sync before the end event) for one reference solution in many fresh processes, with the
grader's steadying of the host (child.steady_host) and without it, interleaved so that drift hits both alike.

    python benchmarks/timing_noise.py PROBLEM DSL [--processes K] [--settings a,b] [--out FILE]   (on a GPU machine)

Per setting it prints the spread of the per-process medians (slowest / fastest) and the median within-process
spread ((p90 - p10) / median, the grader's tie margin). `mkb report`'s identical-code table measures the same
thing in real gradings.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import socket
import statistics
import subprocess
import sys
import time

SETTINGS = ("as_graded", "unsteadied")  # child.steady_host (one CPU, spinning sync) or neither; no GC when timed


def _has_driver() -> None:
    from metakernelbench.grader import cuda_ipc

    try:
        cuda_ipc._lib()
    except cuda_ipc.TransferError:
        raise SystemExit("no CUDA driver (libcuda.so.1) here: run this on a GPU machine") from None


def _context_flags() -> int:
    from metakernelbench.grader import cuda_ipc

    flags, active = ctypes.c_uint(), ctypes.c_int()
    cuda_ipc._lib().cuDevicePrimaryCtxGetState(0, ctypes.byref(flags), ctypes.byref(active))
    return flags.value


def _request(problem, seed: int, size: str) -> dict:
    """A call request as the grader's parent sends it: inputs it made, handed over by file."""
    import tempfile
    from pathlib import Path

    from metakernelbench.grader import channel
    from metakernelbench.grader.parent import file_hand_over

    records, tensors = channel.input_records(problem.make_inputs(seed, "cuda:0", size))
    return {"op": "call", **file_hand_over(records, tensors, Path(tempfile.gettempdir()) / "mkb-noise-inputs.bin")}


def one_process(problem_id: str, dsl: str, setting: str, calls: int) -> dict:
    """In a fresh process: steady the host as the grader's child does (or not), then time like the grader does."""
    from metakernelbench.grader import child
    from metakernelbench.grader.parent import _summary
    from metakernelbench.suite import load_problem

    host = child.steady_host("cuda:0") if setting == "as_graded" else {}
    problem = load_problem(problem_id)
    job = {"mode": "candidate", "dsl": dsl, "device": "cuda:0", "problem_path": str(problem.path),
           "nonce": "noise", "candidate_path": str(problem.graded_solution(dsl)), "inplace": dict(problem.inplace),
           "outputs": list(problem.outputs)}
    harness_end, _parent_end = socket.socketpair()
    runner = child.Runner(harness_end, job)
    runner.load()
    size = problem.timed_size("cuda")
    for seed in range(5):
        runner.call(_request(problem, seed, size))
        runner.drop()
    times, hosts = [], []
    for seed in range(5, 5 + calls):
        reply = runner.call(_request(problem, seed, size))
        runner.drop()
        runner.last = None
        times.append(reply["ms"])
        hosts.append(reply["host_ms"])
    return {**_summary(times), "host_median_ms": statistics.median(hosts), "context_flags": _context_flags(),
            "cpus": len(os.sched_getaffinity(0)), "host": host}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("problem")
    ap.add_argument("dsl")
    ap.add_argument("--processes", type=int, default=5, help="fresh processes per setting")
    ap.add_argument("--calls", type=int, default=30, help="timed calls per process, as the grader makes")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--out")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one_process(args.problem, args.dsl, args.child, args.calls)))
        return
    names = args.settings.split(",")
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        raise SystemExit(f"unknown setting(s) {unknown}: choose from {', '.join(SETTINGS)}")
    _has_driver()
    runs: dict[str, list[dict]] = {n: [] for n in names}
    started = time.monotonic()
    for _ in range(args.processes):
        for name in names:
            proc = subprocess.run([sys.executable, __file__, args.problem, args.dsl, "--child", name,
                                   "--calls", str(args.calls)], capture_output=True, text=True, timeout=300)
            if proc.returncode != 0:
                raise SystemExit(f"{name}: the child failed:\n{proc.stderr[-2000:]}")
            runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    summary = {}
    for name, rs in runs.items():
        medians = [r["median_ms"] for r in rs]
        summary[name] = {"slowest_over_fastest": max(medians) / min(medians),
                         "median_of_medians_ms": statistics.median(medians),
                         "median_within_spread": statistics.median(r["spread"] for r in rs),
                         "context_flags": sorted({r["context_flags"] for r in rs})}
        s = summary[name]
        print(f"{args.problem} {args.dsl} {name:10s} medians {' '.join(f'{m:.4f}' for m in medians)} ms  "
              f"slowest/fastest {s['slowest_over_fastest']:.3f}  within-process spread "
              f"{s['median_within_spread']:.3f}  context flags {s['context_flags']}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"problem": args.problem, "dsl": args.dsl, "processes": args.processes, "calls": args.calls,
                       "settings": names, "summary": summary, "runs": runs,
                       "wall_s": time.monotonic() - started}, f, indent=1)


if __name__ == "__main__":
    main()
