"""Command agents: a scripted "agent" passes through ./submit and leaves a skill; an agent searching the whole file
system finds no reference solution, no repository, no store and no secret but its own key; budgets bind from outside."""
import hashlib
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from metakernelbench.agent import command
from metakernelbench.agent.clients import ClientError
from metakernelbench.agent.command import run_command_trial
from metakernelbench.agent.presets import AgentCommand
from metakernelbench.grader import Grader, GraderConfig
from metakernelbench.protocol import Budget, TrialSpec
from metakernelbench.store import Store
from metakernelbench.suite import load_problem

REPO = Path(__file__).resolve().parents[1]
ADVERSARIAL = Path(__file__).parent / "adversarial"

HONEST_AGENT = """
import subprocess, sys
open("kernel.py", "w").write(sys.argv[1])
run = subprocess.run(["./submit"], capture_output=True, text=True)
assert run.returncode == 0 and "passed: True" in run.stdout, run.stdout
open("SKILL.md", "w").write("Accumulate the sum of squares in fp32 and add the residual before normalising.")
"""

# Walks the whole file system (outside /proc, /sys, /dev) and every readable process environment; writes its
# findings to SKILL.md. The marker is split so that this script's own text never matches it.
SEARCH_AGENT = """
import json, os, sys
root, canary, key_name, *forbidden = sys.argv[1:]
marker, secret = ("def compile" + "_for(").encode(), canary.encode()
report = {"suite_files": [], "marker_files": [], "canary_files": [], "canary_in_proc": [], "scanned": 0,
          "canary_in_env": any(canary in value for value in os.environ.values()),
          "own_key_seen": key_name in os.environ, "env": sorted(os.environ),
          "visible_paths": [p for p in forbidden if os.path.exists(p)]}
for top, dirs, files in os.walk(root):
    if top == "/":
        dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
    for name in files:
        path = os.path.join(top, name)
        if name in ("cute.py", "tirx.py") and "suite" in path.split(os.sep):
            report["suite_files"].append(path)
        try:
            info = os.lstat(path)
            if info.st_mode & 0o170000 != 0o100000 or info.st_size > 256 << 10:
                continue
            with open(path, "rb") as file:
                data = file.read()
        except OSError:
            continue
        report["scanned"] += 1
        if marker in data:
            report["marker_files"].append(path)
        if secret in data:
            report["canary_files"].append(path)
for pid in os.listdir("/proc"):
    try:
        with open(f"/proc/{pid}/environ", "rb") as file:
            if secret in file.read():
                report["canary_in_proc"].append(pid)
    except OSError:
        pass
with open("SKILL.md", "w") as file:
    json.dump({k: v[:20] if isinstance(v, list) else v for k, v in report.items()}, file)
"""


@pytest.fixture(scope="module")
def grader():
    assert shutil.which("bwrap"), "command agents are tested inside bubblewrap: apt-get install bubblewrap"
    with Grader(GraderConfig(device="cpu", warmup_calls=2, timed_calls=5, baseline_processes=1)) as g:
        yield g


def _trial(tmp_path: Path, budget: Budget = Budget()) -> tuple[Store, TrialSpec]:
    store = Store(tmp_path / "store" / "s.sqlite")
    store.ensure_run("r", {}, {})
    spec = TrialSpec("r", "command:test", "mlp_norm/28_fused_add_rmsnorm_h4096_llama31_8b", "tirx", "solo", 0, budget=budget)
    store.add_trials([spec])
    store.start_trial(spec.trial_id, {})
    return store, spec


def _python(script: str, *args: str) -> AgentCommand:
    return _agent(shlex.join(["python3", "-c", script, *args]))


def _agent(command_line: str, env_keys: tuple[str, ...] = ()) -> AgentCommand:
    return AgentCommand("command:test", command_line, env_keys)


