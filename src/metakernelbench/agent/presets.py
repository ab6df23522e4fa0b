"""Command agents by model string: the presets `claude-code:MODEL` (Claude Code) and `codex:MODEL` (Codex CLI), each
with the flags a lab would run it with (non-interactive, JSON usage report, permissions bypassed inside our sandbox,
base URL and key plumbing, telemetry and auto-update off), and the general `command:CMD`.

Budget placeholders in a `command:` line are substituted per run: {turns}, {wall_s}, {submissions},
{output_tokens}, {base_url}, {reasoning_effort}. Options that an agent cannot honour are refused, not ignored: a
command agent samples for itself (no --temperature, --max-output-tokens or --output-tokens), and --turns,
--reasoning-effort or --base-url apply only where the preset maps them or the command line holds their placeholder.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from metakernelbench.agent.clients import ClientError
from metakernelbench.agent.secrets import redact, secret_values

PRESETS = ("claude-code", "codex", "command")
_PLACEHOLDER = re.compile(r"\{(turns|wall_s|submissions|output_tokens|base_url|reasoning_effort)\}")
_QUIET_CLAUDE = {"DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
                 "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
OPENAI_URL = "https://api.openai.com/v1"


@dataclass(frozen=True)
class AgentCommand:
    """A command agent as a trial runs it. `label` is what every record calls it (the model string, secrets
    redacted); `command` is the shell line run in the sandbox; `env_keys` name the harness variables passed through
    (their values are redacted wherever they appear); `env` holds fixed, non-secret variables; `program` is what the
    preflight resolves inside the sandbox; `api` is (model string, base URL, key variable) of the model the preflight
    asks one tiny request, or None where the agent's model is not known."""

    label: str
    command: str
    env_keys: tuple[str, ...] = ()
    env: dict = field(default_factory=dict)
    program: str | None = None
    api: tuple[str, str | None, str] | None = None
    wire: str = "chat"  # how the preflight speaks to `api`: chat, responses or messages

    def secrets(self) -> list[str]:
        return secret_values(self.env_keys)


def is_command_agent(model: str) -> bool:
    return model.partition(":")[0] in PRESETS


def _program(command: str) -> str | None:
    """The program a shell line runs first (past VAR=value assignments), or None when the line is not that simple."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    for word in words:
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", word):
            continue
        return None if any(c in word for c in "$`;|&<>(){}") else word
    return None


def agent_command(model: str, budget, *, base_url: str | None = None, agent_env: tuple[str, ...] = (),
                  turns: int | None = None, reasoning_effort: str | None = None, temperature: float | None = None,
                  max_output_tokens: int | None = None, output_tokens: int | None = None) -> AgentCommand:
    """The agent a `claude-code:`, `codex:` or `command:` model string names, for `budget`. Options are passed only
    when the user gave them (None otherwise), so that one that does not apply is refused."""
    preset, _, rest = model.partition(":")
    if not rest.strip():
        raise ClientError(f"{preset}: names nothing: pass --model '{preset}:"
                          f"{'CMD' if preset == 'command' else 'MODEL'}'")
    for option, value, why in (("--temperature", temperature, "the agent samples for itself"),
                               ("--max-output-tokens", max_output_tokens, "the agent sets its own"),
                               ("--output-tokens", output_tokens, "no agent CLI bounds a whole attempt's tokens; "
                                                                  "its budget is wall time and submissions")):
        if value is not None:
            raise ClientError(f"{option} does not apply to command agents ({why}): drop it")
    values = {"turns": turns if turns is not None else budget.turns, "wall_s": f"{budget.wall_s:g}",
              "submissions": budget.submissions, "output_tokens": budget.output_tokens,
              "base_url": base_url or "", "reasoning_effort": reasoning_effort or ""}
    if preset == "claude-code":
        line = (f'claude -p "$(cat TASK.md)" --model {shlex.quote(rest)} --output-format json '
                "--dangerously-skip-permissions")
        if turns is not None:
            line += f" --max-turns {turns}"
        if reasoning_effort is not None:
            line += f" --effort {shlex.quote(reasoning_effort)}"
        env = dict(_QUIET_CLAUDE, **({"ANTHROPIC_BASE_URL": base_url} if base_url else {}))
        return AgentCommand(model, line, ("ANTHROPIC_API_KEY", *agent_env), env, "claude",
                            (f"anthropic:{rest}", base_url, "ANTHROPIC_API_KEY"), "messages")
    if preset == "codex":
        if turns is not None:
            raise ClientError("--turns does not apply to codex: (Codex CLI has no turn limit; its budget is wall "
                              "time and submissions): drop it")
        url = base_url or OPENAI_URL
        provider = f'{{name="mkb",base_url="{url}",env_key="OPENAI_API_KEY",wire_api="responses"}}'
        parts = ["codex", "exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
                 "--model", rest, "-c", "model_provider=mkb", "-c", f"model_providers.mkb={provider}",
                 "-c", "analytics.enabled=false", "-c", "check_for_update_on_startup=false"]
        if reasoning_effort is not None:
            parts += ["-c", f"model_reasoning_effort={reasoning_effort}"]
        line = shlex.join(parts) + ' "$(cat TASK.md)"'
        return AgentCommand(model, line, ("OPENAI_API_KEY", *agent_env), {}, "codex",
                            (f"openai:{rest}", url, "OPENAI_API_KEY"), "responses")
    used = set(_PLACEHOLDER.findall(rest))
    for option, value, name in (("--turns", turns, "turns"), ("--reasoning-effort", reasoning_effort,
                                                              "reasoning_effort"), ("--base-url", base_url, "base_url")):
        if value is not None and name not in used:
            raise ClientError(f"{option} does not reach a command: agent unless its command line holds {{{name}}}: "
                              f"put {{{name}}} where the agent takes it, or drop {option}")
    line = _PLACEHOLDER.sub(lambda m: shlex.quote(str(values[m.group(1)])), rest)
    label = "command:" + redact(rest, secret_values(agent_env), assignments=True)
    return AgentCommand(label, line, tuple(agent_env), {}, _program(line))
