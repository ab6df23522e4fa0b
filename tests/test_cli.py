"""The `mkb` command: every user error is one line naming the fix and a non-zero exit; the main commands work."""
import json
import os
import subprocess
import sys
from pathlib import Path

HONEST = Path(__file__).parent / "adversarial" / "honest_rmsnorm.py"


def mkb(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "metakernelbench", *args], capture_output=True, text=True,
                          timeout=600, cwd=cwd)


def test_list_shows_every_problem(suite):
    out = mkb("list").stdout
    assert all(p.id in out for p in suite), out


def test_task_statements_differ_only_in_the_dsl_section():
    cute, tirx = mkb("show", "28", "--dsl", "cute").stdout, mkb("show", "28", "--dsl", "tirx").stdout
    assert "def solve(" not in cute and "solve(hidden_states, residual, weight)" in cute
    assert "CuTe DSL" in cute and "TIRx" in tirx and cute != tirx
    strip = lambda text: [line for line in text.splitlines() if "CuTe" not in line and "TIRx" not in line
                          and "cute" not in line and "tirx" not in line and "T." not in line]
    common_cute, common_tirx = set(strip(cute)), set(strip(tirx))
    assert "## How you are graded" in common_cute and "## How you are graded" in common_tirx
    assert {l for l in common_cute if l.startswith("def reference")} == {l for l in common_tirx
                                                                       if l.startswith("def reference")}


def test_user_errors_are_one_line_with_nonzero_exit(tmp_path):
    cases = [("show", "no_such_problem"), ("grade", "28", str(tmp_path / "missing.py"), "--dsl", "tirx"),
             ("grade", "28", str(tmp_path), "--dsl", "tirx"),
             ("grade", "28", str(HONEST), "--dsl", "cuda"), ("list", "--suite", str(tmp_path / "nowhere")),
             ("grade", "28", str(HONEST), "--dsl", "tirx", "--device", "cuda")]
    for args in cases:
        proc = mkb(*args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, (args, proc.stderr)


def test_grade_json_verdict_and_exit_codes(tmp_path):
    proc = mkb("grade", "28", str(HONEST), "--dsl", "tirx", "--device", "cpu", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdict = json.loads(proc.stdout)
    assert verdict["passed"] and verdict["correct"] and verdict["runtime"]["n"] == 30
    assert {"ghost_replay", "dsl_share", "unpatched", "threads", "timer", "roofline"} <= set(verdict["checks"])
    broken = tmp_path / "broken.py"
    broken.write_text("def solve(:\n")
    failed = mkb("grade", "28", str(broken), "--dsl", "tirx", "--device", "cpu")
    assert failed.returncode == 1 and "static_rules" in failed.stdout and "syntax error" in failed.stdout


def test_audit_passes_and_legend_explains_fields():
    assert mkb("audit").returncode == 0
    legend = mkb("legend").stdout
    assert "speedup_vs_eager" in legend and "failed_check" in legend


def test_run_bad_configurations_are_one_line_errors(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}

    def run_args(model="reference", problems="28", dsls="tirx", arms="solo", *extra):
        return ["run", "--model", model, "--problems", problems, "--dsls", dsls, "--arms", arms, "--device", "cpu",
                "--db", str(tmp_path / "run.sqlite"), *extra]

    cases = [(run_args("foo:bar"), "openai:MODEL"), (run_args("openai:gpt-x"), "OPENAI_API_KEY"),
             (run_args(arms="solo,skill"), "--dsls"), (run_args(problems="999"), "mkb list"),
             (run_args("reference", "28", "tirx", "solo", "--concurrency", "0"), "--concurrency"),
             (run_args("reference", "28", "tirx", "solo", "--families", "moe"), "choose from mlp_norm")]
    for args, fix in cases:
        proc = subprocess.run([sys.executable, "-m", "metakernelbench", *args], capture_output=True, text=True,
                              timeout=300, env=env)
        assert proc.returncode == 2, (args, proc.stdout[-500:], proc.stderr[-500:])
        assert fix in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)


def test_dry_run_prints_the_noise_range_for_the_plan(suite):
    from metakernelbench.analysis.power import no_transfer_lift_range

    proc = mkb("run", "--model", "reference", "--dry-run", "--replicates", "3")
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())
    expected = no_transfer_lift_range(len(suite), 3, 2).half_width
    assert f"noise alone moves paired lift within ±{expected:.0f}% per model×direction cell" in out
    assert "74-problem published range for comparison: published -19%..+29%" in out