def test_honest_agent_passes_through_submit_and_leaves_its_skill(grader, tmp_path):
    store, spec = _trial(tmp_path)
    agent = _python(HONEST_AGENT, (ADVERSARIAL / "honest_rmsnorm.py").read_text())
    result = run_command_trial(spec, agent, grader, load_problem("28"), store, None)
    assert result.passed and result.submissions == 1 and result.best_submission == 0, result
    assert result.stop_reason == "agent exited" and result.isolation == "bwrap" and result.turns is None
    row = store.trial(spec.trial_id)
    assert row.status == "finished" and row.skill.startswith("Accumulate the sum of squares")
    assert row.skill_audit["leaks_code"] is False and row.usage["agent_exit_status"] == 0
    [(_, code, verdict)] = store.submissions(spec.trial_id)
    assert verdict["passed"] and code == (ADVERSARIAL / "honest_rmsnorm.py").read_text()
    transcript = store.transcript(spec.trial_id)
    assert transcript[0][0] == "user" and "## Your workspace" in transcript[0][1] and "./submit" in transcript[0][1]
    assert "There is no GPU here" in transcript[0][1] and "`./submit` is the only way to run your kernel" in \
        transcript[0][1]
    assert row.usage["wall_s"] > 0 and len(store.regrades(spec.trial_id)) == 2
    assert transcript[1][0] == "assistant" and transcript[1][1].startswith("./submit\n```python")
    assert transcript[2][0] == "user" and "passed: True" in transcript[2][1]
    assert transcript[-1][0] == "assistant" and "exit status 0" in transcript[-1][1]


def test_agent_searching_the_file_system_finds_no_solution_store_or_secret(grader, tmp_path, monkeypatch):
    canary = secrets.token_hex(16)
    monkeypatch.setenv("MKB_TEST_CANARY_SECRET", canary)  # in the harness's environment, not named for the agent
    monkeypatch.setenv("MKB_TEST_AGENT_KEY", "the-agent's-own-key")
    store, spec = _trial(tmp_path)
    forbidden = [str(REPO), str(store.path.parent), sys.prefix, str(Path.home() / ".ssh")]
    args = (canary, "MKB_TEST_AGENT_KEY", *forbidden)
    # Control: outside the sandbox the same search finds the reference solutions, the repository and the canary.
    control = subprocess.run([sys.executable, "-c", SEARCH_AGENT, str(REPO / "src"), *args], cwd=tmp_path,
                             capture_output=True, text=True)
    assert control.returncode == 0, control.stderr
    seen = json.loads((tmp_path / "SKILL.md").read_text())
    assert seen["suite_files"] and seen["marker_files"] and seen["canary_in_env"] and str(REPO) in seen["visible_paths"]

    search = _python(SEARCH_AGENT, "/", *args)
    result = run_command_trial(spec, _agent(search.command, ("MKB_TEST_AGENT_KEY",)), grader, load_problem("28"),
                               store, None)
    assert result.isolation == "bwrap" and result.stop_reason == "agent exited"
    report = json.loads(store.trial(spec.trial_id).skill)
    assert report["scanned"] > 1000  # the walk really covered the sandbox's system directories
    assert report["suite_files"] == [] and report["marker_files"] == [] and report["visible_paths"] == []
    assert report["canary_files"] == [] and report["canary_in_proc"] == [] and not report["canary_in_env"]
    assert report["own_key_seen"] and set(report["env"]) <= {"PATH", "HOME", "LANG", "PWD", "SHLVL", "_",
                                                              "MKB_TEST_AGENT_KEY"}


def test_submissions_beyond_the_budget_are_refused(grader, tmp_path):
    store, spec = _trial(tmp_path, Budget(submissions=2))
    kernel = (ADVERSARIAL / "bad_syntax.py").read_text()
    agent = (f"printf %s {shlex.quote(kernel)} > kernel.py; for i in 1 2 3 4 5; do ./submit > /dev/null; "
             'code=$?; echo "submit $i: $code" >> SKILL.md; [ $code = 2 ] && break; done')
    result = run_command_trial(spec, _agent(agent), grader, load_problem("28"), store, None)
    assert result.submissions == 2 and not result.passed and result.stop_reason == "budget: submissions"
    row = store.trial(spec.trial_id)
    assert row.skill.splitlines() == ["submit 1: 1", "submit 2: 1", "submit 3: 2"]
    assert row.usage["refused_submits"] == 1 and len(store.submissions(spec.trial_id)) == 2
    assert any("submission budget is spent" in content for _, content in store.transcript(spec.trial_id))


LEAKING_AGENT = """
import os, subprocess, sys
key = os.environ["MKB_TEST_AGENT_KEY"]
open("kernel.py", "w").write(sys.argv[1] + f"\\n# my key: {key}\\nprint('key', {key!r})\\n")
subprocess.run(["./submit"])
print("my key is", key)
open("SKILL.md", "w").write(f"the key was {key}")
"""


