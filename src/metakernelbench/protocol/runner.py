"""Executes a planned run against a store: phase 1 (solo) ends before phase 2 (skill, placebo) starts, the trials of a
phase run side by side, finished trials are never redone, an interrupted trial restarts from scratch, and a skill arm
without a source skill is recorded as skipped."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable

from metakernelbench.agent.trial import run_trial as chat_trial
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
            sampling: dict, on_trial: Callable = lambda spec, outcome: None, concurrency: int = 1,
            run_trial: Callable = chat_trial) -> None:
    """Run every unfinished trial of `specs`, up to `concurrency` at once (trials mostly wait on the model); every
    skill needs its solo, so phase 2 starts only once all of phase 1 has ended.

    `make_client(spec, problem)` builds a fresh client per trial (offline clients need the trial's variant), and
    `run_trial(spec, client, grader, problem, store, skill)` runs it: a chat model's loop by default, or
    `agent.command.run_command_trial` with the agent's command line as the client;
    `grader.grade` and `on_trial(spec, outcome)` are called from the trial threads, so with `concurrency` > 1 both
    must be thread-safe (`execute.GradingLanes` is). The first trial that raises stops new trials from starting; its
    error re-raises here once the trials in flight have ended. An interrupt of this call itself (Ctrl-C) starts
    nothing more and raises at once; trials still in flight stay 'running' and restart on resume.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    store.add_trials(specs)
    stop, failures = threading.Event(), []

    def attempt(spec: TrialSpec) -> None:
        if stop.is_set():
            return
        try:
            skill = skill_for(store, spec)
            if spec.phase == 2 and skill is None:
                if store.start_trial(spec.trial_id, sampling):
                    store.skip_trial(spec.trial_id, "the source solo trial wrote no skill")
                    on_trial(spec, "skipped")
                return
            if not store.start_trial(spec.trial_id, sampling):
                return
            problem = problems[spec.problem]
            on_trial(spec, run_trial(spec, make_client(spec, problem), grader, problem, store, skill))
        except BaseException as exc:
            failures.append(exc)
            stop.set()
            raise

    pool = ThreadPoolExecutor(concurrency, thread_name_prefix="mkb-trial")
    try:
        for phase in (1, 2):
            wait([pool.submit(attempt, spec) for spec in specs if spec.phase == phase])
            if failures:
                raise failures[0]
    finally:
        stop.set()  # whatever ended the wait, start nothing more
        pool.shutdown(wait=False, cancel_futures=True)
