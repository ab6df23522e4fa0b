"""Where grading runs: one queue served by grading lanes, so many trials share the GPUs one job at a time.

Trials spend most of their time waiting for the model, so a run keeps many in flight; a submission's timing is only
true when nothing else runs on its GPU, so each GPU grades one submission at a time. A lane is a worker process that
owns one `Grader` pinned to its device and to its own share of the host's CPUs (`execute.lane`); for each lane one
driver thread hands it jobs. A worker that dies or hangs holding a job is killed with its grader's processes and
replaced, and the job is graded again on the fresh one, so a submission is never lost and never graded into two
verdicts. `GradingLanes` runs the lanes on this host; `execute.cluster.RayLanes` runs them as Ray actors, one per GPU
of a cluster. Both are `Lanes`: any trial thread may call `grade`, which blocks until a lane has graded the job.
"""
from __future__ import annotations

import hashlib
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Callable, Protocol

from metakernelbench.execute.lane import GradingJob, LaneInfo, LaneSetup, job_for
from metakernelbench.grader import Grader, GraderConfig, Verdict
from metakernelbench.suite.loader import Problem


class LanesClosed(Exception):
    """A submission handed to grading lanes that were closed before a lane took it."""


class LaneFailed(Exception):
    """Lanes that cannot start (no worker comes up, no cluster, a node with other grader code): the message says
    what to fix."""


class LaneLost(Exception):
    """A lane's worker died or stopped answering: what it held is graded again on a fresh one."""


@dataclass(frozen=True)
class LaneStats:
    """One lane now: where it grades, its worker's pid, what it has done; `grading` names the file it holds."""

    index: int
    label: str
    device: str
    cpus: tuple[int, ...]
    host: str
    pid: int
    graded: int
    busy_s: float
    restarts: int
    grading: str | None


@dataclass(frozen=True)
class _Job:
    work: GradingJob
    verdict: Future


class _Lane(Protocol):
    """A started lane worker, local process or Ray actor."""

    info: LaneInfo

    def grade(self, job: GradingJob, timeout_s: float) -> Verdict:
        """The verdict; LaneLost when the worker died or gave none within `timeout_s`; the grader's errors raise."""

    def stop(self, graceful: bool) -> None:
        """Graceful: let the worker close its grader; otherwise (and after that) kill it and its processes."""


