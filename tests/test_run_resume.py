"""A real `mkb run` (two CPU lanes) killed with SIGKILL mid-run resumes on rerun: no finished trial redone, none lost
or duplicated."""
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from processes import children_of

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
            "--problems", "28", "--dsls", "cute,tirx", "--arms", "solo,skill", "--device", "cpu,cpu", "--db", str(db)]
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


def test_a_grader_orphaned_by_sigkill_exits_quietly(tmp_path):
    """SIGKILL of `mkb run` alone, while a submission is being graded: its lane's worker dies with it, and the
    orphaned fork server and its child finish or leave without printing a traceback into the user's terminal."""
    db, errors = tmp_path / "run.sqlite", tmp_path / "stderr.txt"
    with errors.open("w") as stderr:
        run = subprocess.Popen([sys.executable, "-m", "metakernelbench", "run", "--model", "reference", "--dsls",
                                "tirx", "--arms", "solo", "--device", "cpu", "--db", str(db)],
                               stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
    deadline, server = time.monotonic() + 120, None
    while time.monotonic() < deadline and server is None:
        time.sleep(0.2)
        lanes = children_of(run.pid)  # grading lane workers; each runs its grader's fork server
        servers = [c for lane in lanes for c in children_of(lane)
                   if b"forkserver" in Path(f"/proc/{c}/cmdline").read_bytes()]
        server = next((s for s in servers if children_of(s)), None)  # a submission is being graded
    assert server is not None, "no submission was graded within two minutes"
    os.kill(run.pid, signal.SIGKILL)
    run.wait()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and Path(f"/proc/{server}").exists():
        time.sleep(0.2)
    try:
        os.killpg(run.pid, signal.SIGKILL)  # whatever is still left of the group
    except ProcessLookupError:
        pass
    assert "Traceback" not in errors.read_text(), errors.read_text()
