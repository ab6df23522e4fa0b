"""Agent presets, secret redaction, the CLIs' usage reports and the price table: what a trial runs, what it records
and what it costs, checked without running any agent."""
import json
import shlex

import pytest

from metakernelbench.agent.clients import ClientError
from metakernelbench.agent.presets import agent_command
from metakernelbench.agent.secrets import REDACTED, redact
from metakernelbench.agent.usage import PRICES, PriceError, Prices, cli_report
from metakernelbench.protocol import Budget, plan, worst_case

BUDGET = Budget(submissions=7, turns=12, output_tokens=1000, wall_s=900)


def test_claude_code_preset_runs_non_interactively_with_its_key_by_name():
    agent = agent_command("claude-code:claude-sonnet-4-5", BUDGET, base_url="http://127.0.0.1:9", turns=12,
                          reasoning_effort="high")
    words = shlex.split(agent.command)
    assert words[:2] == ["claude", "-p"] and "--dangerously-skip-permissions" in words
    assert words[words.index("--output-format") + 1] == "json" and words[words.index("--max-turns") + 1] == "12"
    assert words[words.index("--effort") + 1] == "high" and words[words.index("--model") + 1] == "claude-sonnet-4-5"
    assert agent.env_keys == ("ANTHROPIC_API_KEY",) and agent.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9"
    assert agent.env["DISABLE_TELEMETRY"] == agent.env["DISABLE_AUTOUPDATER"] == "1"
    assert agent.program == "claude" and agent.api == ("anthropic:claude-sonnet-4-5", "http://127.0.0.1:9",
                                                       "ANTHROPIC_API_KEY")
    assert "--max-turns" not in agent_command("claude-code:m", BUDGET).command  # only when --turns was given


def test_codex_preset_configures_its_own_provider_and_bypasses_its_nested_sandbox():
    agent = agent_command("codex:gpt-5", BUDGET, base_url="http://127.0.0.1:9/v1", agent_env=("EXTRA",))
    words = shlex.split(agent.command)
    assert words[:3] == ["codex", "exec", "--json"] and "--dangerously-bypass-approvals-and-sandbox" in words
    assert "model_provider=mkb" in words and "analytics.enabled=false" in words
    provider = next(w for w in words if w.startswith("model_providers.mkb="))
    assert 'base_url="http://127.0.0.1:9/v1"' in provider and 'env_key="OPENAI_API_KEY"' in provider
    assert agent.env_keys == ("OPENAI_API_KEY", "EXTRA") and agent.wire == "responses"
    assert 'base_url="https://api.openai.com/v1"' in agent_command("codex:gpt-5", BUDGET).command


def test_command_placeholders_take_the_budget():
    agent = agent_command("command:my-agent --max-turns {turns} --timeout {wall_s} --submits {submissions} "
                          "--url {base_url}", BUDGET, turns=12, base_url="http://h:1")
    assert agent.command == "my-agent --max-turns 12 --timeout 900 --submits 7 --url http://h:1"
    assert agent.program == "my-agent" and agent.label.startswith("command:my-agent --max-turns {turns}")
    assert agent_command("command:FOO=1 BAR=2 tool -x", BUDGET).program == "tool"


@pytest.mark.parametrize("model, options, fix", [
    ("command:agent", {"temperature": 0.2}, "--temperature does not apply"),
    ("claude-code:m", {"max_output_tokens": 100}, "--max-output-tokens does not apply"),
    ("codex:m", {"output_tokens": 100}, "--output-tokens does not apply"),
    ("codex:m", {"turns": 5}, "--turns does not apply to codex"),
    ("command:agent", {"turns": 5}, "holds {turns}"),
    ("command:agent", {"reasoning_effort": "high"}, "holds {reasoning_effort}"),
    ("command:agent", {"base_url": "http://h"}, "holds {base_url}"),
    ("claude-code:", {}, "names nothing"),
])
def test_options_an_agent_cannot_honour_are_refused(model, options, fix):
    with pytest.raises(ClientError, match=fix.replace("{", r"\{").replace("}", r"\}")):
        agent_command(model, BUDGET, **options)


def test_keys_in_a_command_line_and_agent_variables_are_redacted(monkeypatch):
    monkeypatch.setenv("MY_AGENT_SECRET", "correct-horse-battery")
    agent = agent_command("command:agent --api-key sk-abcdefghijklmnop123 --pass correct-horse-battery", BUDGET,
                          agent_env=("MY_AGENT_SECRET",))
    assert "sk-abcdefghijklmnop123" in agent.command  # the agent still gets what it was given
    assert agent.label == f"command:agent --api-key {REDACTED} --pass {REDACTED}"
    assert agent.secrets() == ["correct-horse-battery"]
    text = ("Authorization: Bearer abc.def.ghi123 OPENAI_API_KEY=plainvalue123456 token=$TOKEN "
            "--max-tokens 400000 ghp_" + "a" * 36)
    assert redact(text, assignments=True) == (f"Authorization: Bearer {REDACTED} OPENAI_API_KEY={REDACTED} "
                                              f"token=$TOKEN --max-tokens 400000 {REDACTED}")
    code = "num_tokens = hidden_states.shape[0]\nkey = 'sk-abcdefghijklmnop123'"
    assert redact(code) == f"num_tokens = hidden_states.shape[0]\nkey = '{REDACTED}'"  # code keeps its names


