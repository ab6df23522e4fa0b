"""`mkb demo` runs the whole protocol offline on this CPU: TIRx references pass, CuTe DSL cannot launch here."""
import subprocess
import sys


def test_demo_runs_every_arm_and_writes_a_labelled_summary(tmp_path):
    db = tmp_path / "demo.sqlite"
    proc = subprocess.run([sys.executable, "-m", "metakernelbench", "demo", "--problems", "28,76", "--db", str(db),
                           "--device", "cpu"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = (tmp_path / "demo-summary.md").read_text()
    assert "OFFLINE client" in summary
    assert "| solo | 8 | 8 | 4 | 0 |" in summary  # 2 problems x 2 DSLs x (solo + control); TIRx passes on CPU
    assert "| skill | 4 | 4 | 2 | 0 |" in summary and "| placebo | 4 | 4 | 2 | 0 |" in summary
    rows = [line for line in summary.splitlines() if line.startswith(("| mlp_norm", "| moe"))]
    assert len(rows) == 2 and all(row.count("pass") == 4 and row.count("fail") == 4 for row in rows)
