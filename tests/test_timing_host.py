"""The timed call's host side is steadied: no garbage collection inside it, and on a GPU the timing process is pinned
to one CPU (a different one per lane) with spinning CUDA synchronisation (grader/child.steady_host)."""
from __future__ import annotations

import gc
import json
import os
import socket
import subprocess
import sys

from pathlib import Path

from metakernelbench.grader import channel, child
from metakernelbench.grader.parent import file_hand_over
from metakernelbench.suite import load_problem


def _eager_runner():
    problem = load_problem("28")
    job = {"mode": "eager", "dsl": None, "device": "cpu", "problem_path": str(problem.path), "nonce": "t",
           "candidate_path": None}
    mine, _theirs = socket.socketpair()
    runner = child.Runner(mine, job)
    runner.load()
    return runner


def _request(seed: int, tmp: Path) -> dict:
    """A call as the parent sends it: inputs the parent made, handed over by file."""
    records, tensors = channel.input_records(load_problem("28").make_inputs(seed, "cpu", "cpu"))
    return {"op": "call", **file_hand_over(records, tensors, tmp / "inputs.bin")}


def test_the_collector_is_off_inside_a_timed_call_and_restored_after(tmp_path):
    runner = _eager_runner()
    reference, seen = runner.solve, []

    def probe(*inputs):
        seen.append(gc.isenabled())
        return reference(*inputs)

    runner.solve = probe
    assert gc.isenabled()
    runner.call(_request(1, tmp_path))
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        runner.call(_request(2, tmp_path))
        assert seen == [False, False] and not gc.isenabled()  # a caller's choice is left as it was
    finally:
        gc.enable()


def test_cpu_grading_is_not_pinned():
    before = os.sched_getaffinity(0)
    assert child.steady_host("cpu") == {} and os.sched_getaffinity(0) == before


def _steady_in_fresh_process(device: str) -> tuple[dict, list[int]]:
    code = ("import json, os, sys; from metakernelbench.grader import child; "
            "print(json.dumps([child.steady_host(sys.argv[1]), sorted(os.sched_getaffinity(0))]))")
    proc = subprocess.run([sys.executable, "-c", code, device], capture_output=True, text=True, check=True,
                          timeout=120)
    return tuple(json.loads(proc.stdout))


def test_a_gpu_lane_pins_its_timing_process_to_its_own_cpu():
    allowed = sorted(os.sched_getaffinity(0))
    for index in (0, 1, 5):
        host, now = _steady_in_fresh_process(f"cuda:{index}")
        expected = allowed[-1 - index % len(allowed)]
        assert host["cpu"] == expected and now == [expected], (index, host, now)
        assert host["cuda_schedule"] in ("spin", "default (no libcuda.so.1)", "default (the driver refused spin)")
        if not os.path.exists("/dev/nvidia0"):
            assert host["cuda_schedule"] == "default (no libcuda.so.1)"
