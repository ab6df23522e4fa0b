"""Model clients against real loopback HTTP servers speaking the OpenAI and Anthropic wire formats: replies parsed,
our retry policy (attempt counts, growing waits, Retry-After), and every failure a one-line ClientError naming a fix."""
import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from metakernelbench.agent.clients import ClientError, Sampling, make_client, retry_after_s

SYSTEM = "You write kernels."
MESSAGES = [{"role": "user", "content": "Write a kernel."}, {"role": "assistant", "content": "```python\npass```"},
            {"role": "user", "content": "## Verdict\npassed: False"}]


class Wire:
    """A loopback server: answers each POST with the next scripted (status, headers, body, delay); keeps requests."""

    def __init__(self) -> None:
        self.script, self.requests = [], []
        wire = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                headers = {name.lower(): value for name, value in self.headers.items()}
                wire.requests.append({"path": self.path, "headers": headers, "json": body})
                status, headers, payload, delay = wire.script.pop(0)
                time.sleep(delay)
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True).start()

    def then(self, status: int, payload, headers: dict | None = None, delay: float = 0.0) -> "Wire":
        self.script.append((status, headers or {}, payload, delay))
        return self


class OpenAIWire:
    prefix, key_var = "openai", "OPENAI_API_KEY"

    @staticmethod
    def base_url(wire):
        return wire.url + "/v1"

    @staticmethod
    def ok(text="Here it is.", model="served/model-v2"):
        return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1200, "completion_tokens": 300, "total_tokens": 1500,
                          "prompt_tokens_details": {"cached_tokens": 1000}, "cost": 0.0042}}

    @staticmethod
    def error(message, kind="server_error", code=None):
        return {"error": {"message": message, "type": kind, "code": code}}


class AnthropicWire:
    prefix, key_var = "anthropic", "ANTHROPIC_API_KEY"

    @staticmethod
    def base_url(wire):
        return wire.url

    @staticmethod
    def ok(text="Here it is.", model="claude-served-v2"):
        blocks = [{"type": "thinking", "thinking": "hmm", "signature": "sig"}] if text else []
        if text:
            blocks += [{"type": "text", "text": text[:4]}, {"type": "text", "text": text[4:]}]
        return {"id": "msg_1", "type": "message", "role": "assistant", "model": model, "content": blocks,
                "stop_reason": "end_turn", "usage": {"input_tokens": 150, "output_tokens": 300,
                                                     "cache_read_input_tokens": 1000,
                                                     "cache_creation_input_tokens": 50}}

    @staticmethod
    def error(message, kind="api_error", code=None):
        return {"type": "error", "error": {"type": kind, "message": message}}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN",
                 "ANTHROPIC_PROFILE", "ANTHROPIC_CUSTOM_HEADERS", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
                 "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def wire():
    server = Wire()
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture(params=[OpenAIWire, AnthropicWire], ids=["openai", "anthropic"])
def api(request):
    return request.param


def client_for(api, wire, sampling=Sampling(), **kwargs):
    sleeps = []
    kwargs.setdefault("api_key", "sk-test")
    client = make_client(f"{api.prefix}:test-model", sampling, base_url=api.base_url(wire), sleep=sleeps.append,
                         **kwargs)
    return client, sleeps


def one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message and ": " in message
    return message


def test_normal_reply_is_parsed_and_the_request_carries_prompt_and_sampling(api, wire):
    wire.then(200, api.ok("Here it is."), delay=0.1)
    temperature = 0.3 if api is OpenAIWire else None  # the Anthropic API takes none
    client, sleeps = client_for(api, wire, Sampling(temperature=temperature, max_output_tokens=2048))
    reply = client.complete(SYSTEM, MESSAGES)
    assert reply.text == "Here it is." and reply.output_tokens == 300 and not reply.offline
    assert reply.cached_tokens == 1000 and reply.input_tokens == 1200  # the whole prompt, cached part included
    assert 0.1 <= reply.latency_s < 5 and sleeps == []
    sent, (request,) = request_of(wire), wire.requests
    assert request["headers"]["authorization"] == "Bearer sk-test"
    assert sent["model"] == "test-model" and sent["max_tokens"] == 2048 and sent.get("temperature") == temperature
    if api is OpenAIWire:
        assert request["path"] == "/v1/chat/completions" and "reasoning_effort" not in sent
        assert sent["messages"] == [{"role": "system", "content": SYSTEM}, *MESSAGES]
        assert reply.model == "served/model-v2" and reply.cost_usd == pytest.approx(0.0042)
    else:
        assert request["path"] == "/v1/messages" and "thinking" not in sent and "output_config" not in sent
        assert sent["system"] == SYSTEM and sent["messages"][:-1] == MESSAGES[:-1]
        assert sent["messages"][-1] == {"role": "user", "content": [
            {"type": "text", "text": MESSAGES[-1]["content"], "cache_control": {"type": "ephemeral"}}]}
        assert reply.model == "claude-served-v2" and reply.cost_usd is None


