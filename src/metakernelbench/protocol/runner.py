"""Executes a planned run against a store: phase 1 (solo) before phase 2 (skill, placebo), finished trials never
redone, an interrupted trial restarted from scratch, a skill arm without a source skill recorded as skipped."""
from __future__ import annotations

from typing import Callable

from metakernelbench.agent.trial import run_trial
from metakernelbench.protocol import TrialSpec
from metakernelbench.store import Store


def skill_for(store: Store, spec: TrialSpec) -> str | None:
    source = spec.skill_source()
    if source is None:
        return None
    problem, dsl, replicate = source
    solo = store.find_solo(spec.run_id, spec.model, problem, dsl, replicate)
    return solo.skill if solo is not None and solo.status == "finished" else None


def execute(store: Store, specs: list[TrialSpec], problems: dict, make_client: Callable, grader,
            sampling: dict, on_trial: Callable = lambda spec, outcome: None) -> None:
    """Run every unfinished trial of `specs` in phase order. `make_client(spec, problem)` builds a fresh client per
    trial (offline clients need the trial's variant); `on_trial` sees each trial as it ends."""
    store.add_trials(specs)
    for phase in (1, 2):
        for spec in (s for s in specs if s.phase == phase):
            skill = skill_for(store, spec)
            if spec.phase == 2 and skill is None:
                if store.start_trial(spec.trial_id, sampling):
                    store.skip_trial(spec.trial_id, "the source solo trial wrote no skill")
                    on_trial(spec, "skipped")
                continue
            if not store.start_trial(spec.trial_id, sampling):
                continue
            problem = problems[spec.problem]
            result = run_trial(spec, make_client(spec, problem), grader, problem, store, skill)
            on_trial(spec, result)
