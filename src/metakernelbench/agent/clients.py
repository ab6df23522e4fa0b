"""Model clients: one `complete(system, messages)` interface over the official OpenAI and Anthropic SDKs, chosen by a
model string, with one retry policy of our own (the SDKs' retries are off) and every failure a one-line fix.

`openai:MODEL` speaks chat.completions to api.openai.com or any OpenAI-compatible server (vLLM, SGLang, Ollama,
OpenRouter, DeepSeek), or the Responses API with `wire="responses"`; `anthropic:MODEL` speaks the Messages API;
`replay:DIR` plays recorded turns back offline. A reply whose server reports no cost is priced from the price table
(`agent.usage`); a model the table lacks has an unknown cost (None), never $0.
The SDKs are imported inside the client constructors, so this module imports on GPU nodes that lack them.

Retries: HTTP 408, 409, 429, 5xx, dropped connections, and bodies that are not JSON (a gateway's truncated or HTML
page) are retried with exponential backoff and jitter, or after Retry-After when the server sends one. A server that
is still failing after the last retry ends in a ClientError; so do, at once, rejected keys, unknown models, exhausted
credit and refused requests, which no retry can fix.
"""
from __future__ import annotations

import email.utils
import json
import os
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol
from urllib.parse import urlsplit

from metakernelbench.agent.usage import Prices

RETRY_BASE_S = 1.0
RETRY_CAP_S = 60.0
# Long outputs from slow self-hosted servers take many minutes; a shorter limit would cut them off and retry them.
REQUEST_TIMEOUT_S = 1800.0
PREFIXES = ("openai", "anthropic", "replay")

# How servers that answer 400 (not 404) word an unknown model: OpenRouter, DeepSeek, and the like.
_MODEL_NOT_FOUND = re.compile(r"model\W[^.]{0,80}?(not exist|not found)|not a valid model|"
                              r"(no such|unknown|invalid) model", re.IGNORECASE)


@dataclass(frozen=True)
class Sampling:
    """How a model samples; identical for every arm of a cell, and recorded with each trial."""

    temperature: float | None = None
    max_output_tokens: int = 16384
    # OpenAI: sent as `reasoning_effort`; Anthropic: adaptive thinking at this `output_config.effort`; replay: unused.
    reasoning_effort: str | None = None


@dataclass(frozen=True)
class Reply:
    """One model answer. `input_tokens` counts the whole prompt, cached part included; `cached_tokens` is that part.
    `latency_s` times the request that succeeded, not the backoff before it."""

    text: str
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    cost_usd: float | None
    latency_s: float
    model: str
    offline: bool = False


class ClientError(Exception):
    """A model call that cannot succeed as configured; the one-line message names the fix."""


class ModelClient(Protocol):
    spec: str
    sampling: Sampling

    def complete(self, system: str, messages: list[dict]) -> Reply: ...


def make_client(spec: str, sampling: Sampling = Sampling(), *, base_url: str | None = None,
                api_key: str | None = None, max_retries: int = 6, replay_dir: str | Path | None = None,
                sleep: Callable[[float], None] = time.sleep, prices: Prices = Prices(),
                wire: str = "chat") -> ModelClient:
    """The client for a model string. `replay_dir` anchors a relative `replay:DIR` (default: the working directory);
    `sleep` is how backoff waits (tests pass a recorder); `prices` prices replies; `wire` picks OpenAI's API."""
    prefix, _, name = spec.partition(":")
    if prefix not in PREFIXES or not name:
        raise ClientError(f"unknown model string '{spec}': use openai:MODEL, anthropic:MODEL or replay:DIR")
    if max_retries < 0:
        raise ClientError(f"max_retries is {max_retries}: pass 0 or more")
    if prefix == "replay":
        return ReplayClient(spec, sampling, Path(replay_dir or ".") / name)
    if prefix == "openai":
        return OpenAIClient(spec, sampling, name, base_url, api_key, max_retries, sleep, prices, wire)
    return AnthropicClient(spec, sampling, name, base_url, api_key, max_retries, sleep, prices)


def ping(client: ModelClient) -> None:
    """One tiny request, so a run learns that its model answers before its first trial; raises ClientError."""
    client.complete("", [{"role": "user", "content": "Reply with OK."}])


