"""Plans, the store's resume semantics, skill hand-off and budgets, with a recording stand-in for the grader."""
import sqlite3

import pytest

from metakernelbench.agent.clients import Reply
from metakernelbench.agent.trial import DISTILL_PROMPT, SKILL_HEADER, audit_skill, run_trial
from metakernelbench.protocol import Budget, PlanError, placebo_problem, plan
from metakernelbench.protocol.runner import execute
from metakernelbench.store import Store, StoreError
from metakernelbench.suite import load_suite
from metakernelbench.task import task_statement

PROBLEMS = ["attention/01_gqa_paged_decode_h32_kv8_d128_ps1", "mlp_norm/28_fused_add_rmsnorm_h4096_llama31_8b", "moe/76_softmax_topk_router_renorm"]


def test_plan_has_every_arm_once_with_fixed_ids():
    specs = plan("r", "m", PROBLEMS, ["cute", "tirx"], ["solo", "skill", "placebo"], replicates=2)
    arms = [s.arm for s in specs]
    assert arms.count("solo") == 3 * 2 * 3  # problems x DSLs x (2 replicates + 1 control)
    assert arms.count("skill") == arms.count("placebo") == 3 * 2 * 2  # problems x ordered pairs x replicates
    assert len({s.trial_id for s in specs}) == len(specs)
    again = plan("r", "m", PROBLEMS, ["cute", "tirx"], ["solo", "skill", "placebo"], replicates=2)
    assert [s.trial_id for s in specs] == [s.trial_id for s in again]
    assert all(s.phase == 1 for s in specs[:18]) and all(s.phase == 2 for s in specs[18:])
    assert len({s.budget for s in specs}) == 1


def test_placebo_is_deterministic_and_never_the_same_problem():
    for p in PROBLEMS:
        chosen = {placebo_problem(p, PROBLEMS, seed=7) for _ in range(5)}
        assert len(chosen) == 1 and p not in chosen
    assert {placebo_problem(PROBLEMS[0], PROBLEMS, s) for s in range(20)} == set(PROBLEMS[1:])


@pytest.mark.parametrize("args, fix", [(dict(arms=["solo", "bogus"]), "choose from"),
                                       (dict(dsls=["tirx"]), "--dsls"), (dict(replicates=0), "--replicates")])
def test_plan_errors_name_the_fix(args, fix):
    kwargs = dict(dsls=["cute", "tirx"], arms=["solo", "skill"], replicates=1) | args
    with pytest.raises(PlanError, match=fix):
        plan("r", "m", PROBLEMS, kwargs["dsls"], kwargs["arms"], kwargs["replicates"])


def test_store_refuses_foreign_and_newer_databases(tmp_path):
    foreign = tmp_path / "foreign.sqlite"
    sqlite3.connect(foreign).execute("CREATE TABLE x (a)")
    with pytest.raises(StoreError, match="new --db"):
        Store(foreign)
    newer = tmp_path / "newer.sqlite"
    Store(newer).close()
    sqlite3.connect(newer, isolation_level=None).execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    with pytest.raises(StoreError, match="schema 99"):
        Store(newer)


