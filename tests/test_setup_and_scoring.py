"""Set-up failures are not results, a run stops at its cost limit, a trial is scored by fresh gradings of its chosen
submission (no winner's curse), and resuming a run whose tasks changed refuses or re-plans; all with stand-in clients
and graders, so the protocol's own behaviour is what is tested."""
import gzip
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from metakernelbench.agent.clients import ClientError, Reply
from metakernelbench.agent.trial import DISTILL_PROMPT, run_trial
from metakernelbench.protocol import Budget, plan
from metakernelbench.protocol.fingerprint import fingerprints, stale_trials, task_fingerprint
from metakernelbench.protocol.runner import CostSpent, SetupFailed, execute
from metakernelbench.store import SCHEMA_VERSION, Store
from metakernelbench.suite import load_suite

REPO = Path(__file__).resolve().parents[1]
CODE = "```python\nx = 1\n```"


@pytest.fixture(scope="module")
def problems():
    """Two problems, the first of each of two families, whatever their numbers; the mlp_norm one runs on the CPU."""
    suite = load_suite()
    chosen = [next(p for p in suite if p.family == "mlp_norm" and p.solution_runs_on_cpu("tirx")),
              next(p for p in suite if p.family == "moe")]
    return {p.id: p for p in chosen}


class Client:
    """Submits CODE `submits` times, then stops; distils a skill. Each answer costs `cost` USD."""

    def __init__(self, submits=1, cost=None):
        self.spec, self.sampling, self.left, self.cost = "scripted", None, submits, cost

    def complete(self, system, messages):
        if messages[-1]["content"] == DISTILL_PROMPT:
            return Reply("fp32 sums", 10, 5, 0, self.cost, 0.0, "scripted")
        self.left -= 1
        return Reply(CODE if self.left >= 0 else "done", 10, 5, 0, self.cost, 0.0, "scripted")


class Verdicts:
    """A grader whose every verdict passes, with a runtime drawn around `true_ms` (multiplicative noise)."""

    def __init__(self, true_ms=1.0, sigma=0.1, seed=0, fail_after=None):
        self.true_ms, self.sigma, self.rng, self.graded, self.fail_after = true_ms, sigma, random.Random(seed), 0, \
            fail_after

    def grade(self, problem, dsl, path):
        self.graded += 1
        passed = self.fail_after is None or self.graded <= self.fail_after
        median = self.true_ms * self.rng.lognormvariate(0, self.sigma)
        verdict = {"passed": passed, "compiled": True, "correct": passed, "failed_check": None if passed else
                   "correctness", "reason": "" if passed else "draw 3 differs", "file_sha256": "same",
                   "runtime": {"median_ms": median, "spread": 0.05, "p10_ms": median, "p90_ms": median, "n": 30},
                   "speedup_vs_eager": 2.0 / median, "speedup_vs_eager_range": [1.9 / median, 2.1 / median],
                   "roofline": {"fraction": 0.5 / median}, "stderr_tail": ""}

        class V:
            def to_dict(self):
                return verdict

        return V()


def _run_store(tmp_path, problems, **plan_options):
    store = Store(tmp_path / "s.sqlite")
    store.ensure_run("r", {}, {})
    specs = plan("r", "m", sorted(problems), ["tirx"], ["solo"], solo_control=False, **plan_options)
    return store, specs


def test_a_set_up_failure_is_agent_error_stops_the_run_and_is_retried(tmp_path, problems):
    store, specs = _run_store(tmp_path, problems)
    made = []

    def broken(spec, problem):
        made.append(spec.trial_id)
        raise ClientError("openai:m at http://x rejected the API key (HTTP 401): set OPENAI_API_KEY")

    with pytest.raises(SetupFailed, match="1 trial ended as agent_error.*rejected the API key.*rerun"):
        execute(store, specs, problems, broken, Verdicts(), {})
    rows = {t.trial_id: t for t in store.trials("r")}
    assert len(made) == 1  # the first failure stopped the run
    failed = rows[made[0]]
    assert failed.status == "agent_error" and failed.result is None and "rejected the API key" in failed.error
    assert [t.status for t in rows.values() if t.trial_id != made[0]] == ["pending"]
    execute(store, specs, problems, lambda spec, problem: Client(), Verdicts(), {})
    rows = {t.trial_id: t for t in store.trials("r")}
    assert all(t.status == "finished" and t.error is None for t in rows.values())
    assert rows[made[0]].attempts == 2


