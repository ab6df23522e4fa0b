"""Counts a DSL's kernel launches and can neutralise them, to prove a submission's DSL kernel fed its outputs.

The gate wraps the Python entry points through which a DSL launches compiled code. Nested entry points (a
subclass's __call__ calling its base's) count once: only the outermost call counts and is neutralised.
"""
from __future__ import annotations

import functools
from typing import Any, Callable


class LaunchGate:
    def __init__(self) -> None:
        self.launches = 0
        self.neutralise = False
        self._depth = 0
        self.wrapped: list[str] = []
        self.clock: Callable[[], Any] | None = None  # when set, each launch is bracketed by two clock readings
        self.readings: list[tuple[Any, Any]] = []
        self.owners: list[Any] = []  # objects whose entry points were replaced: the child keeps them unpatched

    @property
    def inside(self) -> bool:
        """Whether a gated launch is running now (the DSL's own work, for the DSL-share calls' dispatch logger)."""
        return self._depth > 0

    def watch(self, owner: Any) -> None:
        if owner not in self.owners:
            self.owners.append(owner)

    def wrap(self, owner: Any, attr: str, neutral_result: Callable[[], Any] = lambda: None) -> None:
        original = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr)
        if original is None or getattr(original, "__mkb_gate__", False):
            return
        gate = self

        @functools.wraps(original)
        def gated(*args, **kwargs):
            if gate._depth:
                return original(*args, **kwargs)
            gate.launches += 1
            if gate.neutralise:
                return neutral_result()
            gate._depth += 1
            begin = gate.clock() if gate.clock else None
            try:
                return original(*args, **kwargs)
            finally:
                gate._depth -= 1
                if gate.clock:
                    gate.readings.append((begin, gate.clock()))

        gated.__mkb_gate__ = True
        setattr(owner, attr, gated)
        self.watch(owner)
        self.wrapped.append(f"{getattr(owner, '__qualname__', owner)}.{attr}")

    def take(self) -> int:
        count, self.launches = self.launches, 0
        return count
