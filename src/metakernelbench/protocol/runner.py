"""Executes a planned run against a store: phase 1 (solo) ends before phase 2 (skill, placebo) starts, the trials of a
phase run side by side, finished trials are never redone, an interrupted trial restarts from scratch, and a skill arm
without a source skill is recorded as skipped.

A trial whose agent could not be set up (a `ClientError`: no key, a rejected key, an unreachable model, an agent
program that never started) ends as `agent_error` with its cause and stops the run from starting more: one set-up
mistake must not become a run of failed trials. A trial the harness itself failed in goes back to pending."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable

from metakernelbench.agent.clients import ClientError
from metakernelbench.agent.trial import run_trial as chat_trial
from metakernelbench.protocol import TrialSpec
from metakernelbench.store import Store


class SetupFailed(Exception):
    """Trials ended as agent_error; the message names the first cause and how to retry."""


class CostSpent(Exception):
    """The run reached its cost limit; the message says what was spent and how to go on."""


def skill_for(store: Store, spec: TrialSpec) -> str | None:
    source = spec.skill_source()
    if source is None:
        return None
    problem, dsl, replicate = source
    solo = store.find_solo(spec.run_id, spec.model, problem, dsl, replicate)
    return solo.skill if solo is not None and solo.status == "finished" else None


def execute(store: Store, specs: list[TrialSpec], problems: dict, make_client: Callable, grader,
            sampling: dict, on_trial: Callable = lambda spec, outcome: None, concurrency: int = 1,
            run_trial: Callable = chat_trial, task_hashes: dict[str, str] | None = None,
            max_cost_usd: float | None = None) -> None:
    """Run every unfinished trial of `specs`, up to `concurrency` at once (trials mostly wait on the model); every
    skill needs its solo, so phase 2 starts only once all of phase 1 has ended.

    `make_client(spec, problem)` builds a fresh client per trial (offline clients need the trial's variant), and
    `run_trial(spec, client, grader, problem, store, skill)` runs it: a chat model's loop by default, or
    `agent.command.run_command_trial` with the agent as the client;
    `grader.grade` and `on_trial(spec, outcome)` are called from the trial threads, so with `concurrency` > 1 both
    must be thread-safe (`execute.Lanes` are). `task_hashes` (trial id to task fingerprint) is recorded with
    each trial it starts. The first trial that raises stops new trials from starting; its error re-raises here once
    the trials in flight have ended (SetupFailed for agent_error trials). With `max_cost_usd`, no trial starts once
    the run's trials have cost that much (CostSpent). An interrupt of this call itself (Ctrl-C) starts nothing more
    and raises at once; trials still in flight stay 'running' and restart on resume.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    store.add_trials(specs, task_hashes)
    hashes = task_hashes or {}
    stop, failures, setup_errors, unstarted = threading.Event(), [], [], []
    lock = threading.Lock()

    def attempt(spec: TrialSpec) -> None:
        if stop.is_set():
            return
        with lock:  # checked and claimed together, so concurrent trials cannot all pass one last check
            if max_cost_usd is not None and store.spent_usd(spec.run_id) >= max_cost_usd:
                unstarted.append(spec)
                return
            skill = skill_for(store, spec)
            if spec.phase == 2 and skill is None:
                if store.start_trial(spec.trial_id, sampling, hashes.get(spec.trial_id)):
                    store.skip_trial(spec.trial_id, "the source solo trial wrote no skill")
                    on_trial(spec, "skipped")
                return
            if not store.start_trial(spec.trial_id, sampling, hashes.get(spec.trial_id)):
                return
        try:
            problem = problems[spec.problem]
            outcome = run_trial(spec, make_client(spec, problem), grader, problem, store, skill)
        except ClientError as exc:
            store.fail_setup(spec.trial_id, str(exc))
            setup_errors.append(str(exc))
            stop.set()
            on_trial(spec, "agent_error")
            return
        except BaseException as exc:
            store.release_trial(spec.trial_id)
            failures.append(exc)
            stop.set()
            raise
        on_trial(spec, outcome)

    pool = ThreadPoolExecutor(concurrency, thread_name_prefix="mkb-trial")
    try:
        for phase in (1, 2):
            wait([pool.submit(attempt, spec) for spec in specs if spec.phase == phase])
            if failures:
                raise failures[0]
            if setup_errors:
                count = len(setup_errors)
                raise SetupFailed(f"{count} trial{'s' if count > 1 else ''} ended as agent_error (the agent never "
                                  f"attempted the task; no result recorded): {setup_errors[0]} -- fix the set-up and "
                                  "rerun the same command to retry (finished trials are kept)")
        if unstarted:
            spent = store.spent_usd(specs[0].run_id)
            raise CostSpent(f"the run has cost ${spent:.2f}, reaching --max-cost ${max_cost_usd:.2f}: "
                            f"{len(unstarted)} trials not started; rerun with a higher --max-cost to go on")
    finally:
        stop.set()  # whatever ended the wait, start nothing more
        pool.shutdown(wait=False, cancel_futures=True)