def test_a_key_the_agent_writes_anywhere_is_redacted_in_the_store(grader, tmp_path, monkeypatch):
    key = "hunter2-" + secrets.token_hex(8)
    monkeypatch.setenv("MKB_TEST_AGENT_KEY", key)
    store, spec = _trial(tmp_path)
    agent = _agent(_python(LEAKING_AGENT, (ADVERSARIAL / "honest_rmsnorm.py").read_text()).command,
                   ("MKB_TEST_AGENT_KEY",))
    result = run_command_trial(spec, agent, grader, load_problem("28"), store, None)
    assert result.passed  # the file graded is the file sent
    [(_, code, verdict)] = store.submissions(spec.trial_id)
    assert "# my key: [redacted]" in code and verdict["file_sha256"] != hashlib.sha256(code.encode()).hexdigest()
    assert store.trial(spec.trial_id).skill == "the key was [redacted]"
    store.close()
    for path in store.path.parent.iterdir():
        assert key.encode() not in path.read_bytes(), path
    reopened = Store(store.path)
    assert all(key not in text for _, text, _ in reopened.artifacts(spec.trial_id))
    assert any("my key is [redacted]" in text for _, text, _ in reopened.artifacts(spec.trial_id))


def test_task_md_says_truly_what_the_sandbox_has(grader, tmp_path):
    store, spec = _trial(tmp_path)
    probe = ("{ python3 -c 'import torch' 2>/dev/null && echo torch yes || echo torch no; "
             "ls /dev/nvidia0 2>/dev/null && echo gpu yes || echo gpu no; } > SKILL.md")
    run_command_trial(spec, _agent(probe), grader, load_problem("28"), store, None)
    found = store.trial(spec.trial_id).skill.splitlines()
    task = store.transcript(spec.trial_id)[0][1]
    assert found[-1] == "gpu no" and "There is no GPU here" in task
    assert ("PyTorch is importable" in task) == (found[0] == "torch yes"), (found, task[-600:])
    assert ("PyTorch is not importable" in task) == (found[0] == "torch no")


def test_an_agent_that_cannot_start_is_a_setup_failure_with_its_output_kept(grader, tmp_path):
    store, spec = _trial(tmp_path)
    with pytest.raises(command.AgentSetupError, match="could not start \\(exit status 127: .*mkb-no-such-cli"):
        run_command_trial(spec, _agent("mkb-no-such-cli --version"), grader, load_problem("28"), store, None)
    (name, text, _), = store.artifacts(spec.trial_id)
    assert name == "agent-output.txt" and "mkb-no-such-cli" in text


def test_an_agent_that_fails_before_submitting_is_a_setup_failure(grader, tmp_path):
    store, spec = _trial(tmp_path)
    with pytest.raises(command.AgentSetupError, match="exited with status 3 before its first submission: no model"):
        run_command_trial(spec, _agent("echo 'no model'; exit 3"), grader, load_problem("28"), store, None)
    store, spec = _trial(tmp_path / "second")
    result = run_command_trial(spec, _agent("echo 'I give up'"), grader, load_problem("28"), store, None)
    assert not result.passed and result.stop_reason == "agent exited"  # exit 0 without a kernel: the model's failure


def _processes_with(argument: bytes) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if argument in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                found.append(pid)
        except OSError:
            pass
    return found


def test_agent_past_its_wall_budget_is_killed_with_everything_it_started(grader, tmp_path):
    store, spec = _trial(tmp_path, Budget(wall_s=2.0))
    started = time.monotonic()
    result = run_command_trial(spec, _agent("(sleep 987654 &); sleep 987654"), grader, load_problem("28"), store,
                               None)
    assert result.stop_reason == "budget: wall time" and result.submissions == 0 and not result.passed
    assert time.monotonic() - started < 10
    assert _processes_with(b"987654") == []
    assert "killed at the wall budget" in store.transcript(spec.trial_id)[-1][1]


def test_without_bubblewrap_the_agent_runs_as_nobody_or_not_at_all(grader, tmp_path, monkeypatch):
    monkeypatch.setattr(command, "BWRAP", "mkb-no-such-bwrap")
    store, spec = _trial(tmp_path)
    try:
        result = run_command_trial(spec, _agent("id -un > SKILL.md"), grader, load_problem("28"), store, None)
    except ClientError as exc:  # nobody could reach the repository here (or this is not root): refused, with the fix
        assert "apt-get install bubblewrap" in str(exc)
        return
    assert result.isolation == "user nobody" and store.trial(spec.trial_id).skill == "nobody"