class ReplayClient:
    """Plays back DIR/turn_001.md, turn_002.md, ... one per call: trial loops run offline, without keys or network."""

    def __init__(self, spec: str, sampling: Sampling, directory: Path) -> None:
        if not directory.is_dir():
            raise ClientError(f"replay directory {directory} does not exist: pass replay:DIR with a folder holding "
                              "turn_001.md, turn_002.md, ...")
        self.spec, self.sampling, self.directory, self.turns_played = spec, sampling, directory, 0

    def complete(self, system: str, messages: list[dict]) -> Reply:
        started = time.monotonic()
        path = self.directory / f"turn_{self.turns_played + 1:03d}.md"
        if not path.is_file():
            raise ClientError(f"replay directory {self.directory} has no {path.name} (only {self.turns_played} "
                              "turns recorded): add the turn file or give the trial fewer turns")
        text = path.read_text()
        self.turns_played += 1
        return Reply(text=text, input_tokens=0, output_tokens=0, cached_tokens=0, cost_usd=None,
                     latency_s=time.monotonic() - started, model=self.spec, offline=True)


class _Retry(Exception):
    """A failure that may pass: retried by `_SDKClient.complete`, or turned into `what: fix` once retries run out."""

    def __init__(self, what: str, fix: str, retry_after: float | None = None) -> None:
        super().__init__(what)
        self.what, self.fix, self.retry_after = what, fix, retry_after


def backoff_s(attempt: int) -> float:
    """Exponential with jitter in [½, 1] of the step, so waits grow every retry until the cap yet never synchronise."""
    return min(RETRY_CAP_S, RETRY_BASE_S * 2 ** attempt) * random.uniform(0.5, 1.0)


