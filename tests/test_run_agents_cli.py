"""`mkb run` with agents, as a user meets it: the preflight refuses what cannot work before any trial, with one line
naming the fix; a dry run states the worst case; keys never print; a store that is not SQLite is one line in every
command that reads one; `mkb trial` keeps [dsl] tags and lists the agent's files."""
import os
import subprocess
import sys

import pytest

from metakernelbench.store import Store
from metakernelbench.suite import load_suite

REAL = ("--device", "cpu", "--dsls", "tirx", "--arms", "solo", "--no-solo-control")


@pytest.fixture(scope="module")
def problem_id():
    return next(p.id for p in load_suite() if p.family == "mlp_norm")


def mkb(*args, env=None):
    return subprocess.run([sys.executable, "-m", "metakernelbench", *args], capture_output=True, text=True,
                          timeout=300, env=env)


def _one_error_line(proc, fix):
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("warning:")]
    assert proc.returncode == 2, (proc.stdout[-1000:], proc.stderr[-1000:])
    assert len(errors) == 1 and fix in errors[0] and "Traceback" not in proc.stderr, proc.stderr


def test_preflight_refuses_an_agent_the_sandbox_cannot_find(tmp_path, problem_id):
    db = tmp_path / "run.sqlite"
    _one_error_line(mkb("run", "--model", "command:mkb-no-such-agent --go", "--problems", problem_id, *REAL,
                        "--db", str(db)), "'mkb-no-such-agent' cannot be found inside the sandbox")
    outside = tmp_path / "bin"
    outside.mkdir()
    (outside / "my-agent").write_text("#!/bin/sh\necho hi\n")
    (outside / "my-agent").chmod(0o755)
    env = {**os.environ, "PATH": f"{outside}:{os.environ['PATH']}"}
    _one_error_line(mkb("run", "--model", "command:my-agent", "--problems", problem_id, *REAL, "--db", str(db),
                        env=env), f"installed at {outside}/my-agent, outside the system folders")
    assert not db.exists()  # refused before the store was even opened


def test_preflight_asks_an_api_model_one_request_first(tmp_path, problem_id):
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")}
    _one_error_line(mkb("run", "--model", "openai:m", "--base-url", "http://127.0.0.1:9/v1", "--problems", problem_id,
                        *REAL, "--db", str(tmp_path / "a.sqlite"), env=env), "preflight: cannot reach")
    _one_error_line(mkb("run", "--model", "claude-code:claude-sonnet-4-5", "--problems", problem_id, *REAL,
                        "--db", str(tmp_path / "b.sqlite"), env=env), "needs ANTHROPIC_API_KEY, which is not set")


def test_real_models_without_a_gpu_need_cpu_and_tirx_said_out_loud(tmp_path, problem_id):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    _one_error_line(mkb("run", "--model", "openai:m", "--base-url", "http://127.0.0.1:9/v1", "--problems",
                        problem_id, "--db", str(tmp_path / "c.sqlite")), "--device cpu --dsls tirx")


def test_dry_run_states_the_worst_case_and_never_prints_a_key(tmp_path, problem_id):
    chat = mkb("run", "--model", "openai:gpt-5", "--base-url", "http://127.0.0.1:9/v1", "--problems", problem_id,
               *REAL, "--dry-run")
    assert chat.returncode == 0, chat.stderr
    text = " ".join(chat.stdout.split())
    assert "worst case:" in text and "output tokens" in text and "at list price" in text and "wall time 2400 s" in text
    agent = mkb("run", "--model", "command:my-agent --api-key sk-live-abcdefghijklmnopqrst", "--problems",
                problem_id, *REAL, "--dry-run")
    assert agent.returncode == 0, agent.stderr
    assert "sk-live-abcdefghijklmnopqrst" not in agent.stdout + agent.stderr
    assert "--agent-env" in agent.stderr and "not bounded by mkb" in " ".join(agent.stdout.split())
    _one_error_line(mkb("run", "--model", "codex:gpt-5", "--problems", problem_id, *REAL, "--turns", "5",
                        "--dry-run"), "--turns does not apply to codex")


@pytest.mark.parametrize("command", [("status",), ("trial", "abc"), ("export",), ("report",),
                                     ("run", "--model", "reference", "--dsls", "tirx", "--arms", "solo", "--device", "cpu")])
def test_a_db_that_is_not_sqlite_is_one_line(tmp_path, command):
    junk = tmp_path / "junk.sqlite"
    junk.write_text("this is a text file, not a store\n" * 100)
    proc = mkb(*command, "--db", str(junk), *(("--out", str(tmp_path / "o")) if command[0] in ("export", "report")
                                              else ()))
    _one_error_line(proc, "is not a MetaKernelBench store")
    assert junk.read_text().startswith("this is a text file")  # nothing lost


def test_trial_view_keeps_dsl_tags_and_lists_the_agents_files(tmp_path, problem_id):
    from metakernelbench.protocol import plan

    db = tmp_path / "s.sqlite"
    store = Store(db)
    store.ensure_run("r", {}, {})
    (spec,) = plan("r", "command:agent", [problem_id], ["tirx"], ["solo"], solo_control=False)
    store.add_trials([spec])
    store.start_trial(spec.trial_id, {})
    store.add_message(spec.trial_id, 0, "user", "the task [tirx]")
    store.add_artifact(spec.trial_id, "agent-output.txt", "line\n" * 5000)
    store.fail_setup(spec.trial_id, "the agent program could not start (exit status 127: [tirx] not found)")
    store.close()
    view = mkb("trial", spec.trial_id, "--db", str(db))
    assert view.returncode == 0, view.stderr
    assert f"{problem_id} [tirx] solo r0 (agent_error)" in view.stdout
    assert "agent_error: the agent program could not start (exit status 127: [tirx] not found)" in view.stdout
    assert "file agent-output.txt: 25,000 characters" in view.stdout and "--files" in view.stdout
    whole = mkb("trial", spec.trial_id, "--db", str(db), "--files")
    assert whole.stdout.count("line\n") == 5000


def test_default_budgets_are_the_published_benchmarks_and_help_says_so():
    from metakernelbench.protocol import Budget

    assert (Budget().submissions, Budget().wall_s) == (10, 2400.0)
    text = " ".join(mkb("run", "--help").stdout.replace("│", " ").split())
    assert "Default budgets per trial are the published benchmark's: 10 submissions and 2400 s of wall time" in text
