"""What a trial's model use cost: a price table for API clients (extendable with `--prices FILE`), and the usage and
errors that coding-agent CLIs report in their JSON output modes (Claude Code's `--output-format json` result,
Codex's `exec --json` events).

PRICES is in USD per million tokens, as the providers listed them in late 2025 (check before relying on them):
`input` for uncached prompt tokens, `cached_input` for prompt tokens read from the provider's cache, `output` for
completion tokens (reasoning included). Cache writes are priced as input. A model is found by its exact name, or by
its name without a date suffix (`claude-sonnet-4-5-20250929` is `claude-sonnet-4-5`); an unknown model's cost is
unknown (None), never $0.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

PRICES: dict[str, dict[str, float]] = {
    "gpt-5": {"input": 1.25, "cached_input": 0.125, "output": 10.0},
    "gpt-5-codex": {"input": 1.25, "cached_input": 0.125, "output": 10.0},
    "gpt-5.1": {"input": 1.25, "cached_input": 0.125, "output": 10.0},
    "gpt-5-mini": {"input": 0.25, "cached_input": 0.025, "output": 2.0},
    "gpt-5-nano": {"input": 0.05, "cached_input": 0.005, "output": 0.4},
    "gpt-4.1": {"input": 2.0, "cached_input": 0.5, "output": 8.0},
    "o3": {"input": 2.0, "cached_input": 0.5, "output": 8.0},
    "claude-opus-4-5": {"input": 5.0, "cached_input": 0.5, "output": 25.0},
    "claude-opus-4-1": {"input": 15.0, "cached_input": 1.5, "output": 75.0},
    "claude-sonnet-4-5": {"input": 3.0, "cached_input": 0.3, "output": 15.0},
    "claude-sonnet-4": {"input": 3.0, "cached_input": 0.3, "output": 15.0},
    "claude-haiku-4-5": {"input": 1.0, "cached_input": 0.1, "output": 5.0},
    "deepseek-chat": {"input": 0.28, "cached_input": 0.028, "output": 0.42},
}
_DATE_SUFFIX = re.compile(r"-(\d{8}|\d{4}-\d{2}-\d{2})$")


class PriceError(Exception):
    """A price file that cannot be read; the message names the fix."""


@dataclass(frozen=True)
class Prices:
    """The price table in force: PRICES with a user's file laid over it."""

    table: dict = field(default_factory=lambda: dict(PRICES))

    @classmethod
    def with_file(cls, path: Path | None) -> "Prices":
        """PRICES extended by `path`: JSON `{"MODEL": {"input": USD, "cached_input": USD, "output": USD}}` per
        million tokens (`cached_input` defaults to `input`)."""
        if path is None:
            return cls()
        try:
            extra = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise PriceError(f"cannot read prices from {path} ({exc}): pass a JSON file of "
                             '{"MODEL": {"input": USD, "output": USD}} per million tokens') from None
        table = dict(PRICES)
        for model, price in (extra.items() if isinstance(extra, dict) else [(None, None)]):
            if not isinstance(price, dict) or not all(isinstance(price.get(k), (int, float))
                                                      for k in ("input", "output")):
                raise PriceError(f"{path}: the price of {model!r} needs numeric input and output (USD per million "
                                 'tokens), e.g. {"input": 3, "cached_input": 0.3, "output": 15}')
            table[model] = {"input": float(price["input"]), "output": float(price["output"]),
                            "cached_input": float(price.get("cached_input", price["input"]))}
        return cls(table)

    def price(self, model: str) -> dict | None:
        name = model.partition(":")[2] if ":" in model else model
        return self.table.get(name) or self.table.get(_DATE_SUFFIX.sub("", name))

    def cost(self, model: str, input_tokens: int, cached_tokens: int, output_tokens: int) -> float | None:
        """USD for one use of `model`; `input_tokens` counts the whole prompt, `cached_tokens` the cached part."""
        price = self.price(model)
        if price is None:
            return None
        return ((input_tokens - cached_tokens) * price["input"] + cached_tokens * price["cached_input"]
                + output_tokens * price["output"]) / 1e6


@dataclass(frozen=True)
class CliReport:
    """What a coding-agent CLI said about its own run: tokens (the whole prompt in `input_tokens`), the cost it
    computed (None where it computes none), the error it ended on, tool calls it refused itself, and whether it
    stopped at its own turn limit."""

    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    turns: int | None = None
    error: str | None = None
    permission_denials: int = 0
    max_turns: bool = False


def _json_lines(text: str):
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                yield value


def cli_report(output: str) -> CliReport | None:
    """The usage report in an agent's output (Claude Code's result object or Codex's events), or None."""
    claude = codex = None
    input_tokens = cached = output_tokens = 0
    failed_turns, errors = [], []  # Codex: a failed turn ends the run; a lone error event may be a retry
    for event in _json_lines(output):
        kind = event.get("type")
        if kind == "result" and "usage" in event:
            claude = event
        elif kind == "turn.completed" and isinstance(event.get("usage"), dict):
            codex = True
            usage = event["usage"]
            input_tokens += int(usage.get("input_tokens") or 0)
            cached += int(usage.get("cached_input_tokens") or 0)
            output_tokens += int(usage.get("output_tokens") or 0)
        elif kind == "turn.failed":
            codex = True
            failed_turns.append(str((event.get("error") or {}).get("message") or "the turn failed"))
        elif kind == "error" and event.get("message"):
            errors.append(str(event["message"]))
    if claude is not None:
        usage = claude.get("usage") or {}
        read = int(usage.get("cache_read_input_tokens") or 0)
        prompt = int(usage.get("input_tokens") or 0) + read + int(usage.get("cache_creation_input_tokens") or 0)
        cost = claude.get("total_cost_usd")
        subtype = str(claude.get("subtype") or "")
        failed = bool(claude.get("is_error")) and subtype != "error_max_turns"
        return CliReport(input_tokens=prompt, cached_tokens=read, output_tokens=int(usage.get("output_tokens") or 0),
                         cost_usd=float(cost) if isinstance(cost, (int, float)) else None,
                         turns=claude.get("num_turns"),
                         error=str(claude.get("result") or subtype or "error") if failed else None,
                         permission_denials=len(claude.get("permission_denials") or []),
                         max_turns=subtype == "error_max_turns")
    if codex is not None or errors:
        error = failed_turns[-1] if failed_turns else errors[-1] if errors and not output_tokens else None
        return CliReport(input_tokens=input_tokens, cached_tokens=cached, output_tokens=output_tokens, error=error)
    return None
