"""The fork server's spare child: prepared as a grading's child starts importing, given the next job, isolated as a
fresh child is (seccomp on every thread), replaced by a fresh fork when it died, and gone when the grader closes."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from metakernelbench.grader import Grader, GraderConfig
from metakernelbench.suite import load_problem
from processes import children_of

HONEST = Path(__file__).parent / "adversarial" / "honest_rmsnorm.py"
CONFIG = GraderConfig(device="cpu", warmup_calls=1, timed_calls=2, baseline_processes=1)


def _spare(grader: Grader) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        children = children_of(grader._server.process.pid)
        if len(children) == 1:
            return children[0]
        time.sleep(0.05)
    pytest.fail(f"the fork server holds {len(children)} children after a grading, not one prepared spare")


@pytest.fixture(scope="module")
def p28():
    return load_problem("28")


def test_the_next_grading_runs_in_the_prepared_spare(p28):
    with Grader(CONFIG) as grader:
        assert grader.grade(p28, "tirx", HONEST).passed
        spare = _spare(grader)
        spawned = []
        spawn = grader._server.spawn
        grader._server.spawn = lambda job: spawned.append(spawn(job)) or spawned[-1]
        verdict = grader.grade(p28, "tirx", HONEST)
        assert verdict.passed, verdict.reason
        assert spawned[0].pid == spare, "the job went to a fresh fork, not to the prepared spare"
        isolation = verdict.checks["isolation"]["detail"]
        assert isolation["other_processes"] == "on" and isolation["network"] in ("on", "refused by the platform "
                                                                                       "(not fatal)")
        assert verdict.timings_s["import"] < 5


def test_a_dead_spare_is_replaced_by_a_fresh_fork(p28):
    with Grader(CONFIG) as grader:
        assert grader.grade(p28, "tirx", HONEST).passed
        os.kill(_spare(grader), signal.SIGKILL)
        verdict = grader.grade(p28, "tirx", HONEST)
        assert verdict.passed, verdict.reason


def test_the_spare_leaves_with_the_grader(p28):
    grader = Grader(CONFIG)
    assert grader.grade(p28, "tirx", HONEST).passed
    spare = _spare(grader)
    grader.close()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{spare}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    state = Path(f"/proc/{spare}/stat").read_text().split()[2] if Path(f"/proc/{spare}").exists() else "gone"
    assert state in ("gone", "Z"), f"the spare is still running ({state}) after the grader closed"


OTHER_THREAD_SIGNALS = """
import os, sys, threading
from metakernelbench.grader import sandbox
go, done, result = threading.Event(), threading.Event(), []
def other():
    go.wait()
    try:
        os.kill(int(sys.argv[1]), 0)
        result.append("reached")
    except PermissionError:
        result.append("refused")
    done.set()
threading.Thread(target=other, daemon=True).start()
assert sandbox._install_seccomp(False)
go.set()
done.wait()
print(result[0])
"""


def test_seccomp_covers_threads_that_already_run():
    """A spare child starts CUDA (and its threads) before it is isolated: the filter must reach them too."""
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        out = subprocess.run([sys.executable, "-c", OTHER_THREAD_SIGNALS, str(target.pid)], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip() == "refused", "a thread started before the filter could signal another process"
    finally:
        target.kill()