class _Slot:
    """A lane's place in the pool and its counters, kept across the workers that fill it."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.lane: _Lane | None = None
        self.info: LaneInfo | None = None
        self.error: LaneFailed | None = None
        self.ready = threading.Event()
        self.graded = self.restarts = 0
        self.busy_s = 0.0
        self.grading: str | None = None


def local_devices() -> list[str]:
    """One device per grading lane: every visible GPU (CUDA_VISIBLE_DEVICES applies), else the CPU."""
    import torch

    return [f"cuda:{i}" for i in range(torch.cuda.device_count())] or ["cpu"]


def split_cpus(cpus: list[int], lanes: int) -> list[tuple[int, ...]]:
    """Equal, disjoint, contiguous shares of `cpus` (neighbouring numbers share a socket); any remainder is left to
    the driver."""
    share = len(cpus) // lanes if lanes > 0 else 0
    if share < 1:
        raise ValueError(f"{lanes} grading lanes need at least {lanes} CPUs, and this process may use {len(cpus)}: "
                         "grade on fewer devices")
    ordered = sorted(cpus)
    return [tuple(ordered[i * share:(i + 1) * share]) for i in range(lanes)]


def hard_timeout(config: GraderConfig) -> float:
    """The longest one grading can honestly take: the submission's session and the baseline's (eager processes and
    torch.compile), each bounded by the grader's total limit, plus the fork server's start. Past it a lane hangs."""
    return config.total_timeout_s * (2 + config.baseline_processes) + 600.0


class Lanes(ABC):
    """A pool of grading lanes behind one queue; duck-types as a grader (`grade`) for trials.

    Returns once every lane's worker is up (LaneFailed when one cannot start). Each job is tried on up to
    `max_attempts` workers of its lane: when all of them died or hung past `hard_timeout_s`, the submission fails
    with a `crash` verdict, as a submission that crashes its own process does. Closing fails the jobs still queued,
    lets the lanes finish the jobs they hold, then closes their graders.
    """

    def __init__(self, count: int, hard_timeout_s: float, max_attempts: int) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, not {max_attempts}")
        self.hard_timeout_s, self.max_attempts = hard_timeout_s, max_attempts
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._slots = [_Slot(i) for i in range(count)]
        # Daemon threads: a lanes object never closed must not keep the process alive at exit.
        self._threads = [threading.Thread(target=self._serve, args=(s,), name=f"mkb-lane-{s.index}", daemon=True)
                         for s in self._slots]
        for thread in self._threads:
            thread.start()
        for slot in self._slots:
            slot.ready.wait()
        failed = next((s.error for s in self._slots if s.error is not None), None)
        if failed is not None:
            self.close()
            raise failed

    @abstractmethod
    def _start(self, index: int) -> _Lane:
        """A fresh worker for lane `index`, up and answering; LaneLost when it cannot start."""

    def __enter__(self) -> "Lanes":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def grade(self, problem: Problem, dsl: str, path: Path) -> Verdict:
        """Grade on the next free lane; blocks the calling thread until done. A grader's exception re-raises here."""
        return self.grade_job(job_for(problem, dsl, path))

    def grade_job(self, work: GradingJob) -> Verdict:
        """`grade` for a job already made self-contained (a Ray actor receives them so)."""
        job = _Job(work, Future())
        with self._lock:
            if self._closed:
                raise LanesClosed("the grading lanes are closed: grade before leaving their `with` block")
            self._jobs.put(job)
        return job.verdict.result()

    def lanes(self) -> list[LaneInfo]:
        """Each lane's current (else last) worker as it reported itself at start."""
        return [s.lane.info if s.lane is not None else s.info for s in self._slots]

    def stats(self) -> list[LaneStats]:
        """Each lane's counters now, for progress and benchmarks."""
        return [LaneStats(s.index, info.label, info.device, info.cpus, info.host, info.pid, s.graded, s.busy_s,
                          s.restarts, s.grading) for s, info in zip(self._slots, self.lanes())]

    def _launch(self, slot: _Slot) -> _Lane:
        errors = []
        for _ in range(self.max_attempts):
            try:
                lane = self._start(slot.index)
            except LaneLost as exc:
                errors.append(str(exc))
                continue
            slot.lane, slot.info = lane, lane.info
            return lane
        raise LaneFailed(f"grading lane {slot.index} could not start ({self.max_attempts} tries): {errors[-1]}")

    def _serve(self, slot: _Slot) -> None:
        try:
            self._launch(slot)
        except LaneFailed as exc:
            slot.error = exc
        finally:
            slot.ready.set()
        if slot.error is not None:
            return
        while (job := self._jobs.get()) is not None:
            slot.grading, started = job.work.name, time.monotonic()
            try:
                job.verdict.set_result(self._grade(slot, job.work))
            except BaseException as exc:  # the caller decides; the lane stays up for the next job
                job.verdict.set_exception(exc)
            finally:
                slot.busy_s += time.monotonic() - started
                slot.grading = None
        if slot.lane is not None:
            slot.lane.stop(graceful=True)

    def _grade(self, slot: _Slot, work: GradingJob) -> Verdict:
        lost = []
        for _ in range(self.max_attempts):
            lane = slot.lane or self._launch(slot)
            try:
                verdict = lane.grade(work, self.hard_timeout_s)
            except LaneLost as exc:
                lost.append(str(exc))
                lane.stop(graceful=False)
                slot.lane = None
                slot.restarts += 1
                continue
            slot.graded += 1
            return verdict
        slot.graded += 1
        digest = hashlib.sha256(work.source.encode()).hexdigest() if work.source is not None else ""
        return Verdict(problem=work.problem_id, dsl=work.dsl, file_sha256=digest, device=slot.info.label,
                       compiled=False, correct=False, passed=False, failed_check="crash",
                       reason=f"the grading process died or hung on each of {len(lost)} fresh graders: {lost[-1]}")

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
            if job is not None:
                job.verdict.set_exception(LanesClosed("the grading lanes closed before this submission was graded"))
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()


def _lane_processes(pid: int) -> list[int]:
    """Every process of the lane whose worker is `pid`, read from /proc: the worker's process group (it and its
    fork server, found even when the worker is already dead) and everything below them (a fork server's children
    sit in sessions of their own)."""
    parents: dict[int, list[int]] = {}
    group = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry))
        if int(fields[2]) == pid:
            group.append(int(entry))
    found, frontier = set(group), list(group)
    while frontier:
        for child in parents.get(frontier.pop(), []):
            if child not in found:
                found.add(child)
                frontier.append(child)
    return sorted(found)