def test_a_harness_error_leaves_no_trial_running(tmp_path, problems):
    store, specs = _run_store(tmp_path, problems)

    class Crashing:
        def grade(self, problem, dsl, path):
            raise RuntimeError("grading lane died")

    with pytest.raises(RuntimeError, match="grading lane died"):
        execute(store, specs, problems, lambda spec, problem: Client(), Crashing(), {})
    assert {t.status for t in store.trials("r")} == {"pending"}


def test_max_cost_stops_starting_trials_and_a_higher_limit_goes_on(tmp_path, problems):
    store, specs = _run_store(tmp_path, problems)
    with pytest.raises(CostSpent, match=r"cost \$2.25, reaching --max-cost \$1.00: 1 trials not started"):
        execute(store, specs, problems, lambda spec, problem: Client(cost=0.75), Verdicts(), {}, max_cost_usd=1.0)
    assert sorted(t.status for t in store.trials("r")) == ["finished", "pending"]
    assert store.spent_usd("r") == pytest.approx(2.25)  # one submission, "done", the skill
    execute(store, specs, problems, lambda spec, problem: Client(cost=0.75), Verdicts(), {}, max_cost_usd=5.0)
    assert {t.status for t in store.trials("r")} == {"finished"}


def test_identical_code_graded_ten_times_flatters_the_old_rule_not_the_fresh_gradings(tmp_path, problems):
    """The same file submitted 10 times: the fastest of its 10 noisy gradings (the old score) sits ~14% under the
    true time at 10% noise; the median of 2 fresh gradings does not."""
    store, _ = _run_store(tmp_path, problems)
    problem = next(iter(problems.values()))
    selected, scored = [], []
    grader = Verdicts(true_ms=1.0, sigma=0.1, seed=1)
    for trial in range(60):
        (spec,) = plan("r", f"m{trial}", [problem.id], ["tirx"], ["solo"], solo_control=False,
                       budget=Budget(submissions=10))
        store.add_trials([spec])
        store.start_trial(spec.trial_id, {})
        result = run_trial(spec, Client(submits=10), grader, problem, store, None)
        assert result.passed and result.submissions == 10 and len(store.regrades(spec.trial_id)) == 2
        fresh = [v["runtime"]["median_ms"] for _, _, v in store.regrades(spec.trial_id)]
        assert result.median_ms == pytest.approx(sum(fresh) / 2) and result.regrade_medians_ms == fresh
        assert result.selection_median_ms == min(v["runtime"]["median_ms"] for _, _, v in
                                                 store.submissions(spec.trial_id))
        selected.append(result.selection_median_ms)
        scored.append(result.median_ms)
    assert sum(selected) / len(selected) < 0.9  # the winner's curse: ~0.86 of the true 1.0 ms
    assert 0.97 < sum(scored) / len(scored) < 1.04


def test_a_fresh_grading_that_fails_fails_the_trial(tmp_path, problems):
    store, _ = _run_store(tmp_path, problems)
    problem = next(iter(problems.values()))
    (spec,) = plan("r", "m", [problem.id], ["tirx"], ["solo"], solo_control=False, regrades=2)
    store.add_trials([spec])
    store.start_trial(spec.trial_id, {})
    result = run_trial(spec, Client(submits=1), Verdicts(fail_after=2), problem, store, None)
    assert not result.passed and result.median_ms is None and result.regrade_failure.startswith("correctness")
    assert result.selection_median_ms is not None and len(store.regrades(spec.trial_id)) == 2
    (none,) = plan("r", "m0", [problem.id], ["tirx"], ["solo"], solo_control=False, regrades=0)
    store.add_trials([none])
    store.start_trial(none.trial_id, {})
    old_rule = run_trial(none, Client(submits=1), Verdicts(), problem, store, None)
    assert old_rule.passed and old_rule.median_ms == old_rule.selection_median_ms and store.regrades(none.trial_id) == []


