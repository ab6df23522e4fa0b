"""Where does a timed call's time go? Times one problem's eager reference and reference solutions in the child
harness with each harness step switched off in turn, against a plain same-input event loop.

    python benchmarks/timing_anatomy.py [PROBLEM] [DSL...]      (on a GPU machine)
"""
from __future__ import annotations

import socket
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from metakernelbench.grader import channel, child
from metakernelbench.grader.parent import file_hand_over
from metakernelbench.suite import load_problem

INPUTS = Path(tempfile.gettempdir()) / "mkb-anatomy-inputs.bin"


def harness_ms(problem, mode, dsl, calls=30, poison=True, keep_alive=True):
    job = {"mode": mode, "dsl": dsl, "device": "cuda:0", "problem_path": str(problem.path), "nonce": "anatomy",
           "candidate_path": str(problem.graded_solution(dsl)) if dsl else None, "inplace": dict(problem.inplace),
           "outputs": list(problem.outputs)}
    harness_end, _parent_end = socket.socketpair()  # the child reports once before the import; nobody reads it here
    runner = child.Runner(harness_end, job)
    runner.load()
    if not poison:
        runner._poison = lambda inputs: None
    if not keep_alive:
        runner._remember = lambda inputs: None
    size = problem.timed_size("cuda")
    times, hosts = [], []
    for i in range(calls + 5):
        records, tensors = channel.input_records(problem.make_inputs(i, "cuda:0", size))
        reply = runner.call({"op": "call", **file_hand_over(records, tensors, INPUTS)})
        runner.drop()
        if i >= 5:
            times.append(reply["ms"])
            hosts.append(reply["host_ms"])
    return statistics.median(times), statistics.median(hosts)


def plain_ms(fn, inputs, calls=30):
    for _ in range(5):
        fn(*inputs)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn(*inputs)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def main():
    problem = load_problem(sys.argv[1] if len(sys.argv) > 1 else "28")
    dsls = sys.argv[2:] or ["tirx"]
    inputs = problem.make_inputs(1, "cuda:0", problem.timed_size("cuda"))
    rows = [("eager plain loop (same inputs, back to back)", plain_ms(problem.module.reference, inputs), None)]
    for dsl in dsls:
        solve = problem.load_solution(dsl).solve
        rows.append((f"{dsl} plain loop (same inputs, back to back)", plain_ms(solve, inputs), None))
    for mode, dsl in [("eager", None)] + [("candidate", d) for d in dsls]:
        label = dsl or "eager"
        for poison, keep in ((True, True), (False, True), (True, False), (False, False)):
            ms, host = harness_ms(problem, mode, dsl, poison=poison, keep_alive=keep)
            rows.append((f"{label} harness poison={poison} keep_alive={keep}", ms, host))
    for name, ms, host in rows:
        print(f"{name:60s} {ms:9.4f} ms" + (f"   host {host:9.4f} ms" if host else ""))


if __name__ == "__main__":
    main()
