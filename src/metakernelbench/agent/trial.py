"""One trial: a model attempts one variant under a budget, each answer graded, then distils a skill (pass or fail)."""
from __future__ import annotations

import functools
import re
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from metakernelbench.agent.clients import ModelClient, Reply
from metakernelbench.dsl import leak_pattern
from metakernelbench.protocol import TrialSpec
from metakernelbench.store import Store
from metakernelbench.task import task_statement

SYSTEM_PROMPT = """You are an expert GPU kernel engineer. Answer every turn with ONE complete Python module inside a \
single ```python fenced block: the whole file, not a diff. Each answer is graded at once and you receive the \
grader's verdict. Keep improving correctness first, then speed. To end your attempt, answer without a code block."""

SKILL_HEADER = "## Experience from an earlier attempt at this problem in another kernel DSL"

DISTILL_PROMPT = """Your attempt is over. Distil what you learned into a SKILL for an engineer who will attempt the \
SAME problem from scratch in a DIFFERENT kernel DSL. Rules: prose only, no code and no code blocks; no identifiers \
or API names of your DSL; only claims backed by your verdicts (what failed and why, what was correct, what was fast, \
with numbers); the problem's traps, the numerics that matter, the work decomposition and memory-access pattern \
that paid off. At most 400 words."""

_CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class TrialResult:
    """What a trial achieved: its best passing submission (fastest correct), else its last. The runtime of a passing
    trial is the median of its chosen submission's fresh gradings (`regrade_medians_ms`), not the timing that chose
    it: the fastest of several noisy gradings flatters (the winner's curse); that timing is kept as `selection_*`."""

    passed: bool
    best_submission: int | None
    median_ms: float | None
    speedup_vs_eager: float | None
    speedup_vs_eager_range: list | None
    fraction_of_roofline: float | None
    noise_spread: float | None
    submissions: int
    turns: int | None  # model turns; None for a command agent, whose turns the harness cannot see
    stop_reason: str
    offline_client: bool
    isolation: str | None = None  # how a command agent was sandboxed: "bwrap" or "user nobody"
    selection_median_ms: float | None = None  # the chosen submission's own grading, which picked it
    selection_speedup_vs_eager: float | None = None
    regrade_medians_ms: list = field(default_factory=list)  # its fresh gradings, in order
    regrade_failure: str | None = None  # a fresh grading that failed: the trial does not pass


def extract_code(text: str) -> str | None:
    blocks = _CODE_BLOCK.findall(text)
    return blocks[-1] if blocks else None


@functools.cache
def _dsl_identifiers() -> re.Pattern:
    return re.compile(rf"\b({leak_pattern()})\b")


def audit_skill(text: str) -> dict:
    """Length and code leakage of a skill: a skill must transfer knowledge, not code."""
    identifiers = sorted(set(_dsl_identifiers().findall(text)))
    fences = text.count("```")
    return {"words": len(text.split()), "chars": len(text), "code_fences": fences, "dsl_identifiers": identifiers,
            "leaks_code": bool(fences or identifiers)}


def feedback(verdict: dict) -> str:
    """What the model sees after a submission: the grader's facts, short."""
    lines = ["## Verdict", f"passed: {verdict['passed']}  compiled: {verdict['compiled']}  "
                            f"correct: {verdict['correct']}"]
    if verdict["failed_check"]:
        lines.append(f"failed check: {verdict['failed_check']}: {verdict['reason']}")
    runtime = verdict.get("runtime") or {}
    if runtime.get("median_ms"):
        lines.append(f"runtime: median {runtime['median_ms']:.4f} ms (p10 {runtime['p10_ms']:.4f}, p90 "
                     f"{runtime['p90_ms']:.4f}, n {runtime['n']})")
    if verdict.get("speedup_vs_eager"):
        low, high = verdict["speedup_vs_eager_range"]
        lines.append(f"speedup vs PyTorch eager: {verdict['speedup_vs_eager']:.2f}x (eager process spread: "
                     f"{low:.2f}x..{high:.2f}x)")
    if verdict.get("speedup_vs_compile"):
        lines.append(f"speedup vs torch.compile: {verdict['speedup_vs_compile']:.2f}x")
    fraction = (verdict.get("roofline") or {}).get("fraction")
    if fraction:
        lines.append(f"fraction of roofline: {fraction:.1%}")
    if not verdict["passed"] and verdict.get("stderr_tail"):
        lines += ["stderr (tail):", "```", verdict["stderr_tail"][-1500:], "```"]
    return "\n".join(lines)


def task_prompt(problem, dsl: str, skill: str | None) -> str:
    """The trial's first message: the variant's task statement, then the skill section when the arm has one."""
    statement = task_statement(problem, dsl)
    if skill is not None:
        statement += f"\n\n{SKILL_HEADER}\n{skill.strip()}\n"
    return statement


def chosen_submission(verdicts: list[dict]) -> int | None:
    """The submission a trial is scored by: its fastest passing one, else its last."""
    passing = [i for i, v in enumerate(verdicts) if v["passed"]]
    if passing:
        return min(passing, key=lambda i: verdicts[i]["runtime"]["median_ms"])
    return len(verdicts) - 1 if verdicts else None


def regrade(spec: TrialSpec, grader, problem, store: Store, verdicts: list[dict], path_of,
            recorded=lambda verdict: verdict) -> list[dict]:
    """Grade the chosen passing submission `spec.regrades` more times, each in a fresh grading process, and keep
    the verdicts (as `recorded` makes them fit for the store); `path_of(index)` is that submission's file. Nothing
    to do for a trial that never passed."""
    chosen = chosen_submission(verdicts)
    if chosen is None or not verdicts[chosen]["passed"]:
        return []
    fresh = []
    for idx in range(spec.regrades):
        verdict = grader.grade(problem, spec.dsl, path_of(chosen)).to_dict()
        store.add_regrade(spec.trial_id, idx, chosen, recorded(verdict))
        fresh.append(verdict)
        if not verdict["passed"]:
            break
    return fresh


