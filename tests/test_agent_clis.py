"""Real coding-agent CLIs (Claude Code, Codex CLI, installed from npm) run whole trials through `mkb run` against a
scripted model server on the loopback interface: each writes the variant's kernel, submits it through ./submit,
leaves a skill, and its usage and cost reach `mkb status`; a set-up mistake (the key not handed to the agent) ends
as agent_error with a non-zero exit and is retried on resume; the agent's key, echoed by the agent, is in no record.

Skipped where a CLI is not installed, unless MKB_REQUIRE_AGENT_CLIS is set (CI sets it, so there they must run)."""
import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from loopback_model import CACHED_TOKENS, INPUT_TOKENS, OUTPUT_TOKENS, LoopbackModel, Script
from metakernelbench.agent.usage import PRICES
from metakernelbench.store import Store
from metakernelbench.suite import load_suite

KEY = "sk-loopback-test-key"
SKILL = "Accumulate the sum of squares in fp32; one row per program; add the residual before normalising."


def _cli(program: str, package: str) -> None:
    """Skip, saying why, where the CLI is not installed; fail instead where MKB_REQUIRE_AGENT_CLIS is set."""
    if shutil.which(program):
        return
    why = f"{program} is not installed: npm install -g {package}"
    if os.environ.get("MKB_REQUIRE_AGENT_CLIS"):
        pytest.fail(f"MKB_REQUIRE_AGENT_CLIS is set but {why}")
    pytest.skip(why)


@pytest.fixture
def claude_code():
    _cli("claude", "@anthropic-ai/claude-code")


@pytest.fixture
def codex():
    _cli("codex", "@openai/codex")


@pytest.fixture(scope="module")
def problem():
    """An mlp_norm problem whose TIRx reference runs on the CPU, whatever its number: that reference is the agent's
    honest kernel."""
    return next(p for p in load_suite() if p.family == "mlp_norm" and p.solution_runs_on_cpu("tirx"))


def _script(problem) -> Script:
    kernel = problem.graded_solution("tirx").read_text()
    return Script([f"cat > kernel.py <<'MKB_EOF'\n{kernel}\nMKB_EOF\n./submit",
                   f"printf '%s\\n' {shlex.quote(SKILL)} > SKILL.md; echo \"my key is $ANTHROPIC_API_KEY"
                   "$OPENAI_API_KEY\""], api_key=KEY)


def _mkb(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "metakernelbench", *args], capture_output=True, text=True,
                          timeout=600, env=env)


def _run(model: str, problem, db: Path, env: dict, *extra: str) -> subprocess.CompletedProcess:
    return _mkb("run", "--model", model, "--problems", problem.id, "--dsls", "tirx", "--arms", "solo",
                "--no-solo-control", "--device", "cpu", "--db", str(db), *extra, env=env)


def _environment(**extra: str) -> dict:
    drop = ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


def _no_secret_anywhere(db: Path) -> None:
    """The key is in no byte of the store file and in none of its compressed agent files."""
    for path in db.parent.glob(db.name + "*"):
        assert KEY.encode() not in path.read_bytes(), path
    store = Store(db)
    for trial in store.trials():
        for name, text, _ in store.artifacts(trial.trial_id):
            assert KEY not in text, name
        assert all(KEY not in content for _, content in store.transcript(trial.trial_id))
    store.close()


def _finished_trial(db: Path):
    store = Store(db)
    (trial,) = store.trials()
    files = {name: text for name, text, _ in store.artifacts(trial.trial_id)}
    regrades = store.regrades(trial.trial_id)
    store.close()
    return trial, files, regrades


