"""Concurrent runs: trials overlap while each grading lane grades one job at a time, phases stay ordered, a failing
trial stops the run cleanly and a rerun finishes it; GradingLanes spreads jobs over its lanes and grades for real."""
import functools
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from metakernelbench.agent.clients import ClientError, Reply
from metakernelbench.agent.trial import DISTILL_PROMPT
from metakernelbench.execute import GradingLanes, LanesClosed
from metakernelbench.grader import GraderConfig
from metakernelbench.protocol import Budget, plan
from metakernelbench.protocol.runner import SetupFailed, execute
from metakernelbench.store import Store

from lane_fakes import BrokenGrader, SleepyGrader, fake_lanes, log_entries

HONEST = Path(__file__).parent / "adversarial" / "honest_rmsnorm.py"
RMSNORM = "mlp_norm/28_fused_add_rmsnorm_h4096_llama31_8b"


class SlowClient:
    """A model that takes `latency` seconds per answer: one kernel, then a skill."""

    def __init__(self, latency=0.2):
        self.latency = latency

    def complete(self, system, messages):
        time.sleep(self.latency)
        text = "Skill: fp32 sums." if messages[-1]["content"] == DISTILL_PROMPT else "```python\nx = 1\n```"
        return Reply(text, 10, 5, 0, None, self.latency, "slow")


@pytest.fixture(scope="module")
def sleepy(tmp_path_factory):
    """Two lanes of stand-in graders (0.05 s a job), shared by the tests that only need lanes to exist, with the
    log their jobs write."""
    log = tmp_path_factory.mktemp("lanes") / "log.jsonl"
    with fake_lanes(["cpu", "cpu"], functools.partial(SleepyGrader, log=str(log))) as lanes:
        yield lanes, log


class Recorder:
    """make_client and on_trial for execute: counts trials in flight and when each started and ended."""

    def __init__(self, client):
        self.lock, self.client = threading.Lock(), client
        self.in_flight = self.peak = 0
        self.started, self.ended, self.outcomes = {}, {}, Counter()

    def make_client(self, spec, problem):
        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self.started[spec.trial_id] = time.monotonic()
        return self.client(spec)

    def on_trial(self, spec, outcome):
        with self.lock:
            self.in_flight -= 1
            self.ended[spec.trial_id] = time.monotonic()
            self.outcomes[spec.trial_id] += 1


