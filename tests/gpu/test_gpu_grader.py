"""GPU-only grader behaviour: the CUDA IPC hand-over, and the runtime defences against threats 7 (side streams) and
18 (persisting L2) with their static rules switched off. Skipped without a CUDA device; run on the H200 with
`python -m pytest -q tests/gpu`."""
import json
import os
import subprocess
import sys

import pytest
import torch

from metakernelbench.grader import Grader, GraderConfig, cuda_ipc
from metakernelbench.suite import load_problem

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

PROBLEM = "mlp_norm/28_fused_add_rmsnorm_h4096_llama31_8b"
# Static rules off: the exploits below are refused statically; here their runtime defences must hold on their own.
CONFIG = GraderConfig(compile_baseline=False, baseline_processes=1, preload_dsls=("cute",), static_rules=False,
                      extra_env={"PYTHONPATH": os.environ.get("PYTHONPATH", "")})

SIDE_STREAM = '''

_honest_solve = solve


def solve(*inputs):
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # the timer's events sit on the default stream
        return _honest_solve(*inputs)
'''

PERSISTING_L2 = '''

_honest_solve = solve


def solve(*inputs):
    limit = cuda.cuCtxGetLimit(cuda.CUlimit.CU_LIMIT_PERSISTING_L2_CACHE_SIZE)[1]
    print("persisting-L2 carve-out at entry:", limit, flush=True)
    cuda.cuCtxSetLimit(cuda.CUlimit.CU_LIMIT_PERSISTING_L2_CACHE_SIZE, 16 << 20)
    weight = inputs[2]
    value = cuda.CUstreamAttrValue()
    value.accessPolicyWindow.base_ptr = weight.data_ptr()
    value.accessPolicyWindow.num_bytes = weight.numel() * weight.element_size()
    value.accessPolicyWindow.hitRatio = 1.0
    value.accessPolicyWindow.hitProp = cuda.CUaccessProperty.CU_ACCESS_PROPERTY_PERSISTING
    value.accessPolicyWindow.missProp = cuda.CUaccessProperty.CU_ACCESS_PROPERTY_STREAMING
    cuda.cuStreamSetAttribute(torch.cuda.current_stream().cuda_stream,
                              cuda.CUstreamAttrID.CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, value)
    return _honest_solve(*inputs)
'''


@pytest.fixture(scope="module")
def grader():
    with Grader(CONFIG) as g:
        yield g


@pytest.fixture(scope="module")
def honest(grader):
    problem = load_problem(PROBLEM)
    verdict = grader.grade(problem, "cute", problem.graded_solution("cute"))
    assert verdict.passed, verdict.reason
    return verdict


def _variant(tmp_path, name: str, wrapper: str):
    problem = load_problem(PROBLEM)
    path = tmp_path / name
    path.write_text(problem.graded_solution("cute").read_text() + wrapper)
    return problem, path


def test_outputs_come_back_device_to_device(honest):
    assert honest.draws and {d["transport"] for d in honest.draws} == {"ipc"}


def test_the_timing_process_is_pinned_and_spins(honest):
    assert honest.runtime["host"] == {"cpu": sorted(os.sched_getaffinity(0))[-1], "cuda_schedule": "spin"}


def test_row07_side_stream_gains_nothing(grader, honest, tmp_path):
    problem, path = _variant(tmp_path, "side_stream.py", SIDE_STREAM)
    verdict = grader.grade(problem, "cute", path)
    assert verdict.correct, verdict.reason
    assert verdict.checks["timer"]["passed"]
    assert verdict.runtime["median_ms"] >= 0.8 * honest.runtime["median_ms"], (
        f"side-stream work escaped the timer: {verdict.runtime['median_ms']:.4f} ms vs honest "
        f"{honest.runtime['median_ms']:.4f} ms")


def test_row18_persisting_l2_is_reset_before_every_call(grader, tmp_path):
    problem, path = _variant(tmp_path, "persisting_l2.py", PERSISTING_L2)
    verdict = grader.grade(problem, "cute", path)
    entries = [line for line in verdict.stdout_tail.splitlines() if "carve-out at entry" in line]
    assert entries, verdict.stdout_tail
    assert all(line.endswith(" 0") for line in entries), f"a call inherited a persisting-L2 carve-out: {entries}"
    assert verdict.checks["isolation"]["detail"]["persisting_l2_reset"] == "on"


EXPORTER = '''
import json, sys, torch
from metakernelbench.grader import cuda_ipc
big = torch.arange(1 << 20, dtype=torch.int32, device="cuda")
small = torch.linspace(-1, 1, 999, device="cuda").bfloat16()
torch.cuda.synchronize()
print(json.dumps(cuda_ipc.export([big, small[1:]])), flush=True)
sys.stdin.readline()
'''


def test_ipc_copies_exact_bytes_and_refuses_lying_records():
    child = subprocess.Popen([sys.executable, "-c", EXPORTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env=os.environ.copy())
    try:
        records = json.loads(child.stdout.readline())
        big, small = cuda_ipc.import_copies(records, "cuda:0")
        assert torch.equal(big, torch.arange(1 << 20, dtype=torch.int32, device="cuda"))
        assert torch.equal(small, torch.linspace(-1, 1, 999, device="cuda").bfloat16()[1:])
        past_end = [dict(records[0], offset=records[0]["offset"] + (64 << 20))]
        with pytest.raises(ValueError, match="runs past"):
            cuda_ipc.import_copies(past_end, "cuda:0")
        with pytest.raises(ValueError, match="does not match"):
            cuda_ipc.import_copies([dict(records[0], shape=[1 << 21])], "cuda:0")
        with pytest.raises(cuda_ipc.TransferError):
            cuda_ipc.import_copies([dict(records[0], handle="ab" * 64)], "cuda:0")
    finally:
        child.communicate("done\n", timeout=30)


IMPORTER = '''
import json, sys, torch
from metakernelbench.grader import cuda_ipc
torch.empty(1, device="cuda")  # the driver calls need CUDA started, as in a grading child
kept = cuda_ipc.Mappings()
for line in sys.stdin:
    copies = cuda_ipc.import_copies(json.loads(line), "cuda:0", kept)
    print(json.dumps({"sums": [int(c.double().sum()) for c in copies], "mapped": len(kept.ranges)}), flush=True)
'''


def test_kept_mapping_reads_each_calls_bytes_and_follows_a_grown_buffer():
    """The child keeps the input buffer mapped between calls: every call must still see that call's bytes, and a
    buffer that grew (a new allocation, the old one retired until close) replaces the old mapping."""
    buffer = cuda_ipc.DeviceBuffer("cuda:0")
    child = subprocess.Popen([sys.executable, "-c", IMPORTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env=os.environ.copy())
    try:
        seen = []
        for n, value in ((1 << 20, 1), (1 << 20, 3), (1 << 24, 2)):
            records = buffer.records([torch.full((n,), value, dtype=torch.int32, device="cuda")])
            child.stdin.write(json.dumps(records) + "\n")
            child.stdin.flush()
            seen.append(json.loads(child.stdout.readline()))
        assert [s["sums"] for s in seen] == [[1 << 20], [3 << 20], [2 << 24]]
        assert [s["mapped"] for s in seen] == [1, 1, 1]
        assert len(buffer.retired) == 1
    finally:
        child.communicate("", timeout=30)
        buffer.close()
    assert buffer.retired == [] and buffer.pointer == 0