def test_fingerprints_change_with_the_task_and_mark_dependent_skill_arms(problems, tmp_path):
    problem = next(iter(problems.values()))
    assert task_fingerprint(problem, "tirx") != task_fingerprint(problem, "cute")
    assert task_fingerprint(problem, "tirx") == task_fingerprint(problem, "tirx")
    assert task_fingerprint(problem, "tirx", grader="another grader") != task_fingerprint(problem, "tirx")
    specs = plan("r", "m", sorted(problems), ["cute", "tirx"], ["solo", "skill"], solo_control=False)
    store = Store(tmp_path / "s.sqlite")
    store.ensure_run("r", {}, {})
    old = fingerprints(specs, problems)
    store.add_trials(specs, old)
    for spec in specs:
        store.start_trial(spec.trial_id, {})
        store.finish_trial(spec.trial_id, {"passed": False}, "skill", {}, {})
    assert stale_trials(store.trials("r"), specs, old) == []
    changed = next(s for s in specs if s.arm == "solo" and s.dsl == "cute")
    new = {**old, changed.trial_id: "0" * 32}
    fed = next(s for s in specs if s.arm == "skill" and s.skill_source() == (changed.problem, "cute", 0))
    assert stale_trials(store.trials("r"), specs, new) == [changed.trial_id, fed.trial_id]
    store.replan({t: new[t] for t in (changed.trial_id, fed.trial_id)})
    rows = {t.trial_id: t for t in store.trials("r")}
    assert rows[changed.trial_id].status == rows[fed.trial_id].status == "pending"
    assert rows[changed.trial_id].task_hash == "0" * 32 and rows[changed.trial_id].result is None


def _mkb(*args):
    return subprocess.run([sys.executable, "-m", "metakernelbench", *args], capture_output=True, text=True,
                          timeout=600)


def test_resuming_a_run_whose_problem_changed_refuses_or_replans(problems, tmp_path):
    problem = next(p for p in problems.values() if p.family == "mlp_norm" and p.solution_runs_on_cpu("tirx"))
    suite = tmp_path / "suite"
    folder = suite / problem.family / problem.path.parent.name
    shutil.copytree(problem.path.parent, folder)
    db = tmp_path / "run.sqlite"
    args = ("run", "--model", "reference", "--suite", str(suite), "--dsls", "tirx", "--arms", "solo",
            "--no-solo-control", "--device", "cpu", "--regrades", "0", "--db", str(db))
    first = _mkb(*args)
    assert first.returncode == 0, first.stderr[-2000:]
    with (folder / "problem.py").open("a") as module:
        module.write("\n# a changed problem module\n")
    refused = _mkb(*args)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "task changed since they ran" in refused.stderr and "--replan" in refused.stderr
    replanned = _mkb(*args, "--replan")
    assert replanned.returncode == 0 and "replanned 1 trials" in replanned.stdout, replanned.stderr[-2000:]
    store = Store(db)
    (trial,) = store.trials()
    assert trial.status == "finished" and trial.attempts == 2 and trial.task_hash == task_fingerprint(
        next(iter(load_suite(suite))), "tirx")
    store.close()


def test_a_store_written_by_schema_1_opens_migrated_and_reports(tmp_path):
    old = tmp_path / "v1.sqlite"
    old.write_bytes(gzip.decompress((REPO / "validation" / "h200-2026-12-01-demo.sqlite.gz").read_bytes()))
    store = Store(old)
    trials = store.trials()
    assert len(trials) == 48 and {t.status for t in trials} == {"finished"} and trials[0].task_hash is None
    assert store.artifacts(trials[0].trial_id) == [] and store.regrades(trials[0].trial_id) == []
    store.close()
    assert Store(old)._read("SELECT value FROM meta WHERE key='schema_version'") == [(str(SCHEMA_VERSION),)]
    status = _mkb("status", "--db", str(old))
    assert status.returncode == 0 and "demo" in status.stdout, status.stderr
