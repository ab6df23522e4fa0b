"""benchmarks/reference_roofline.time_calls charges a solution only its own device time: one that launches nothing
is charged nothing, although the L2 flush before every call also runs a memset the profiler cannot tell from a
solution's by name. Skipped without a CUDA device."""
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import reference_roofline  # noqa: E402


def test_a_solution_that_launches_nothing_costs_no_kernel_time():
    draws = [(torch.empty(1, device="cuda"),) for _ in range(23)]
    _, kernel_ms = reference_roofline.time_calls(lambda x: x, draws, "cuda")
    assert abs(kernel_ms * 1e3) < 0.2

