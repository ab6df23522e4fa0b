"""Stand-in graders for lane tests. A lane builds its grader in its own worker process, so these live in a module the
worker imports (tests put this folder on PYTHONPATH) and report through files, never through the test's memory."""
import json
import os
import time
from pathlib import Path

from metakernelbench.execute import GradingLanes
from metakernelbench.grader import GraderConfig, Verdict

HERE = Path(__file__).parent


def verdict(problem, dsl, device) -> Verdict:
    return Verdict(problem=problem.id, dsl=dsl, file_sha256="", device=device, compiled=True, correct=False,
                   passed=False, failed_check="correctness", reason="wrong")


class SleepyGrader:
    """Sleeps `seconds` per job and appends (device, pid, start, end, file name) to the shared `log` file."""

    def __init__(self, config, log, seconds=0.05):
        self.device, self.log, self.seconds = config.device, log, seconds

    def grade(self, problem, dsl, path):
        start = time.monotonic()  # CLOCK_MONOTONIC: comparable across the lanes' processes
        time.sleep(self.seconds)
        line = json.dumps([self.device, os.getpid(), start, time.monotonic(), Path(path).name]) + "\n"
        with open(self.log, "a") as f:
            f.write(line)
        return verdict(problem, dsl, self.device)

    def close(self):
        pass


class BrokenGrader(SleepyGrader):
    """Raises for `boom.py`, as a grader whose fork server cannot start does."""

    def grade(self, problem, dsl, path):
        if Path(path).name == "boom.py":
            raise RuntimeError("fork server failed to start")
        return super().grade(problem, dsl, path)


class TroubledGrader(SleepyGrader):
    """Hangs on `hang.py` the first time it is graded on this host (a marker file remembers) and kills its own
    process on every grading of `die.py`: a grader that stops answering once, and one that always dies."""

    def grade(self, problem, dsl, path):
        name = Path(path).name
        if name == "die.py":
            os._exit(9)
        marker = Path(self.log).with_name("hung-once")
        if name == "hang.py" and not marker.exists():
            marker.touch()
            time.sleep(3600)
        return super().grade(problem, dsl, path)


def log_entries(log, since=0.0) -> list[tuple]:
    """(device, pid, start, end, name) of every job the stand-ins graded that started at `since` or later."""
    if not Path(log).exists():
        return []
    rows = [tuple(json.loads(line)) for line in Path(log).read_text().splitlines()]
    return [row for row in rows if row[2] >= since]


def fake_lanes(devices, make_grader, **options) -> GradingLanes:
    """Lanes whose workers can import this module (the lanes read PYTHONPATH once, when they start)."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (old, str(HERE)) if p)
    try:
        return GradingLanes(devices, GraderConfig(), make_grader=make_grader, **options)
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
