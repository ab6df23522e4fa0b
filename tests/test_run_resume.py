"""A real `mkb run` killed with SIGKILL mid-run resumes on rerun: no finished trial redone, none lost or duplicated."""
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

HONEST = Path(__file__).parent / "adversarial" / "honest_rmsnorm.py"


def _replay_dir(tmp_path: Path) -> Path:
    turns = tmp_path / "replay"
    turns.mkdir()
    (turns / "turn_001.md").write_text(f"Here is my kernel.\n```python\n{HONEST.read_text()}```\n")
    (turns / "turn_002.md").write_text("That is my final answer.")
    (turns / "turn_003.md").write_text("Accumulate the sum of squares in fp32 and round the residual sum first.")
    return turns


def _mkb_run(replay: Path, db: Path) -> subprocess.Popen:
    args = [sys.executable, "-m", "metakernelbench", "run", "--model", f"replay:{replay}",
            "--problems", "28", "--dsls", "cute,tirx", "--arms", "solo,skill", "--device", "cpu", "--db", str(db)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _statuses(db):
    with sqlite3.connect(db) as con:
        return dict(con.execute("SELECT trial_id, status FROM trials").fetchall())


def test_kill_and_resume(tmp_path):
    db, replay = tmp_path / "run.sqlite", _replay_dir(tmp_path)
    first = _mkb_run(replay, db)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if db.exists() and list(_statuses(db).values()).count("finished") >= 2:
            break
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    before = _statuses(db)
    finished_before = {t for t, s in before.items() if s == "finished"}
    assert len(finished_before) >= 2 and len(before) == 6  # 2 DSLs x (solo + control) + 2 skill trials

    with sqlite3.connect(db) as con:
        finished_at = dict(con.execute("SELECT trial_id, finished FROM trials WHERE status='finished'").fetchall())
    second = _mkb_run(replay, db)
    out, _ = second.communicate(timeout=600)
    assert second.returncode == 0, out[-3000:]
    after = _statuses(db)
    assert set(after) == set(before) and set(after.values()) == {"finished"}, after
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT trial_id, finished, attempts FROM trials").fetchall()
        dupes = con.execute("SELECT trial_id, idx, COUNT(*) FROM submissions GROUP BY trial_id, idx "
                            "HAVING COUNT(*) > 1").fetchall()
        per_trial = dict(con.execute("SELECT trial_id, COUNT(*) FROM submissions GROUP BY trial_id").fetchall())
    assert not dupes
    for trial_id, finished, attempts in rows:
        if trial_id in finished_before:
            assert finished == finished_at[trial_id] and attempts == 1  # never redone
        assert per_trial.get(trial_id) == 1  # exactly one submission each: none lost, none duplicated
