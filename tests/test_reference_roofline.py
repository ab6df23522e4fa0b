"""benchmarks/reference_roofline.py refuses what it cannot measure with one line naming the fix: a problem that is not
in the suite, and a machine without a GPU. Problems are named as `mkb` takes them."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "reference_roofline.py"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT)


def test_an_unknown_problem_is_refused_by_name():
    done = run("--problems", "76,99")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].startswith("reference_roofline: problem '99' is not in the suite")
    assert "mkb list" in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only refusal")
def test_numbers_names_and_ids_resolve_and_a_cpu_machine_is_refused():
    done = run("--problems", "76,fused_add_rmsnorm_h4096_llama31_8b,moe/76_softmax_topk_router_renorm")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "reference_roofline: needs a CUDA GPU; on a CPU-only machine `mkb validate` compile-checks the references instead"]
