"""The worker side of a grading lane: a process of its own that owns one Grader, pinned to its device and CPUs.

A lane's process is the only thing that can die with its grader (a crash in the trusted parent, the kernel's OOM
killer, a lost node), so the driver holding the store never does. Jobs reach it as plain data (problem and submission
sources, not paths), so the same worker serves a local lane on this host and a Ray actor on another node.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import pickle
import shutil
import signal
import socket
import tempfile
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Callable

import torch

from metakernelbench.grader import Grader, GraderConfig, Verdict
from metakernelbench.grader.validation import environment
from metakernelbench.protocol.fingerprint import grader_version
from metakernelbench.suite.loader import Problem, problem_from_file

PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class GradingJob:
    """One submission to grade, self-contained: a worker on another node has neither file."""

    problem_id: str
    problem_path: str
    problem_source: str
    dsl: str
    name: str  # the submission's file name, kept for the graded copy
    source: str | None  # None: the driver could not read the file, and the grader says so in its verdict
    path: str


def job_for(problem: Problem, dsl: str, path: Path) -> GradingJob:
    path = Path(path)
    try:
        source = path.read_text()
    except OSError:
        source = None
    return GradingJob(problem.id, str(problem.path), Path(problem.path).read_text(), dsl, path.name, source,
                      str(path))


@dataclass(frozen=True)
class LaneSetup:
    """What a lane's worker is told at start; `make_grader` travels by reference (a module-level callable)."""

    index: int
    label: str  # the lane's device as the driver names it: cuda:3 (graded as cuda:0 behind CUDA_VISIBLE_DEVICES)
    device: str  # the device its grader uses
    cpus: tuple[int, ...]
    config: GraderConfig
    make_grader: Callable[[GraderConfig], Grader] = Grader


@dataclass(frozen=True)
class LaneInfo:
    """A running lane as its worker reports it: where it grades, on which CPUs, under which grader source."""

    index: int
    label: str
    device: str
    cpus: tuple[int, ...]
    pid: int
    host: str
    grader_version: str
    environment: dict


class LaneWorker:
    """Pins this process (its grader's fork server and children inherit the mask) and grades jobs one at a time."""

    def __init__(self, setup: LaneSetup) -> None:
        os.sched_setaffinity(0, setup.cpus)
        # Thread pools sized to the lane's CPUs (Ray sets OMP_NUM_THREADS=1 in its workers otherwise).
        os.environ["OMP_NUM_THREADS"] = str(len(setup.cpus))
        torch.set_num_threads(len(setup.cpus))
        self.grader = setup.make_grader(replace(setup.config, device=setup.device))
        self.info = LaneInfo(setup.index, setup.label, setup.device, tuple(setup.cpus), os.getpid(),
                             socket.gethostname(), grader_version(), environment(setup.device))
        self._scratch = Path(tempfile.mkdtemp(prefix="mkb-lane-"))
        self._problems: dict[tuple[str, str], Problem] = {}

    def _problem(self, job: GradingJob) -> Problem:
        """The job's problem, from its own path where that file has the shipped source, else from a private copy in
        the same family/folder layout (the loader reads the id from the folders)."""
        digest = hashlib.sha256(job.problem_source.encode()).hexdigest()
        key = (job.problem_path, digest)
        if key not in self._problems:
            path = Path(job.problem_path)
            if not (path.is_file() and path.read_text() == job.problem_source):
                path = self._scratch / "problems" / digest / Path(*path.parts[-3:])
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(job.problem_source)
            self._problems[key] = problem_from_file(path)
        return self._problems[key]

    def grade(self, job: GradingJob) -> Verdict:
        problem = self._problem(job)
        if job.source is None:
            return self.grader.grade(problem, job.dsl, Path(job.path))
        folder = Path(tempfile.mkdtemp(dir=self._scratch))
        try:
            (folder / job.name).write_text(job.source)
            return self.grader.grade(problem, job.dsl, folder / job.name)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        self.grader.close()
        shutil.rmtree(self._scratch, ignore_errors=True)


def _portable(exc: Exception) -> Exception:
    """The exception itself where it survives pickling, else a RuntimeError saying what it was."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def main(fd: int, driver: int) -> None:
    """A local lane's process: setup, then jobs, over the pickled connection `fd`; None or a closed driver ends it.

    The worker is killed when the driver's thread that started it ends (PR_SET_PDEATHSIG), so a dead driver leaves
    no lane behind; a driver gone at a reply lets it leave without a traceback."""
    if ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0 or os.getppid() != driver:
        os._exit(0)
    os.set_inheritable(fd, False)
    conn = Connection(fd)
    try:
        setup = conn.recv()
        try:
            worker = LaneWorker(setup)
        except Exception as exc:
            conn.send(("error", f"the lane on {setup.label} failed to start: {type(exc).__name__}: {exc}"))
            return
        conn.send(("ready", worker.info))
        while (job := conn.recv()) is not None:
            try:
                reply = ("verdict", worker.grade(job))
            except Exception as exc:  # the grader's own error: the driver re-raises it to the caller
                reply = ("raised", _portable(exc))
            conn.send(reply)
        worker.close()
    except (EOFError, OSError):
        pass
    finally:
        os._exit(0)
