"""Secrets stay out of every record: the values of the variables handed to an agent (`--agent-env`) and anything in
a command line or an agent's output that looks like a key are replaced before they reach the store, the printed
plan, a transcript or a report."""
from __future__ import annotations

import os
import re

REDACTED = "[redacted]"
# Provider key formats (OpenAI/Anthropic/OpenRouter `sk-`, GitHub, AWS, Google, Slack) and bearer tokens.
_KEY = re.compile(r"\b(?:sk|rk|pk)-[A-Za-z0-9_\-]{12,}|\bgh[pousr]_[A-Za-z0-9]{20,}|\bAKIA[0-9A-Z]{16}\b"
                  r"|\bAIza[0-9A-Za-z_\-]{30,}|\bxox[abps]-[A-Za-z0-9\-]{10,}")
_BEARER = re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/\-]{8,}=*")
# NAME=value or --name value / --name=value where the name says key, token, secret or password; a value that is a
# shell reference ($VAR) names the secret without holding it, and one that starts with '-' is the next option.
_ASSIGNED = re.compile(r"(?i)(\b[\w.-]*(?:api[_-]?key|token|secret|password)[\w.-]*(?:\s*=\s*|\s+))"
                       r"(?![$-])(['\"]?)([^\s'\"]{12,})\2")


def secret_values(names) -> list[str]:
    """The values of the named environment variables that are long enough to be secrets."""
    return [os.environ[name] for name in names if len(os.environ.get(name, "")) >= 6]


def redact(text: str, values=(), assignments: bool = False) -> str:
    """`text` with every value in `values` and every token in a provider's key format replaced by [redacted]; with
    `assignments` (command lines, not code: `num_tokens = x.shape[0]` is no secret) also values given to options
    and variables named like keys."""
    for value in sorted(set(values), key=len, reverse=True):
        text = text.replace(value, REDACTED)
    text = _KEY.sub(REDACTED, text)
    text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    if not assignments:
        return text
    return _ASSIGNED.sub(lambda m: m.group(1) + m.group(2) + REDACTED + m.group(2), text)
