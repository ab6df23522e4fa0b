"""Where grading runs: one queue served by one lane per local GPU, so many trials share the GPUs one job at a time.

Trials spend most of their time waiting for the model, so a run keeps many in flight; a submission's timing is only
true when nothing else runs on its GPU, so each GPU grades one submission at a time. Every lane is a thread that owns
one `Grader` pinned to its device; any trial thread may call `GradingLanes.grade`, which queues the job and blocks
until the next free lane has graded it.
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from metakernelbench.grader import Grader, GraderConfig, Verdict
from metakernelbench.suite.loader import Problem


class LanesClosed(Exception):
    """A submission handed to grading lanes that were closed before a lane took it."""


@dataclass(frozen=True)
class _Job:
    problem: Problem
    dsl: str
    path: Path
    verdict: Future


def local_devices() -> list[str]:
    """One device per grading lane: every visible GPU (CUDA_VISIBLE_DEVICES applies), else the CPU."""
    return [f"cuda:{i}" for i in range(torch.cuda.device_count())] or ["cpu"]


class GradingLanes:
    """One worker thread and one Grader per device behind one queue; duck-types as a grader (`grade`) for trials.

    `make_grader(config)` builds each lane's grader (tests inject stand-ins); each gets `config` with its device.
    Closing fails the jobs still queued, lets the lanes finish the jobs they hold, then closes the graders.
    """

    def __init__(self, devices: list[str], config: GraderConfig,
                 make_grader: Callable[[GraderConfig], Grader] = Grader) -> None:
        if not devices:
            raise ValueError("grading lanes need at least one device, e.g. ['cuda:0'] or ['cpu']")
        if len(set(devices)) != len(devices):
            raise ValueError(f"devices {devices} repeat one: give each GPU one lane, so timings never overlap")
        self.devices = list(devices)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._graders = [make_grader(replace(config, device=d)) for d in self.devices]
        # Daemon threads: a lanes object never closed must not keep the process alive at exit.
        self._threads = [threading.Thread(target=self._serve, args=(g,), name=f"mkb-grade-{d}", daemon=True)
                         for g, d in zip(self._graders, self.devices)]
        for thread in self._threads:
            thread.start()

    def __enter__(self) -> "GradingLanes":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def grade(self, problem: Problem, dsl: str, path: Path) -> Verdict:
        """Grade on the next free lane; blocks the calling thread until done. A grader's exception re-raises here."""
        job = _Job(problem, dsl, Path(path), Future())
        with self._lock:
            if self._closed:
                raise LanesClosed("the grading lanes are closed: grade before leaving their `with` block")
            self._jobs.put(job)
        return job.verdict.result()

    def _serve(self, grader: Grader) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job.verdict.set_result(grader.grade(job.problem, job.dsl, job.path))
            except BaseException as exc:  # the caller decides; the lane stays up for the next job
                job.verdict.set_exception(exc)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            job.verdict.set_exception(LanesClosed("the grading lanes closed before this submission was graded"))
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()
        for grader in self._graders:
            grader.close()


__all__ = ["GradingLanes", "LanesClosed", "local_devices"]
