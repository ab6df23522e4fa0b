"""The Ray executor on the CPU: `mkb run --executor ray` on a local cluster that declares two GPUs it does not have
grades TIRx references on the CPU through lane actors; an actor killed mid-grading is replaced and its submission
graded once; a run cut short resumes on Ray like a local one; without Ray the option fails in one line."""
import importlib.util
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def mkb_run(db: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "metakernelbench", "run", "--model", "reference", "--executor", "ray",
            "--address", "local", "--dsls", "tirx", "--problems", "75", "--arms", "solo", "--regrades", "0",
            "--db", str(db), *extra]


def grading_actor() -> int | None:
    """A lane actor's process while it grades: Ray titles it after the method it runs."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{entry}/cmdline").read_bytes().startswith(b"ray::LaneActor.grade"):
                return int(entry)
        except OSError:
            pass
    return None


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed (the `ray` extra)")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two lanes need two CPUs")
def test_a_ray_run_survives_a_killed_actor_and_resumes(tmp_path):
    db = tmp_path / "run.sqlite"
    run = subprocess.Popen(mkb_run(db, "--device", "cpu,cpu"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)
    deadline, victim = time.monotonic() + 180, None
    while victim is None and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
        victim = grading_actor()
    assert victim is not None, "no lane actor was seen grading"
    os.kill(victim, signal.SIGKILL)
    out, _ = run.communicate(timeout=300)
    assert run.returncode == 0, out[-3000:]
    lanes_line = next(line for line in out.splitlines() if line.startswith("grading lanes (ray):"))
    assert "GPU 0 (grading on the CPU)" in lanes_line and "GPU 1 (grading on the CPU)" in lanes_line, lanes_line
    with sqlite3.connect(db) as con:
        trials = con.execute("SELECT trial_id, status, attempts FROM trials ORDER BY trial_id").fetchall()
        per_trial = dict(con.execute("SELECT trial_id, COUNT(*) FROM submissions GROUP BY trial_id").fetchall())
        passed = con.execute("SELECT COUNT(*) FROM submissions WHERE json_extract(verdict, '$.passed')").fetchone()
        (environment,) = con.execute("SELECT environment FROM runs").fetchone()
    assert [(status, attempts) for _, status, attempts in trials] == [("finished", 1)] * 2
    assert per_trial == {t: 1 for t, *_ in trials} and passed == (2,)  # the killed actor's job: one verdict
    environment = json.loads(environment)
    cpus = [set(lane["cpus"]) for lane in environment["grading_lanes"]]
    assert environment["executor"] == "ray" and len(cpus) == 2 and not cpus[0] & cpus[1]  # each its own CPUs

    cut_short = trials[0][0]  # as if the driver died while this trial ran
    with sqlite3.connect(db) as con:
        con.execute("UPDATE trials SET status='running' WHERE trial_id=?", (cut_short,))
    resumed = subprocess.run(mkb_run(db, "--device", "cpu"), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    with sqlite3.connect(db) as con:
        after = dict(con.execute("SELECT trial_id, attempts FROM trials WHERE status='finished'").fetchall())
        per_trial = dict(con.execute("SELECT trial_id, COUNT(*) FROM submissions GROUP BY trial_id").fetchall())
    assert after == {cut_short: 2, trials[1][0]: 1} and set(per_trial.values()) == {1}


def test_without_ray_the_ray_executor_is_one_line(tmp_path):
    no_ray = tmp_path / "no_ray"
    (no_ray / "ray").mkdir(parents=True)
    (no_ray / "ray" / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(no_ray), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "metakernelbench", "run", "--model", "reference", "--executor", "ray",
                           "--dsls", "tirx", "--problems", "75", "--arms", "solo", "--device", "cpu", "--db",
                           str(tmp_path / "run.sqlite")], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2 and "install the `ray` extra" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