def _visible_device(device: str) -> str:
    """The CUDA_VISIBLE_DEVICES entry of `device` (cuda:N) as this process sees the GPUs."""
    index = int(device.partition(":")[2] or 0)
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return str(index)
    entries = [e.strip() for e in listed.split(",") if e.strip()]
    if index >= len(entries):
        raise ValueError(f"{device} is not among the {len(entries)} GPUs CUDA_VISIBLE_DEVICES={listed} shows")
    return entries[index]


class _LocalLane:
    """A lane worker process on this host, pinned before it imports anything, in a session of its own (the
    terminal's Ctrl-C reaches the driver, which closes the lanes); it dies with the thread that started it."""

    def __init__(self, setup: LaneSetup, env: dict, start_timeout_s: float) -> None:
        ours, theirs = socket.socketpair()
        code = (f"import os, sys; os.sched_setaffinity(0, {set(setup.cpus)!r}); "
                "from metakernelbench.execute.lane import main; main(int(sys.argv[1]), int(sys.argv[2]))")
        self.process = subprocess.Popen([sys.executable, "-c", code, str(theirs.fileno()), str(os.getpid())],
                                        pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
        theirs.close()
        self.conn = Connection(ours.detach())
        self.label = setup.label
        try:
            self.conn.send(setup)
            kind, value = self._reply(start_timeout_s)
        except LaneLost:
            self.stop(graceful=False)
            raise
        if kind != "ready":
            self.stop(graceful=False)
            raise LaneLost(value)
        self.info: LaneInfo = value

    def _reply(self, timeout_s: float) -> tuple[str, object]:
        try:
            if not self.conn.poll(timeout_s):
                raise LaneLost(f"the grader process of lane {self.label} gave no answer within {timeout_s:.0f} s")
            return self.conn.recv()
        except (EOFError, OSError):
            try:
                code = self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            raise LaneLost(f"the grader process of lane {self.label} died (exit code {code})")

    def grade(self, job: GradingJob, timeout_s: float) -> Verdict:
        try:
            self.conn.send(job)
        except OSError:
            pass  # a dead worker: the reply says so
        kind, value = self._reply(timeout_s)
        if kind == "raised":
            raise value
        return value

    def stop(self, graceful: bool) -> None:
        if graceful:
            try:
                self.conn.send(None)
                self.process.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                pass
        for pid in [self.process.pid, *_lane_processes(self.process.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.process.wait()
        self.conn.close()


class GradingLanes(Lanes):
    """Lanes on this host, one per device: a repeated `cpu` makes several CPU lanes, each on its own CPUs; a GPU
    has one lane, so timings never overlap. Each lane sees only its own GPU (CUDA_VISIBLE_DEVICES).

    `make_grader(config)` builds each lane's grader in its worker (tests inject stand-ins; it travels by reference,
    so it must be a module-level callable); each gets `config` with its device.
    """

    def __init__(self, devices: list[str], config: GraderConfig,
                 make_grader: Callable[[GraderConfig], Grader] = Grader, hard_timeout_s: float | None = None,
                 max_attempts: int = 3) -> None:
        if not devices:
            raise ValueError("grading lanes need at least one device, e.g. ['cuda:0'] or ['cpu']")
        gpus = [d if ":" in d else f"{d}:0" for d in devices if d != "cpu"]
        if len(set(gpus)) != len(gpus):
            raise ValueError(f"devices {devices} repeat one: give each GPU one lane, so timings never overlap")
        self.devices = list(devices)
        shares = split_cpus(list(os.sched_getaffinity(0)), len(devices))
        self._setups, self._envs = [], []
        for index, (device, cpus) in enumerate(zip(devices, shares)):
            on_gpu = device != "cpu"
            self._setups.append(LaneSetup(index, device, "cuda:0" if on_gpu else "cpu", cpus, config, make_grader))
            self._envs.append({**os.environ, "CUDA_VISIBLE_DEVICES": _visible_device(device) if on_gpu else ""})
        self._start_timeout_s = config.import_timeout_s
        super().__init__(len(devices), hard_timeout_s or hard_timeout(config), max_attempts)

    def _start(self, index: int) -> _Lane:
        return _LocalLane(self._setups[index], self._envs[index], self._start_timeout_s)


__all__ = ["GradingJob", "GradingLanes", "LaneFailed", "LaneInfo", "LaneLost", "LaneStats", "Lanes", "LanesClosed",
           "hard_timeout", "local_devices", "split_cpus"]