def retry_after_s(headers) -> float | None:
    """The server's Retry-After (`retry-after-ms`, seconds, or an HTTP date), or None."""
    if headers is None:
        return None
    try:
        if headers.get("retry-after-ms"):
            return max(0.0, float(headers["retry-after-ms"]) / 1000)
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _error_object(body) -> dict:
    """The `{"message", "code", ...}` object of an error body, in OpenAI's, Anthropic's or OpenRouter's shape."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return body["error"]
    return body if isinstance(body, dict) else {"message": str(body or "")}


def _one_line(text, limit: int = 300) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= limit else text[:limit] + "..."


class _SDKClient:
    """What both SDK clients share: our retry loop around one request, and HTTP failures mapped to one-line fixes."""

    key_var: str  # where the key comes from, named in the fix for a rejected one
    api_name: str  # the wire format, named in the fix for a garbled answer

    def __init__(self, spec: str, sampling: Sampling, model: str, base_url: str, max_retries: int,
                 sleep: Callable[[float], None], prices: Prices) -> None:
        self.spec, self.sampling, self.model, self.base_url = spec, sampling, model, base_url
        self.max_retries, self.sleep, self.prices = max_retries, sleep, prices

    def _priced(self, reply: Reply) -> Reply:
        if reply.cost_usd is not None:
            return reply
        cost = self.prices.cost(self.model, reply.input_tokens, reply.cached_tokens, reply.output_tokens)
        return Reply(**{**reply.__dict__, "cost_usd": cost})

    def complete(self, system: str, messages: list[dict]) -> Reply:
        attempt = 0
        while True:
            try:
                return self._attempt(system, messages)
            except _Retry as failure:
                if attempt == self.max_retries:
                    tries = f"{attempt + 1} attempt" + ("s" if attempt else "")
                    raise ClientError(f"{failure.what} after {tries}: {failure.fix}") from failure
                self.sleep(backoff_s(attempt) if failure.retry_after is None else min(failure.retry_after, RETRY_CAP_S))
                attempt += 1

    def _attempt(self, system: str, messages: list[dict]) -> Reply:
        started = time.monotonic()
        try:
            text = self._send(system, messages)
        except self._sdk.APIStatusError as exc:
            raise self._http_failure(exc.status_code, _error_object(exc.body), exc.response.headers) from exc
        except self._sdk.APIConnectionError as exc:
            cause = exc.__cause__ or exc
            raise _Retry(f"cannot reach {self.base_url} ({_one_line(cause, 120) or type(cause).__name__})",
                         "check that the server is up and the base URL is right") from exc
        latency = time.monotonic() - started
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise _Retry(f"{self.base_url} answered with no JSON object ({_one_line(text, 80)!r})",
                         f"check that the base URL points at the {self.api_name} API")
        return self._priced(self._reply(body, latency))

    def _http_failure(self, status: int, error: dict, headers) -> Exception:
        """The exception for an HTTP error: `_Retry` where waiting may help, else the `ClientError` naming the fix."""
        message, code = _one_line(error.get("message")), str(error.get("code") or error.get("type") or "")
        where = f"{self.spec} at {self.base_url}"
        if status in (401, 403):
            return ClientError(f"{where} rejected the API key (HTTP {status}: {message}): set {self.key_var} to a "
                               "valid key or pass api_key")
        if status == 402 or code == "insufficient_quota":
            return ClientError(f"{where} refused for lack of credit (HTTP {status}: {message}): add credit to the "
                               "account")
        if status == 404 or (status == 400 and (code == "model_not_found" or _MODEL_NOT_FOUND.search(message))):
            return ClientError(f"unknown model '{self.model}' at {self.base_url}: check the model name "
                               f"(server said: {message or f'HTTP {status}'})")
        if status in (408, 409, 429) or status >= 500:
            return _Retry(f"{where} kept failing (HTTP {status}: {message})",
                          "wait and rerun, or lower the request rate" if status == 429 else "check the server",
                          retry_after_s(headers))
        return ClientError(f"{where} refused the request (HTTP {status}: {message}): change what the server names "
                           "(sampling options, prompt length)")


class OpenAIClient(_SDKClient):
    """chat.completions (or, with wire "responses", the Responses API) through the official `openai` SDK, for OpenAI
    and every OpenAI-compatible server."""

    key_var = "OPENAI_API_KEY"

    def __init__(self, spec: str, sampling: Sampling, model: str, base_url: str | None, api_key: str | None,
                 max_retries: int, sleep: Callable[[float], None], prices: Prices = Prices(),
                 wire: str = "chat") -> None:
        if wire not in ("chat", "responses"):
            raise ClientError(f"unknown OpenAI wire '{wire}': use chat or responses")
        self.wire = wire
        self.api_name = "OpenAI chat.completions" if wire == "chat" else "OpenAI Responses"
        try:
            import openai
        except ImportError:
            raise ClientError(f"{spec} needs the openai SDK: pip install openai") from None
        custom = base_url or os.environ.get("OPENAI_BASE_URL")
        key = api_key or os.environ.get("OPENAI_API_KEY") or ("EMPTY" if custom else None)
        if key is None:
            raise ClientError(f"{spec} needs an API key: set OPENAI_API_KEY (or OPENAI_BASE_URL for a local server)")
        super().__init__(spec, sampling, model, custom or "https://api.openai.com/v1", max_retries, sleep, prices)
        self._sdk = openai
        self._client = openai.OpenAI(api_key=key, base_url=self.base_url, max_retries=0, timeout=REQUEST_TIMEOUT_S)
        # api.openai.com refuses max_tokens for reasoning models; compatible servers all read max_tokens, while
        # some ignore max_completion_tokens and would silently fall back to their own short default.
        official = urlsplit(self.base_url).hostname == "api.openai.com"
        self._limit = {"max_completion_tokens" if official else "max_tokens": sampling.max_output_tokens}

    def _send(self, system: str, messages: list[dict]) -> str:
        if self.wire == "responses":
            return self._send_responses(system, messages)
        options = dict(self._limit)
        if self.sampling.temperature is not None:
            options["temperature"] = self.sampling.temperature
        if self.sampling.reasoning_effort is not None:
            options["reasoning_effort"] = self.sampling.reasoning_effort
        prompt = [{"role": "system", "content": system}] if system else []
        raw = self._client.chat.completions.with_raw_response.create(model=self.model, messages=prompt + messages,
                                                                     **options)
        return raw.http_response.text

    def _send_responses(self, system: str, messages: list[dict]) -> str:
        options = {"max_output_tokens": self.sampling.max_output_tokens}
        if system:
            options["instructions"] = system
        if self.sampling.temperature is not None:
            options["temperature"] = self.sampling.temperature
        if self.sampling.reasoning_effort is not None:
            options["reasoning"] = {"effort": self.sampling.reasoning_effort}
        raw = self._client.responses.with_raw_response.create(model=self.model, input=messages, **options)
        return raw.http_response.text

    def _reply(self, body: dict, latency: float) -> Reply:
        if self.wire == "responses":
            text = "".join(part.get("text") or "" for item in body.get("output") or [] if isinstance(item, dict)
                           and item.get("type") == "message" for part in item.get("content") or []
                           if isinstance(part, dict) and part.get("type") == "output_text")
            usage = body.get("usage") or {}
            return Reply(text=text, input_tokens=usage.get("input_tokens") or 0,
                         output_tokens=usage.get("output_tokens") or 0,
                         cached_tokens=(usage.get("input_tokens_details") or {}).get("cached_tokens") or 0,
                         cost_usd=None, latency_s=latency, model=body.get("model") or self.model)
        choices = body.get("choices") or []
        if not choices and body.get("error"):
            # OpenRouter reports an upstream failure that began after its 200 header inside the body instead.
            error = _error_object(body)
            status = error.get("code") if isinstance(error.get("code"), int) else 502
            raise self._http_failure(status, error, None)
        content = (choices[0].get("message") or {}).get("content") if choices else None
        usage = body.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or usage.get("prompt_cache_hit_tokens")
        cost = usage.get("cost")
        return Reply(text=content if isinstance(content, str) else "", input_tokens=usage.get("prompt_tokens") or 0,
                     output_tokens=usage.get("completion_tokens") or 0, cached_tokens=cached or 0,
                     cost_usd=float(cost) if isinstance(cost, (int, float)) else None, latency_s=latency,
                     model=body.get("model") or self.model)


class AnthropicClient(_SDKClient):
    """The Messages API through the official `anthropic` SDK."""

    key_var, api_name = "ANTHROPIC_API_KEY", "Anthropic Messages"

    def __init__(self, spec: str, sampling: Sampling, model: str, base_url: str | None, api_key: str | None,
                 max_retries: int, sleep: Callable[[float], None], prices: Prices = Prices()) -> None:
        try:
            import anthropic
        except ImportError:
            raise ClientError(f"{spec} needs the anthropic SDK: pip install anthropic") from None
        custom = base_url or os.environ.get("ANTHROPIC_BASE_URL")
        key = api_key or os.environ.get("ANTHROPIC_API_KEY") or ("EMPTY" if custom else None)
        if key is None:
            raise ClientError(f"{spec} needs an API key: set ANTHROPIC_API_KEY")
        if sampling.temperature is not None:
            # Anthropic API version 2026-10-21, which this SDK sends, answers 400 to any sampling parameter.
            raise ClientError(f"{spec} takes no temperature (the Anthropic API removed it): drop temperature")
        super().__init__(spec, sampling, model, custom or "https://api.anthropic.com", max_retries, sleep, prices)
        self._sdk = anthropic
        # An explicit timeout also lifts the SDK's refusal of long non-streaming requests (max_tokens above ~21k).
        self._client = anthropic.Anthropic(api_key=key, base_url=self.base_url, max_retries=0,
                                           timeout=REQUEST_TIMEOUT_S)

    def _send(self, system: str, messages: list[dict]) -> str:
        options = {}
        if system:
            options["system"] = system
        if self.sampling.reasoning_effort is not None:
            # Current Claude models refuse a fixed thinking budget (type "enabled"); adaptive thinking takes an effort.
            options["thinking"] = {"type": "adaptive"}
            options["output_config"] = {"effort": self.sampling.reasoning_effort}
        # A cache breakpoint on the newest turn: each call of a growing conversation rereads the previous prefix.
        *earlier, last = messages
        marked = {"role": last["role"], "content": [{"type": "text", "text": last["content"],
                                                     "cache_control": {"type": "ephemeral"}}]}
        raw = self._client.messages.with_raw_response.create(model=self.model, messages=[*earlier, marked],
                                                             max_tokens=self.sampling.max_output_tokens, **options)
        return raw.http_response.text

    def _reply(self, body: dict, latency: float) -> Reply:
        text = "".join(block.get("text") or "" for block in body.get("content") or []
                       if isinstance(block, dict) and block.get("type") == "text")
        usage = body.get("usage") or {}
        cached = usage.get("cache_read_input_tokens") or 0
        prompt = (usage.get("input_tokens") or 0) + cached + (usage.get("cache_creation_input_tokens") or 0)
        return Reply(text=text, input_tokens=prompt, output_tokens=usage.get("output_tokens") or 0,
                     cached_tokens=cached, cost_usd=None, latency_s=latency, model=body.get("model") or self.model)