def new_store(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    store.ensure_run("r", {}, {})
    return store


def test_trials_overlap_while_each_lane_grades_one_job_at_a_time(tmp_path, suite, sleepy):
    (lanes, log), store, rec = sleepy, new_store(tmp_path), Recorder(lambda spec: SlowClient(0.2))
    specs = plan("r", "m", [RMSNORM], ["cute", "tirx"], ["solo"], replicates=4, budget=Budget(submissions=2),
                 solo_control=False)
    started = time.monotonic()
    execute(store, specs, {p.id: p for p in suite}, rec.make_client, lanes, {}, rec.on_trial, concurrency=4)
    elapsed = time.monotonic() - started
    # 8 trials x (3 answers x 0.2 s + 2 gradings x 0.05 s) = 5.6 s one after another; 4 at once take ~1.4 s
    assert rec.peak == 4 and elapsed < 3.0, (rec.peak, elapsed)
    rows = store.trials("r")
    assert len(rows) == 8 and all(t.status == "finished" and t.attempts == 1 for t in rows)
    assert set(rec.outcomes) == {t.trial_id for t in rows} and set(rec.outcomes.values()) == {1}
    jobs = log_entries(log, since=started)
    lane_pids = {lane.pid for lane in lanes.stats()}
    assert len(jobs) == 16 and {pid for _, pid, *_ in jobs} == lane_pids and len(lane_pids) == 2
    for lane in lane_pids:
        spans = sorted((start, end) for _, pid, start, end, _ in jobs if pid == lane)
        assert all(prev[1] <= nxt[0] for prev, nxt in zip(spans, spans[1:])), f"lane {lane} graded two jobs at once"


def test_phase_two_starts_only_after_every_phase_one_trial_ended(tmp_path, suite, sleepy):
    store, (lanes, _) = new_store(tmp_path), sleepy
    # Solo trials of uneven length: an early finisher must not let a skill trial start while others still run.
    rec = Recorder(lambda spec: SlowClient(0.05 + 0.1 * spec.replicate))
    specs = plan("r", "m", [RMSNORM], ["cute", "tirx"], ["solo", "skill"], replicates=3, budget=Budget(submissions=1),
                 solo_control=False)
    execute(store, specs, {p.id: p for p in suite}, rec.make_client, lanes, {}, rec.on_trial, concurrency=4)
    phase1 = [rec.ended[s.trial_id] for s in specs if s.phase == 1]
    phase2 = [rec.started[s.trial_id] for s in specs if s.phase == 2]
    assert len(phase1) == len(phase2) == 6 and max(phase1) <= min(phase2)
    assert all(t.status == "finished" for t in store.trials("r"))


def test_a_failing_trial_stops_the_run_and_a_rerun_finishes_the_rest(tmp_path, suite, sleepy):
    store, (lanes, _) = new_store(tmp_path), sleepy
    specs = plan("r", "m", [RMSNORM], ["cute", "tirx"], ["solo"], replicates=3, budget=Budget(submissions=1),
                 solo_control=False)
    calls, bad = [], []

    class BadKey:
        def complete(self, system, messages):
            raise ClientError("openai: invalid API key: set OPENAI_API_KEY")

    def make_client(spec, problem):
        calls.append(spec.trial_id)
        if len(calls) == 2:
            bad.append(spec.trial_id)
            return BadKey()
        return SlowClient(0.3)

    outcomes = Counter()
    with pytest.raises(SetupFailed, match="agent_error.*invalid API key"):
        execute(store, specs, {p.id: p for p in suite}, make_client, lanes, {},
                lambda spec, outcome: outcomes.update([spec.trial_id]), concurrency=2)
    statuses = Counter(t.status for t in store.trials("r"))
    # the trial in flight when the key failed ran to its end; nothing new started; the failed one is no result
    assert statuses == {"finished": 1, "agent_error": 1, "pending": 4} and len(calls) == 2
    (first,) = [t for t in store.trials("r") if t.status == "finished"]
    assert store.trial(bad[0]).status == "agent_error" and "invalid API key" in store.trial(bad[0]).error
    outcomes.pop(bad[0])  # reported as agent_error, not as a result

    execute(store, specs, {p.id: p for p in suite}, lambda spec, problem: SlowClient(0.01), lanes, {},
            lambda spec, outcome: outcomes.update([spec.trial_id]), concurrency=2)
    rows = {t.trial_id: t for t in store.trials("r")}
    assert all(t.status == "finished" for t in rows.values()) and set(outcomes.values()) == {1}
    assert rows[first.trial_id].attempts == 1 and rows[bad[0]].attempts == 2  # never redone; restarted once
    assert all(len(store.submissions(t)) == 1 for t in rows)


def test_one_store_shared_by_threads_keeps_every_row(tmp_path):
    store = new_store(tmp_path)
    specs = plan("r", "m", [RMSNORM], ["cute", "tirx"], ["solo"], replicates=4, solo_control=False)
    store.add_trials(specs)

    def write(spec):
        assert store.start_trial(spec.trial_id, {})
        for i in range(50):
            store.add_message(spec.trial_id, i, "user", f"turn {i}")
            store.add_submission(spec.trial_id, i, "code", {"passed": False})
            assert len(store.transcript(spec.trial_id)) == i + 1
        store.finish_trial(spec.trial_id, {"passed": False}, None, None, {})

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, specs))
    assert all(t.status == "finished" and len(store.submissions(t.trial_id)) == 50 for t in store.trials("r"))


def test_lanes_spread_jobs_and_hand_each_caller_its_own_verdict(tmp_path, suite, sleepy):
    (lanes, log), problem = sleepy, next(p for p in suite if p.id == RMSNORM)
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        names = [f"job_{i}.py" for i in range(8)]
        verdicts = list(pool.map(lambda name: lanes.grade(problem, "tirx", tmp_path / name), names))
    jobs = log_entries(log, since=started)
    assert sorted(name for *_, name in jobs) == names and len({pid for _, pid, *_ in jobs}) == 2
    assert all(v.problem == problem.id and not v.passed for v in verdicts)

    lanes = fake_lanes(["cpu"], functools.partial(BrokenGrader, log=str(log)))
    with pytest.raises(RuntimeError, match="fork server"):
        lanes.grade(problem, "tirx", tmp_path / "boom.py")
    assert lanes.grade(problem, "tirx", tmp_path / "fine.py").compiled  # the lane survived
    assert lanes.stats()[0].restarts == 0
    lanes.close()
    with pytest.raises(LanesClosed):
        lanes.grade(problem, "tirx", tmp_path / "late.py")
    with pytest.raises(ValueError, match="one lane"):
        GradingLanes(["cuda:0", "cuda"], GraderConfig())


def test_a_real_cpu_lane_passes_an_honest_submission(suite):
    problem = next(p for p in suite if p.id == RMSNORM)
    with GradingLanes(["cpu"], GraderConfig(preload_dsls=("tirx",))) as lanes:
        verdict = lanes.grade(problem, "tirx", HONEST)
    assert verdict.passed and verdict.correct and verdict.device.startswith("cpu"), verdict.reason
