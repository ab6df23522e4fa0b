"""The offline `reference` client: submits the problem's hidden reference solution, then distils a skill from the
verdicts it received. For demos and tests; every report labels its trials as offline."""
from __future__ import annotations

import time

from metakernelbench.agent.clients import Reply, Sampling
from metakernelbench.agent.trial import DISTILL_PROMPT


class ReferenceClient:
    def __init__(self, problem, dsl: str, sampling: Sampling = Sampling()) -> None:
        self.spec = "reference"
        self.sampling = sampling
        self.problem = problem
        self.dsl = dsl

    def complete(self, system: str, messages: list[dict]) -> Reply:
        started = time.monotonic()
        last = messages[-1]["content"]
        if last == DISTILL_PROMPT:
            verdicts = [m["content"] for m in messages if m["role"] == "user" and m["content"].startswith("## Verdict")]
            text = ("Offline reference attempt. The submitted solution's verdicts were: "
                    + " | ".join(v.replace("## Verdict\n", "").replace("\n", "; ") for v in verdicts))
        elif any(m["role"] == "assistant" for m in messages):
            text = "The reference solution stands; ending the attempt."
        else:
            source = self.problem.graded_solution(self.dsl).read_text()
            text = f"```python\n{source}```"
        return Reply(text=text, input_tokens=0, output_tokens=0, cached_tokens=0, cost_usd=None,
                     latency_s=time.monotonic() - started, model="reference", offline=True)