def request_of(wire, index=-1) -> dict:
    return wire.requests[index]["json"]


def test_rate_limit_storm_backs_off_growing_then_honours_retry_after(api, wire):
    for _ in range(3):
        wire.then(429, api.error("Rate limit reached", "rate_limit_error"))
    wire.then(429, api.error("Rate limit reached", "rate_limit_error"), {"retry-after": "7"})
    wire.then(200, api.ok("finally"))
    client, sleeps = client_for(api, wire)
    assert client.complete(SYSTEM, MESSAGES).text == "finally"
    assert len(wire.requests) == 5 and len(sleeps) == 4
    first, second, third, told = sleeps
    assert 0.5 <= first <= 1 <= second <= 2 <= third <= 4 and first < second < third
    assert told == 7.0


def test_server_error_then_success(api, wire):
    wire.then(500, api.error("internal error")).then(200, api.ok("recovered"))
    client, sleeps = client_for(api, wire)
    assert client.complete(SYSTEM, MESSAGES).text == "recovered"
    assert len(wire.requests) == 2 and len(sleeps) == 1


def test_rate_limit_that_never_ends_is_a_client_error_after_max_retries(api, wire):
    for _ in range(3):
        wire.then(429, api.error("Rate limit reached", "rate_limit_error"), {"retry-after": "120"})
    client, sleeps = client_for(api, wire, max_retries=2)
    with pytest.raises(ClientError) as caught:
        client.complete(SYSTEM, MESSAGES)
    assert "HTTP 429" in one_line(caught) and "after 3 attempts" in str(caught.value)
    assert sleeps == [60.0, 60.0]  # Retry-After honoured up to the cap
    assert len(wire.requests) == 3


def test_rejected_key_names_the_variable_without_retrying(api, wire):
    wire.then(401, api.error("Incorrect API key provided", "authentication_error"))
    client, sleeps = client_for(api, wire)
    with pytest.raises(ClientError) as caught:
        client.complete(SYSTEM, MESSAGES)
    assert "rejected the API key" in one_line(caught) and f"set {api.key_var}" in str(caught.value)
    assert len(wire.requests) == 1 and sleeps == []


def test_unknown_model_names_model_and_server(api, wire):
    wire.then(404, api.error("The model `test-model` does not exist", "not_found_error", "model_not_found"))
    client, sleeps = client_for(api, wire)
    with pytest.raises(ClientError) as caught:
        client.complete(SYSTEM, MESSAGES)
    assert one_line(caught).startswith(f"unknown model 'test-model' at {api.base_url(wire)}: check the model name")
    assert len(wire.requests) == 1 and sleeps == []


def test_unknown_model_reported_as_bad_request_is_recognised(wire):
    wire.then(400, OpenAIWire.error("test-model is not a valid model ID", "invalid_request_error"))
    client, _ = client_for(OpenAIWire, wire)
    with pytest.raises(ClientError, match="^unknown model 'test-model'"):
        client.complete(SYSTEM, MESSAGES)


def test_other_bad_request_is_not_retried_and_quotes_the_server(wire):
    wire.then(400, OpenAIWire.error("Unsupported parameter: 'temperature'", "invalid_request_error"))
    client, sleeps = client_for(OpenAIWire, wire, Sampling(temperature=0.5))
    with pytest.raises(ClientError) as caught:
        client.complete(SYSTEM, MESSAGES)
    assert "Unsupported parameter: 'temperature'" in one_line(caught) and sleeps == []


def test_malformed_json_is_retried_then_reported(api, wire):
    """Decision: a body that is not JSON (a gateway's truncated or HTML page) is treated as transient and retried;
    if it persists, the ClientError points at the base URL."""
    wire.then(200, '{"choices": [{"mess').then(200, api.ok("second time lucky"))
    client, sleeps = client_for(api, wire)
    assert client.complete(SYSTEM, MESSAGES).text == "second time lucky" and len(sleeps) == 1
    for _ in range(3):
        wire.then(200, "<html>Bad gateway</html>")
    client, sleeps = client_for(api, wire, max_retries=2)
    with pytest.raises(ClientError) as caught:
        client.complete(SYSTEM, MESSAGES)
    assert "no JSON object" in one_line(caught) and "check that the base URL points at" in str(caught.value)
    assert len(sleeps) == 2 and len(wire.requests) == 2 + 3


def test_empty_answer_is_an_empty_reply_not_an_error(api, wire):
    body = api.ok("")
    if api is OpenAIWire:
        body["choices"][0]["message"]["content"] = None
    wire.then(200, body)
    client, _ = client_for(api, wire)
    reply = client.complete(SYSTEM, MESSAGES)
    assert reply.text == "" and reply.output_tokens == 300


def test_openrouter_error_inside_a_200_body_is_retried(wire):
    wire.then(200, {"error": {"code": 502, "message": "Upstream provider failed"}}).then(200, OpenAIWire.ok("ok"))
    client, sleeps = client_for(OpenAIWire, wire)
    assert client.complete(SYSTEM, MESSAGES).text == "ok" and len(sleeps) == 1