def trial_result(verdicts: list[dict], turns: int | None, stop: str, offline: bool,
                 isolation: str | None = None, regrades: list[dict] = ()) -> TrialResult:
    """The result of a trial that made `verdicts`, scored by the fresh gradings `regrades` of its chosen submission
    (by that submission's own grading when there are none)."""
    index = chosen_submission(verdicts)
    common = dict(best_submission=index, submissions=len(verdicts), turns=turns, stop_reason=stop,
                  offline_client=offline, isolation=isolation)
    failed = dict(passed=False, median_ms=None, speedup_vs_eager=None, speedup_vs_eager_range=None,
                  fraction_of_roofline=None, noise_spread=None)
    if index is None or not verdicts[index]["passed"]:
        return TrialResult(**failed, **common)
    best = verdicts[index]
    selection = dict(selection_median_ms=best["runtime"]["median_ms"],
                     selection_speedup_vs_eager=best.get("speedup_vs_eager"))
    broken = next((v for v in regrades if not v["passed"]), None)
    if broken is not None:
        return TrialResult(**failed, **common, **selection, regrade_medians_ms=[
            v["runtime"].get("median_ms") for v in regrades if v["passed"]],
            regrade_failure=f"{broken['failed_check']}: {broken['reason']}")
    scored = list(regrades) or [best]
    median = lambda values: statistics.median(values) if values and None not in values else None  # noqa: E731
    ranges = [v.get("speedup_vs_eager_range") for v in scored]
    return TrialResult(passed=True, median_ms=median([v["runtime"]["median_ms"] for v in scored]),
                       speedup_vs_eager=median([v.get("speedup_vs_eager") for v in scored]),
                       speedup_vs_eager_range=[min(r[0] for r in ranges), max(r[1] for r in ranges)]
                       if None not in ranges else None,
                       fraction_of_roofline=median([(v.get("roofline") or {}).get("fraction") for v in scored]),
                       noise_spread=median([v["runtime"].get("spread") for v in scored]), **common, **selection,
                       regrade_medians_ms=[v["runtime"]["median_ms"] for v in regrades])


class _Usage:
    def __init__(self) -> None:
        self.input_tokens = self.output_tokens = self.cached_tokens = 0
        self.cost_usd: float | None = None
        self.started = time.monotonic()

    def add(self, reply: Reply) -> None:
        self.input_tokens += reply.input_tokens
        self.output_tokens += reply.output_tokens
        self.cached_tokens += reply.cached_tokens
        if reply.cost_usd is not None:
            self.cost_usd = (self.cost_usd or 0.0) + reply.cost_usd

    def as_dict(self) -> dict:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cached_tokens": self.cached_tokens, "cost_usd": self.cost_usd,
                "wall_s": time.monotonic() - self.started}


def run_trial(spec: TrialSpec, client: ModelClient, grader, problem, store: Store, skill: str | None) -> TrialResult:
    """Run one trial to its end and record everything; the store marks it finished only at the very end."""
    budget = spec.budget
    statement = task_prompt(problem, spec.dsl, skill)
    messages = [{"role": "user", "content": statement}]
    store.add_message(spec.trial_id, 0, "user", statement)
    usage, verdicts, offline = _Usage(), [], False
    turns, stop = 0, "budget: turns"
    with tempfile.TemporaryDirectory(prefix="mkb-trial-") as scratch:
        while turns < budget.turns:
            if usage.output_tokens >= budget.output_tokens:
                stop = "budget: output tokens"
                break
            if time.monotonic() - usage.started >= budget.wall_s:
                stop = "budget: wall time"
                break
            reply = client.complete(SYSTEM_PROMPT, messages)
            offline |= reply.offline
            turns += 1
            usage.add(reply)
            messages.append({"role": "assistant", "content": reply.text})
            store.add_message(spec.trial_id, len(messages) - 1, "assistant", reply.text,
                              {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens,
                               "latency_s": reply.latency_s, "model": reply.model})
            code = extract_code(reply.text)
            if code is None:
                stop = "model stopped" if reply.text.strip() else "empty answer"
                break
            path = Path(scratch) / f"submission_{len(verdicts):03d}.py"
            path.write_text(code)
            verdict = grader.grade(problem, spec.dsl, path).to_dict()
            store.add_submission(spec.trial_id, len(verdicts), code, verdict)
            verdicts.append(verdict)
            messages.append({"role": "user", "content": feedback(verdict)})
            store.add_message(spec.trial_id, len(messages) - 1, "user", messages[-1]["content"])
            if len(verdicts) >= budget.submissions:
                stop = "budget: submissions"
                break
        fresh = regrade(spec, grader, problem, store, verdicts, lambda i: Path(scratch) / f"submission_{i:03d}.py")
    messages.append({"role": "user", "content": DISTILL_PROMPT})
    store.add_message(spec.trial_id, len(messages) - 1, "user", DISTILL_PROMPT)
    reply = client.complete(SYSTEM_PROMPT, messages)
    usage.add(reply)
    store.add_message(spec.trial_id, len(messages), "assistant", reply.text,
                      {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens})
    skill_text = reply.text.strip() or None
    result = trial_result(verdicts, turns, stop, offline, regrades=fresh)
    store.finish_trial(spec.trial_id, asdict(result), skill_text, audit_skill(skill_text) if skill_text else None,
                       usage.as_dict())
    return result