def test_interrupted_trial_restarts_clean_and_finished_is_never_redone(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    store.ensure_run("r", {"a": 1}, {})
    (spec,) = plan("r", "m", PROBLEMS[:1], ["tirx"], ["solo"], solo_control=False)
    store.add_trials([spec, spec])
    assert store.start_trial(spec.trial_id, {})
    store.add_message(spec.trial_id, 0, "user", "task")
    store.add_submission(spec.trial_id, 0, "code", {"passed": False})
    assert store.start_trial(spec.trial_id, {})  # the process died: start over
    assert store.transcript(spec.trial_id) == [] and store.submissions(spec.trial_id) == []
    store.finish_trial(spec.trial_id, {"passed": True}, "skill", {}, {})
    assert not store.start_trial(spec.trial_id, {})
    row = store.trial(spec.trial_id)
    assert row.attempts == 2 and row.status == "finished" and len(store.trials()) == 1
    with pytest.raises(StoreError, match="another configuration"):
        store.ensure_run("r", {"a": 2}, {})


class ScriptedClient:
    """Answers from a script and records every prompt it was shown."""

    def __init__(self, answers):
        self.spec, self.sampling, self.answers, self.seen = "scripted", None, list(answers), []

    def complete(self, system, messages):
        self.seen.append([dict(m) for m in messages])
        text = self.answers.pop(0) if messages[-1]["content"] != DISTILL_PROMPT else "Skill: tile rows; fp32 sums."
        return Reply(text, 10, 5, 0, None, 0.0, "scripted")


class RecordingGrader:
    def __init__(self):
        self.graded = []

    def grade(self, problem, dsl, path):
        self.graded.append((problem.id, dsl, path.read_text()))

        class V:
            def to_dict(self):
                return {"passed": False, "compiled": True, "correct": False, "failed_check": "correctness",
                        "reason": "wrong", "runtime": {}, "roofline": {}, "stderr_tail": ""}

        return V()


def test_skill_arm_gets_exactly_the_source_skill_and_budgets_bind(tmp_path):
    suite = {p.id: p for p in load_suite()}
    store = Store(tmp_path / "s.sqlite")
    store.ensure_run("r", {}, {})
    specs = plan("r", "m", [PROBLEMS[1]], ["cute", "tirx"], ["solo", "skill"], budget=Budget(submissions=2),
                 solo_control=False)
    clients = {}

    def make_client(spec, problem):
        clients[spec.trial_id] = ScriptedClient(["```python\nx = 1\n```"] * 5)
        return clients[spec.trial_id]

    grader = RecordingGrader()
    execute(store, specs, suite, make_client, grader, {})
    rows = {(t.dsl, t.arm): t for t in store.trials("r")}
    assert all(t.status == "finished" for t in rows.values())
    assert all(t.result["submissions"] == 2 and t.result["stop_reason"] == "budget: submissions"
               for t in rows.values())
    skill_trial = next(s for s in specs if s.arm == "skill" and s.dsl == "tirx")
    first_prompt = clients[skill_trial.trial_id].seen[0][0]["content"]
    source_skill = rows[("cute", "solo")].skill
    assert first_prompt == f"{task_statement(suite[PROBLEMS[1]], 'tirx')}\n\n{SKILL_HEADER}\n{source_skill}\n"
    solo_prompt = clients[next(s for s in specs if s.arm == "solo" and s.dsl == "tirx").trial_id].seen[0][0]
    assert solo_prompt["content"] == task_statement(suite[PROBLEMS[1]], "tirx")


def test_skill_arm_without_source_skill_is_recorded_as_skipped(tmp_path):
    suite = {p.id: p for p in load_suite()}
    store = Store(tmp_path / "s.sqlite")
    store.ensure_run("r", {}, {})
    specs = plan("r", "m", [PROBLEMS[1]], ["cute", "tirx"], ["solo", "skill"], budget=Budget(submissions=1),
                 solo_control=False)

    class Mute(ScriptedClient):
        def complete(self, system, messages):
            return Reply("", 0, 0, 0, None, 0.0, "mute")

    execute(store, specs, suite, lambda spec, problem: Mute([]), RecordingGrader(), {})
    rows = store.trials("r")
    assert {t.arm: t.status for t in rows if t.arm == "skill"} == {"skill": "skipped"}
    assert all(t.result["stop_reason"] == "empty answer" for t in rows if t.arm == "solo")


def test_skill_audit_flags_code_and_dsl_identifiers():
    assert not audit_skill("Keep sums in fp32 and read each row once.")["leaks_code"]
    leaky = audit_skill("Use cute.make_copy_atom and T.alloc_shared.\n```\nx\n```")
    assert leaky["leaks_code"] and leaky["code_fences"] == 2 and "cute.make_copy_atom" in leaky["dsl_identifiers"]


def test_every_verdict_is_fed_back_exactly_once_before_distillation(tmp_path):
    suite = {p.id: p for p in load_suite()}
    store = Store(tmp_path / "s.sqlite")
    store.ensure_run("r", {}, {})
    code = "```python\nx = 1\n```"
    for answers, budget, expected in (([code, "done"], 5, 1), ([code] * 3, 2, 2)):
        (spec,) = plan("r", f"m{budget}", [PROBLEMS[1]], ["tirx"], ["solo"], budget=Budget(submissions=budget),
                       solo_control=False)
        store.add_trials([spec])
        store.start_trial(spec.trial_id, {})
        client = ScriptedClient(answers)
        run_trial(spec, client, RecordingGrader(), suite[spec.problem], store, None)
        final = client.seen[-1]
        assert final[-1]["content"] == DISTILL_PROMPT
        verdicts = [m for m in final if m["role"] == "user" and m["content"].startswith("## Verdict")]
        submissions = len(store.submissions(spec.trial_id))
        assert len(verdicts) == submissions == expected
