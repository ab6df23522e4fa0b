"""Harness overhead per submission round trip: everything but model latency and grading (prompt assembly, code
extraction, the store's transactions, feedback). A zero-latency client and a zero-time grader stand in for the model
and the grader; the store is a real SQLite file. Target: ≤ 50 ms per round trip.

    python benchmarks/harness_overhead.py [SUBMISSIONS]
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from metakernelbench.agent.clients import Reply
from metakernelbench.agent.trial import DISTILL_PROMPT, run_trial
from metakernelbench.protocol import Budget, plan
from metakernelbench.store import Store
from metakernelbench.suite import load_problem

CODE = Path(__file__).resolve().parents[1] / "tests" / "adversarial" / "honest_rmsnorm.py"


class InstantClient:
    spec, sampling = "instant", None

    def __init__(self) -> None:
        self.answer = f"Next version:\n```python\n{CODE.read_text()}```\n"

    def complete(self, system, messages):
        text = "Keep sums in fp32." if messages[-1]["content"] == DISTILL_PROMPT else self.answer
        return Reply(text, 1000, 2000, 0, None, 0.0, "instant", offline=True)


class InstantGrader:
    """Returns a full-size verdict (as the real grader's JSON) without grading."""

    def __init__(self, verdict: dict) -> None:
        self.verdict = verdict

    def grade(self, problem, dsl, path):
        verdict = self.verdict

        class Graded:
            def to_dict(self):
                return verdict

        return Graded()


def main() -> None:
    submissions = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    problem = load_problem("28")
    verdict = {"passed": True, "compiled": True, "correct": True, "failed_check": None, "reason": "",
               "runtime": {"median_ms": 0.2, "p10_ms": 0.19, "p90_ms": 0.21, "n": 30, "spread": 0.1},
               "speedup_vs_eager": 5.0, "speedup_vs_eager_range": [4.9, 5.1], "speedup_vs_compile": 1.1,
               "roofline": {"fraction": 0.4}, "draws": [{"size": "full", "outputs": []}] * 8, "stderr_tail": ""}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "bench.sqlite")
        store.ensure_run("bench", {}, {})
        (spec,) = plan("bench", "instant", [problem.id], ["tirx"], ["solo"], budget=Budget(
            submissions=submissions, turns=submissions + 1), solo_control=False)
        store.add_trials([spec])
        store.start_trial(spec.trial_id, {})
        started = time.perf_counter()
        result = run_trial(spec, InstantClient(), InstantGrader(verdict), problem, store, None)
        elapsed = time.perf_counter() - started
    per = elapsed / result.submissions * 1e3
    print(f"{result.submissions} submission round trips in {elapsed:.2f} s: {per:.1f} ms each "
          f"(target <= 50 ms) -> {'OK' if per <= 50 else 'OVER'}")


if __name__ == "__main__":
    main()
