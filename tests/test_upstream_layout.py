"""Problem modules in the published benchmark's layout load unchanged from a `--suite` folder tree: found
recursively, numbered by their stem, in their folder's family, with returned inputs as in-place outputs and no
roofline floor unless declared; a CUDA-only generator on a CPU machine and a SOL-ExecBench recipe each get one line."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from metakernelbench.grader import Grader, GraderConfig
from metakernelbench.suite import ProblemError, load_problem, load_suite
from metakernelbench.suite.audit import audit_problem
from metakernelbench.task import task_statement

UPSTREAM = Path(__file__).resolve().parent / "upstream_layout"
PROBLEMS = UPSTREAM / "problems"


def mkb(*args):
    return subprocess.run([sys.executable, "-m", "metakernelbench", *args], capture_output=True, text=True,
                          timeout=600)


def test_modules_are_found_recursively_with_number_family_and_in_place_outputs():
    copy, tables, rms = load_suite(PROBLEMS)
    assert (copy.id, rms.id) == ("kv_cache/25_block_copy_demo_fp32", "mlp_norm/28_rms_scale_h256_demo_fp32")
    assert copy.published_layout and copy.outputs == ("output0", "output1")
    assert copy.inplace == {"output0": 1, "output1": 2}
    assert rms.outputs == ("output0",) and rms.inplace == {}
    # returned through aliases (`tables = [t0, t1]`, `counts = num_blocks`) and checked against the objects returned
    assert tables.inplace == {"output0": 0, "output1": 1, "output2": 2}
    assert all(row.passed for row in audit_problem(tables, "cpu"))
    assert task_statement(copy, "tirx").splitlines()[2].startswith("Problem 25 (kv_cache")


def test_no_declared_formula_no_roofline_floor():
    copy = load_problem("25", PROBLEMS)
    inputs = copy.make_inputs(1, "cpu", copy.sizes[0])
    assert copy.bytes_moved(inputs, copy.reference(*inputs)) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only refusal")
def test_a_cuda_only_generator_is_one_line_on_a_cpu_machine():
    rms = load_problem("28", PROBLEMS)
    with pytest.raises(ProblemError, match=r"make_inputs\(\) builds its inputs on CUDA and this machine has no GPU"):
        rms.make_inputs(1, "cpu", rms.sizes[0])
    done = mkb("audit", "--suite", str(PROBLEMS))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "builds its inputs on CUDA" in done.stderr


def test_a_recipe_is_refused_with_one_line_and_listed_as_such():
    with pytest.raises(ProblemError, match="SOL-ExecBench recipe.*assemble it"):
        load_problem(str(PROBLEMS / "_sol_execbench" / "31_groupnorm_demo_fp32.json"))
    listed = mkb("list", "--suite", str(PROBLEMS))
    assert listed.returncode == 0 and "25_block_copy_demo_fp32" in listed.stdout
    assert "1 SOL-ExecBench recipe" in listed.stdout and "assembled" in listed.stdout


def test_an_honest_in_place_kernel_passes_without_false_rejection():
    copy = load_problem("25", PROBLEMS)
    with Grader(GraderConfig(device="cpu", warmup_calls=1, timed_calls=5, baseline_processes=1)) as grader:
        verdict = grader.grade(copy, "tirx", UPSTREAM / "block_copy_tirx.py")
    assert verdict.passed, (verdict.failed_check, verdict.reason, verdict.stderr_tail[-800:])
    assert verdict.roofline["floor_ms"] is None and "declares no bytes_moved" in verdict.roofline["note"]
    assert len(verdict.draws) >= 5
    json.dumps(verdict.to_dict())


def test_the_audit_catches_an_undeclared_in_place_output(tmp_path):
    module = tmp_path / "kv_cache" / "25_silent_inplace_fp32.py"
    module.parent.mkdir()
    module.write_text((PROBLEMS / "kv_cache" / "25_block_copy_demo_fp32.py").read_text()
                      + "\nINPLACE = {}  # wrong: the reference returns dst_k and dst_v\n")
    rows = audit_problem(load_problem(str(module)), "cpu")
    bad = [row for row in rows if not row.passed]
    assert bad and "declare INPLACE to match" in bad[0].reason
