"""Local grading lanes, proven on the CPU: two lanes on device cpu split the host's CPUs and pin their grader
processes to them; a lane whose grader process is killed mid-grading, or which hangs past the hard timeout, is
replaced and the submission it held gets exactly one verdict, graded on the fresh grader; later submissions grade."""
import functools
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from metakernelbench.execute import GradingLanes, split_cpus
from metakernelbench.grader import GraderConfig
from metakernelbench.suite import load_problem

from lane_fakes import TroubledGrader, fake_lanes, log_entries

QUICK = GraderConfig(warmup_calls=2, timed_calls=10, baseline_processes=1, preload_dsls=("tirx",))


def test_cpus_are_split_evenly_and_disjointly():
    assert split_cpus([7, 0, 1, 2, 3, 4, 5, 6], 3) == [(0, 1), (2, 3), (4, 5)]  # 6 and 7 stay with the driver
    assert split_cpus([0, 1], 2) == [(0,), (1,)]
    with pytest.raises(ValueError, match="3 grading lanes need at least 3 CPUs"):
        split_cpus([0, 1], 3)


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def below(pid: int) -> list[int]:
    """The processes under `pid` (its grader's fork server, and the submission's child while one runs)."""
    stats = {int(e): _stat(int(e)) for e in os.listdir("/proc") if e.isdigit()}
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, fields in stats.items() if fields and int(fields[1]) == parent]
        found += children
        frontier += children
    return found


def alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def _wait_until(condition, timeout_s=120.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two lanes need two CPUs")
def test_a_killed_lane_regrades_its_submission_once_on_a_fresh_grader():
    problem = load_problem("75")  # a TIRx reference that grades on the CPU in about a second
    reference = problem.graded_solution("tirx")
    with GradingLanes(["cpu", "cpu"], QUICK) as lanes:
        first = lanes.stats()
        assert [s.label for s in first] == ["cpu", "cpu"] and len({s.pid for s in first}) == 2
        assert not set(first[0].cpus) & set(first[1].cpus)
        assert set(first[0].cpus) | set(first[1].cpus) <= os.sched_getaffinity(0)
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(lanes.grade, problem, "tirx", reference) for _ in range(4)]
            _wait_until(lambda: lanes.stats()[0].grading is not None)
            time.sleep(0.5)  # into the grading: the lane's fork server is starting or grading it
            victim = lanes.stats()[0]
            graders = below(victim.pid)
            assert graders and all(os.sched_getaffinity(p) == set(victim.cpus) for p in graders)
            os.kill(victim.pid, signal.SIGKILL)
            verdicts = [f.result() for f in futures]
        after = lanes.stats()
        assert len(verdicts) == 4 and all(v.passed for v in verdicts), [v.reason for v in verdicts]
        assert sum(s.graded for s in after) == 4  # one verdict per submission, none graded into two
        assert after[0].restarts == 1 and after[0].pid != victim.pid and after[0].cpus == victim.cpus
        assert not any(alive(p) for p in graders)  # the dead lane's processes went with it
        assert lanes.grade(problem, "tirx", reference).passed  # later submissions grade
        assert after[1].restarts == 0


def test_a_hung_lane_is_replaced_and_a_grader_that_always_dies_fails_only_its_submission(tmp_path):
    problem, log = load_problem("75"), tmp_path / "log.jsonl"
    lanes = fake_lanes(["cpu"], functools.partial(TroubledGrader, log=str(log)), hard_timeout_s=2.0,
                       max_attempts=2)
    with lanes:
        started, pid = time.monotonic(), lanes.stats()[0].pid
        hung = lanes.grade(problem, "tirx", tmp_path / "hang.py")
        assert hung.compiled and time.monotonic() - started >= 2.0  # the stand-in's verdict, from a fresh worker
        assert [row[-1] for row in log_entries(log)] == ["hang.py"] and lanes.stats()[0].restarts == 1
        assert lanes.stats()[0].pid != pid and not alive(pid)
        died = lanes.grade(problem, "tirx", tmp_path / "die.py")
        assert not died.passed and died.failed_check == "crash" and "each of 2 fresh graders" in died.reason
        assert "died (exit code 9)" in died.reason
        assert lanes.grade(problem, "tirx", tmp_path / "fine.py").compiled
        assert [s.graded for s in lanes.stats()] == [3] and lanes.stats()[0].restarts == 3