def test_claude_code_report_gives_usage_cost_and_errors():
    result = {"type": "result", "subtype": "success", "is_error": False, "num_turns": 3, "total_cost_usd": 0.0227,
              "usage": {"input_tokens": 3000, "cache_read_input_tokens": 600, "cache_creation_input_tokens": 100,
                        "output_tokens": 900}, "permission_denials": []}
    report = cli_report("some log line\n" + json.dumps(result) + "\n")
    assert (report.input_tokens, report.cached_tokens, report.output_tokens) == (3700, 600, 900)
    assert report.cost_usd == 0.0227 and report.turns == 3 and report.error is None
    failed = cli_report(json.dumps({**result, "is_error": True, "result": "Not logged in · Please run /login"}))
    assert failed.error == "Not logged in · Please run /login"
    capped = cli_report(json.dumps({**result, "is_error": True, "subtype": "error_max_turns"}))
    assert capped.error is None and capped.max_turns
    refused = cli_report(json.dumps({**result, "permission_denials": [{"tool_name": "Bash"}] * 2}))
    assert refused.permission_denials == 2


def test_codex_events_give_usage_and_only_final_errors():
    turn = {"type": "turn.completed", "usage": {"input_tokens": 3600, "cached_input_tokens": 600,
                                                "output_tokens": 900}}
    retried = "\n".join(json.dumps(e) for e in [{"type": "thread.started"}, {"type": "error", "message": "Reconnecting"
                                                                             "... 1/5"}, turn, turn])
    report = cli_report(retried)
    assert (report.input_tokens, report.cached_tokens, report.output_tokens, report.cost_usd) == (7200, 1200, 1800,
                                                                                                 None)
    assert report.error is None  # a retry that recovered is no failure
    failed = cli_report(json.dumps({"type": "turn.failed", "error": {"message": "401 Unauthorized"}}))
    assert failed.error == "401 Unauthorized"
    assert cli_report("plain text only\n{not json}") is None


def test_prices_cover_dated_names_extend_from_a_file_and_never_invent_a_cost(tmp_path):
    prices = Prices()
    gpt5 = PRICES["gpt-5"]
    assert prices.cost("openai:gpt-5", 1000, 200, 100) == pytest.approx(
        (800 * gpt5["input"] + 200 * gpt5["cached_input"] + 100 * gpt5["output"]) / 1e6)
    assert prices.price("claude-sonnet-4-5-20250929") == PRICES["claude-sonnet-4-5"]
    assert prices.cost("my-local-model", 10, 0, 10) is None
    extra = tmp_path / "prices.json"
    extra.write_text(json.dumps({"my-local-model": {"input": 1, "output": 2}}))
    assert Prices.with_file(extra).cost("my-local-model", 1_000_000, 0, 1_000_000) == 3.0
    extra.write_text(json.dumps({"m": {"input": "cheap"}}))
    with pytest.raises(PriceError, match="numeric input and output"):
        Prices.with_file(extra)


def test_worst_case_bounds_tokens_cost_and_wall_time():
    specs = plan("r", "m", ["a", "b"], ["cute", "tirx"], ["solo", "skill"], budget=BUDGET)  # 8 solo, 4 skill
    worst = worst_case(specs, concurrency=4, prompt_tokens=100, max_output_tokens=300, feedback_tokens=10,
                       price={"input": 1.0, "output": 2.0})
    # per trial: 12 turns capped at 1000 + 300 output, then a 300-token distillation
    assert worst.output_tokens == 12 * (1300 + 300)
    per_trial_input = sum(100 + min(k * 300, 1300) + 10 * k for k in range(13))
    assert worst.input_tokens == 12 * per_trial_input
    assert worst.cost_usd == pytest.approx((worst.input_tokens * 1 + worst.output_tokens * 2) / 1e6)
    assert worst.wall_s == (2 + 1) * 900  # two waves of solo trials, one of skill trials
    command = worst_case(specs, 4, 100, None)
    assert command.output_tokens is None and command.cost_usd is None and command.wall_s == 2700


@pytest.mark.parametrize("model, wire, suffix", [("openai:gpt-5", "responses", "/v1"), ("openai:gpt-5", "chat", "/v1"),
                                                 ("anthropic:claude-sonnet-4-5", "chat", "")])
def test_api_replies_are_priced_from_the_table_and_a_bad_key_is_one_line(model, wire, suffix):
    from loopback_model import CACHED_TOKENS, INPUT_TOKENS, OUTPUT_TOKENS, LoopbackModel, Script
    from metakernelbench.agent.clients import Sampling, make_client, ping

    with LoopbackModel(Script([])) as server:
        client = make_client(model, Sampling(max_output_tokens=16), base_url=server.url + suffix, wire=wire,
                             api_key="sk-loopback-test-key", max_retries=0)
        reply = client.complete("", [{"role": "user", "content": "Reply with OK."}])
        assert reply.text == "OK" and reply.output_tokens == OUTPUT_TOKENS and reply.cached_tokens == CACHED_TOKENS
        assert reply.cost_usd == pytest.approx(Prices().cost(model, INPUT_TOKENS, CACHED_TOKENS, OUTPUT_TOKENS))
        wrong = make_client(model, Sampling(max_output_tokens=16), base_url=server.url + suffix, wire=wire,
                            api_key="sk-wrong-key-0123456789", max_retries=0)
        with pytest.raises(ClientError, match="rejected the API key"):
            ping(wrong)