def test_claude_code_preset_runs_a_trial_and_reports_its_cost(claude_code, problem, tmp_path):
    db = tmp_path / "claude.sqlite"
    with LoopbackModel(_script(problem)) as server:
        proc = _run("claude-code:claude-sonnet-4-5", problem, db, _environment(ANTHROPIC_API_KEY=KEY),
                    "--base-url", server.url)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert any(r["path"] == "/v1/messages" and r["stream"] and r["step"] == 2 for r in server.log.requests)
    trial, files, regrades = _finished_trial(db)
    assert trial.status == "finished" and trial.result["passed"] and trial.skill == SKILL, trial
    assert len(regrades) == 2 and trial.result["median_ms"] is not None
    # Claude Code's own report: three model calls of the scripted usage, priced by Claude Code itself
    assert trial.usage["output_tokens"] >= 3 * OUTPUT_TOKENS and trial.usage["cost_usd"] > 0
    assert any(name.startswith(".claude/projects/") for name in files), files.keys()
    assert "my key is [redacted]" in "".join(files.values())
    status = _mkb("status", "--db", str(db), env=_environment()).stdout
    assert f"${trial.usage['cost_usd']:.2f}" in status and f"{trial.usage['output_tokens']:,}" in status, status
    _no_secret_anywhere(db)


def test_codex_preset_runs_a_trial_priced_from_the_table(codex, problem, tmp_path):
    db = tmp_path / "codex.sqlite"
    with LoopbackModel(_script(problem)) as server:
        proc = _run("codex:gpt-5", problem, db, _environment(OPENAI_API_KEY=KEY), "--base-url", server.url + "/v1")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert any(r["path"] == "/v1/responses" and r["stream"] for r in server.log.requests)
    trial, files, regrades = _finished_trial(db)
    assert trial.status == "finished" and trial.result["passed"] and trial.skill == SKILL, trial
    assert len(regrades) == 2
    calls = 3  # two commands, then the closing text
    price = PRICES["gpt-5"]
    expected = calls * ((INPUT_TOKENS - CACHED_TOKENS) * price["input"] + CACHED_TOKENS * price["cached_input"]
                        + OUTPUT_TOKENS * price["output"]) / 1e6
    assert trial.usage["output_tokens"] == calls * OUTPUT_TOKENS
    assert trial.usage["cost_usd"] == pytest.approx(expected), trial.usage
    assert any(name.startswith(".codex/sessions/") for name in files), files.keys()
    status = _mkb("status", "--db", str(db), env=_environment()).stdout
    assert f"${expected:.2f}" in status, status
    _no_secret_anywhere(db)


def test_agent_without_its_key_ends_as_agent_error_and_is_retried(claude_code, problem, tmp_path):
    db = tmp_path / "setup.sqlite"
    command = ("command:DISABLE_TELEMETRY=1 DISABLE_AUTOUPDATER=1 claude -p \"$(cat TASK.md)\" --output-format json "
               "--dangerously-skip-permissions --model claude-sonnet-4-5")
    with LoopbackModel(_script(problem)) as server:
        env = _environment(ANTHROPIC_API_KEY=KEY, ANTHROPIC_BASE_URL=server.url)
        forgot = _run(command, problem, db, env)  # no --agent-env: Claude Code inside the sandbox has no key
        assert forgot.returncode != 0, forgot.stdout[-2000:]
        (error,) = [line for line in forgot.stderr.splitlines() if not line.startswith("warning: no GPU")]
        assert error.startswith("error: 1 trial ended as agent_error") and "Not logged in" in error, forgot.stderr
        assert "rerun the same command" in error
        with sqlite3.connect(db) as con:
            assert con.execute("SELECT status, result FROM trials").fetchall() == [("agent_error", None)]
        status = _mkb("status", "--db", str(db), env=_environment()).stdout
        assert "agent_error" in status and "Not logged in" in status
        fixed = _run(command, problem, db, env, "--agent-env", "ANTHROPIC_API_KEY,ANTHROPIC_BASE_URL")
        assert fixed.returncode == 0, fixed.stdout[-3000:] + fixed.stderr[-3000:]
    trial, _, _ = _finished_trial(db)
    assert trial.status == "finished" and trial.result["passed"] and trial.attempts == 2 and trial.error is None
    _no_secret_anywhere(db)