def test_out_of_credit_is_not_retried(wire):
    wire.then(429, OpenAIWire.error("You exceeded your current quota", "insufficient_quota", "insufficient_quota"))
    client, sleeps = client_for(OpenAIWire, wire)
    with pytest.raises(ClientError, match="add credit"):
        client.complete(SYSTEM, MESSAGES)
    assert sleeps == []


def test_connection_refused_is_a_client_error_after_retries(api):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base_url = f"http://127.0.0.1:{port}" + ("/v1" if api is OpenAIWire else "")
    sleeps = []
    client = make_client(f"{api.prefix}:test-model", base_url=base_url, api_key="k", max_retries=3,
                         sleep=sleeps.append)
    with pytest.raises(ClientError) as caught:
        client.complete(SYSTEM, MESSAGES)
    assert one_line(caught).startswith(f"cannot reach {base_url}") and "after 4 attempts" in str(caught.value)
    assert len(sleeps) == 3 and sleeps == sorted(sleeps)


def test_reasoning_effort_reaches_each_api(wire):
    wire.then(200, OpenAIWire.ok())
    client, _ = client_for(OpenAIWire, wire, Sampling(reasoning_effort="high"))
    client.complete(SYSTEM, MESSAGES)
    assert request_of(wire)["reasoning_effort"] == "high" and "temperature" not in request_of(wire)
    wire.then(200, AnthropicWire.ok())
    client, _ = client_for(AnthropicWire, wire, Sampling(reasoning_effort="medium"))
    assert client.complete(SYSTEM, MESSAGES).text == "Here it is."  # the thinking block is not part of the text
    assert request_of(wire)["thinking"] == {"type": "adaptive"}
    assert request_of(wire)["output_config"] == {"effort": "medium"}


def test_anthropic_temperature_fails_before_any_request():
    with pytest.raises(ClientError, match="takes no temperature.*: drop temperature$"):
        make_client("anthropic:claude-test", Sampling(temperature=0.7), api_key="k")


def test_missing_key_names_the_variable_unless_the_server_is_local(wire):
    with pytest.raises(ClientError, match="set OPENAI_API_KEY"):
        make_client("openai:gpt-test")
    with pytest.raises(ClientError, match="set ANTHROPIC_API_KEY"):
        make_client("anthropic:claude-test")
    wire.then(200, OpenAIWire.ok())
    client, _ = client_for(OpenAIWire, wire, api_key=None)
    client.complete(SYSTEM, MESSAGES)
    assert wire.requests[0]["headers"]["authorization"] == "Bearer EMPTY"


def test_environment_supplies_key_and_base_url(wire, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", wire.url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    wire.then(200, OpenAIWire.ok())
    make_client("openai:qwen3:32b").complete(SYSTEM, MESSAGES)
    assert wire.requests[0]["headers"]["authorization"] == "Bearer sk-env"
    assert request_of(wire)["model"] == "qwen3:32b"  # only the first colon separates the prefix


def test_replay_plays_turns_in_order_then_names_the_missing_file(tmp_path):
    (tmp_path / "rec").mkdir()
    for n, text in enumerate(["first answer", "second answer"], start=1):
        (tmp_path / "rec" / f"turn_{n:03d}.md").write_text(text)
    client = make_client("replay:rec", Sampling(reasoning_effort="high"), replay_dir=tmp_path)
    replies = [client.complete(SYSTEM, MESSAGES) for _ in range(2)]
    assert [r.text for r in replies] == ["first answer", "second answer"]
    assert all(r.offline and r.model == "replay:rec" and r.cost_usd is None for r in replies)
    with pytest.raises(ClientError) as caught:
        client.complete(SYSTEM, MESSAGES)
    assert "turn_003.md" in one_line(caught) and str(tmp_path / "rec") in str(caught.value)
    with pytest.raises(ClientError, match="does not exist"):
        make_client(f"replay:{tmp_path / 'nowhere'}")


@pytest.mark.parametrize("spec", ["foo:bar", "gpt-4o", "openai:"])
def test_unknown_prefix_lists_the_valid_ones(spec):
    with pytest.raises(ClientError, match="use openai:MODEL, anthropic:MODEL or replay:DIR"):
        make_client(spec)


def test_retry_after_forms():
    assert retry_after_s({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # a date in the past: go now
    assert retry_after_s({"retry-after": "soon"}) is None and retry_after_s({}) is None


def test_package_imports_and_replays_without_the_sdks(tmp_path, monkeypatch):
    code = ("import sys; sys.modules['openai'] = sys.modules['anthropic'] = None\n"
            "from metakernelbench.agent.clients import ClientError, make_client\n"
            f"make_client('replay:{tmp_path}')\n"
            "try:\n    make_client('openai:x', api_key='k')\nexcept ClientError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": ":".join(sys.path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "openai:x needs the openai SDK: pip install openai"
