"""benchmarks/router_variants.py, on the CPU: it passes the TIRx reference and catches a router that breaks ties the
wrong way, each variant in its own process, and refuses a missing file before running anything."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "router_variants.py"
REFERENCE = ROOT / "src/metakernelbench/suite/moe/76_softmax_topk_router_renorm/tirx.py"

# torch.topk is exact on values but does not promise the lower expert id first among equal logits.
TIES_BY_HIGHER_ID = '''
import torch


def solve(logits, top_k):
    flipped = torch.flip(logits, dims=[1])
    order = torch.sort(flipped, dim=-1, descending=True, stable=True).indices[:, :top_k]
    ids = logits.shape[1] - 1 - order
    return torch.softmax(torch.gather(logits, 1, ids), dim=-1), ids.to(torch.int32)
'''


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT)


def test_reference_passes_and_a_wrong_tie_rule_is_caught(tmp_path):
    wrong = tmp_path / "ties_by_higher_id.py"
    wrong.write_text(TIES_BY_HIGHER_ID)
    out = tmp_path / "rows.json"
    done = run(str(REFERENCE), str(wrong), "--out", str(out))
    assert done.returncode == 0, done.stderr
    reference, flipped = json.loads(out.read_text())["rows"]
    assert reference["exact"] is True
    assert all(check["rows_with_wrong_ids"] == 0 for check in reference["checks"])
    assert flipped["exact"] is False
    stress = [c for c in flipped["checks"] if c["inputs"].startswith("stress")]
    assert all(check["rows_with_wrong_ids"] > 0 for check in stress)


def test_a_missing_file_stops_before_any_work(tmp_path):
    out = tmp_path / "rows.json"
    done = run(str(REFERENCE), str(tmp_path / "absent.py"), "--out", str(out))
    assert done.returncode != 0
    assert "absent.py" in done.stderr
    assert not out.exists()


def test_switches_reach_the_variant_environment(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import os\nassert os.environ['MKB_SWITCH'] == 'on'\n" + TIES_BY_HIGHER_ID)
    out = tmp_path / "rows.json"
    assert run(f"{probe}:MKB_SWITCH=on", "--out", str(out)).returncode == 0
    assert "error" not in json.loads(out.read_text())["rows"][0]
    assert run(str(probe), "--out", str(out)).returncode == 0
    assert "error" in json.loads(out.read_text())["rows"][0]
