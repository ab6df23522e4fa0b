"""The transfer protocol: which trials a run holds, in which phase, and where each skill arm's skill comes from.

Phase 1 runs every solo trial (each DSL, each replicate; a second solo replicate is the noise control). Phase 2
runs, for every ordered DSL pair, a skill trial in the target DSL whose only extra input is the source solo's skill,
and a placebo trial whose skill comes from a different problem's solo in the same source DSL. All arms of a cell
share one budget. Trial ids are fixed by (run, model, problem, DSL, arm, source, replicate), so a rerun resumes.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

ARMS = ("solo", "skill", "placebo")


class PlanError(Exception):
    """A run configuration that cannot be planned; the message names the fix."""


@dataclass(frozen=True)
class Budget:
    """Identical for every arm of a cell. Submissions and wall time default to the published benchmark's budget of
    an attempt (10 submissions, 2400 s)."""

    submissions: int = 10
    turns: int = 40
    output_tokens: int = 400_000
    wall_s: float = 2400.0


@dataclass(frozen=True)
class TrialSpec:
    run_id: str
    model: str
    problem: str
    dsl: str
    arm: str
    replicate: int
    source_dsl: str | None = None
    skill_problem: str | None = None
    budget: Budget = field(default_factory=Budget)
    regrades: int = 2  # fresh gradings of the chosen submission that score the trial (0: its own grading)

    @property
    def trial_id(self) -> str:
        key = "|".join(map(str, (self.run_id, self.model, self.problem, self.dsl, self.arm, self.source_dsl,
                                 self.replicate)))
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    @property
    def phase(self) -> int:
        return 1 if self.arm == "solo" else 2

    def skill_source(self) -> tuple[str, str, int] | None:
        """(problem, DSL, replicate) of the solo trial whose skill this trial receives."""
        if self.arm == "solo":
            return None
        return self.skill_problem or self.problem, self.source_dsl, self.replicate


def placebo_problem(problem: str, problems: list[str], seed: int) -> str:
    """A different problem, fixed by the run's seed: the same skill length and style, the wrong content."""
    others = sorted(p for p in problems if p != problem)
    if not others:
        raise PlanError("the placebo arm needs at least two problems; add problems or drop --arms placebo")
    digest = hashlib.sha256(f"{seed}|{problem}".encode()).digest()
    return others[int.from_bytes(digest[:8], "big") % len(others)]


def plan(run_id: str, model: str, problems: list[str], dsls: list[str], arms: list[str], replicates: int = 1,
         budget: Budget = Budget(), seed: int = 0, solo_control: bool = True, regrades: int = 2) -> list[TrialSpec]:
    """Every trial of a run, phase 1 first. `solo_control` adds one more solo replicate per variant: the noise floor."""
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise PlanError(f"unknown arm(s) {unknown}; choose from {', '.join(ARMS)}")
    if replicates < 1:
        raise PlanError("--replicates must be at least 1")
    if regrades < 0:
        raise PlanError(f"--regrades is {regrades}: pass 0 (score by the selecting grading) or more")
    if any(a != "solo" for a in arms) and len(dsls) < 2:
        raise PlanError("skill and placebo arms need two DSLs; pass --dsls cute,tirx or --arms solo")
    solo_replicates = replicates + (1 if solo_control else 0)
    trials = [TrialSpec(run_id, model, p, d, "solo", r, budget=budget, regrades=regrades)
              for p in problems for d in dsls for r in range(solo_replicates)]
    for p in problems:
        for target in dsls:
            for source in dsls:
                if source == target:
                    continue
                for r in range(replicates):
                    if "skill" in arms:
                        trials.append(TrialSpec(run_id, model, p, target, "skill", r, source, budget=budget,
                                                regrades=regrades))
                    if "placebo" in arms:
                        trials.append(TrialSpec(run_id, model, p, target, "placebo", r, source,
                                                placebo_problem(p, problems, seed), budget=budget,
                                                regrades=regrades))
    return trials


@dataclass(frozen=True)
class WorstCase:
    """What a plan can spend at most. Tokens and cost are None where the budget does not bound them (command agents
    spend what they spend within their wall time), cost also where the model has no price."""

    input_tokens: int | None
    output_tokens: int | None
    cost_usd: float | None
    wall_s: float


def worst_case(specs: list[TrialSpec], concurrency: int, prompt_tokens: int, max_output_tokens: int | None,
               feedback_tokens: int = 800, price: dict | None = None) -> WorstCase:
    """The plan's worst case: every trial uses its whole budget. A chat trial answers at most `turns` times plus
    the distillation, each answer at most `max_output_tokens` and all at most `output_tokens`; each request resends
    the conversation so far (the `prompt_tokens` statement, every answer, a `feedback_tokens` verdict after each).
    Wall time: each phase in waves of `concurrency` trials, each wave a whole wall budget (grading time aside)."""
    waves = sum(-(-sum(s.phase == phase for s in specs) // concurrency) for phase in (1, 2))
    wall = waves * max((s.budget.wall_s for s in specs), default=0.0)
    if max_output_tokens is None:
        return WorstCase(None, None, None, wall)
    input_tokens = output_tokens = 0
    for spec in specs:
        b = spec.budget
        # The output budget is checked before each turn, so the last turn may overshoot it by one answer.
        written = lambda k: min(k * max_output_tokens, b.output_tokens + max_output_tokens)  # noqa: E731
        output_tokens += written(b.turns) + max_output_tokens
        input_tokens += sum(prompt_tokens + written(k) + k * feedback_tokens for k in range(b.turns + 1))
    cost = None if price is None else (input_tokens * price["input"] + output_tokens * price["output"]) / 1e6
    return WorstCase(input_tokens, output_tokens, cost, wall)
