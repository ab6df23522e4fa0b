"""Grading lanes on a Ray cluster (the optional `ray` extra): one actor per GPU, each a lane worker on its node.

An actor holds one GPU (`num_gpus=1`, so Ray hands every lane its own device behind CUDA_VISIBLE_DEVICES), pins
itself to its GPU's share of the node's CPUs and owns a Grader whose fork server stays warm between jobs. The driver
only sends self-contained jobs and gets verdicts back, so it alone writes the store; an actor that dies (its grader
crashed, its node is gone) or hangs past the hard timeout is killed and replaced by a new one wherever a GPU is free,
and the job it held is graded again there.
"""
from __future__ import annotations

import logging
import os
from typing import Callable

from metakernelbench.execute import LaneFailed, LaneInfo, LaneLost, Lanes, hard_timeout, split_cpus
from metakernelbench.execute.lane import GradingJob, LaneSetup, LaneWorker
from metakernelbench.grader import Grader, GraderConfig, Verdict
from metakernelbench.protocol.fingerprint import grader_version

RAY_MISSING = "--executor ray needs Ray: install the `ray` extra (pip install 'metakernelbench[ray]')"


def _last_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


class LaneActor:
    """A Ray actor: the lane of the GPU Ray gave it, grading on that GPU (or on the node's CPU, for tests)."""

    def __init__(self, index: int, config: GraderConfig, make_grader: Callable[[GraderConfig], Grader],
                 on_cpu: bool) -> None:
        import ray

        gpu = int(ray.get_gpu_ids()[0])
        node = ray.get_runtime_context().get_node_id()
        gpus = next(int(n["Resources"].get("GPU", 1)) for n in ray.nodes() if n["NodeID"] == node)
        cpus = split_cpus(list(os.sched_getaffinity(0)), gpus)[gpu % gpus]
        label = f"GPU {gpu}" + (" (grading on the CPU)" if on_cpu else "")
        self.worker = LaneWorker(LaneSetup(index, label, "cpu" if on_cpu else "cuda:0", cpus, config, make_grader))

    def info(self) -> LaneInfo:
        return self.worker.info

    def grade(self, job: GradingJob) -> Verdict:
        return self.worker.grade(job)

    def close(self) -> None:
        self.worker.close()


class _RayLane:
    """The driver's handle on one lane actor."""

    def __init__(self, actor_class, args: tuple, start_timeout_s: float) -> None:
        import ray
        from ray.exceptions import GetTimeoutError, RayError

        self._ray = ray
        self.actor = actor_class.remote(*args)
        try:
            self.info: LaneInfo = ray.get(self.actor.info.remote(), timeout=start_timeout_s)
        except GetTimeoutError:
            ray.kill(self.actor)
            raise LaneLost(f"no lane actor started within {start_timeout_s:.0f} s (is a GPU free?)")
        except RayError as exc:
            raise LaneLost(f"the lane actor failed to start: {_last_line(exc)}")

    def grade(self, job: GradingJob, timeout_s: float) -> Verdict:
        from ray.exceptions import RayError, RayTaskError

        ref = self.actor.grade.remote(job)
        ready, _ = self._ray.wait([ref], timeout=timeout_s)
        if not ready:
            raise LaneLost(f"the lane actor on {self.info.host} gave no verdict within {timeout_s:.0f} s")
        try:
            return self._ray.get(ref)
        except RayTaskError:
            raise  # the grader's own error (also an instance of its class), as on a local lane
        except RayError as exc:  # the actor died: killed, its grader crashed, out of memory, its node gone
            raise LaneLost(f"the lane actor on {self.info.host} died ({_last_line(exc)})")

    def stop(self, graceful: bool) -> None:
        if graceful:
            try:
                self._ray.get(self.actor.close.remote(), timeout=120)
            except Exception:  # a lane that cannot close itself is killed below all the same
                pass
        self._ray.kill(self.actor)


class RayLanes(Lanes):
    """One lane per GPU of the Ray cluster at `address`: `auto` (the cluster this machine joined with `ray start`),
    `local` (a private one on this machine, declaring `local_gpus` GPUs, default: those it finds) or HOST:PORT.

    `on_cpu` grades on each actor's CPU while the actor still holds a GPU: with a cluster that declares GPUs it
    does not have, the Ray path runs on a machine without one. Closing disconnects (and stops a `local` cluster).
    """

    def __init__(self, address: str, config: GraderConfig, on_cpu: bool = False, local_gpus: int | None = None,
                 make_grader: Callable[[GraderConfig], Grader] = Grader, hard_timeout_s: float | None = None,
                 max_attempts: int = 3) -> None:
        try:
            import ray
        except ImportError:
            raise LaneFailed(RAY_MISSING) from None
        self._ray = ray
        try:
            if address == "local":  # always a new cluster, even where one is running
                ray.init(address="local", num_gpus=local_gpus, include_dashboard=False, logging_level=logging.ERROR)
            else:
                ray.init(address=address, logging_level=logging.ERROR)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise LaneFailed(f"cannot reach a Ray cluster at --address {address} ({_last_line(exc)}): start one "
                             "with `ray start --head`, or pass --address local for one on this machine") from None
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if gpus < 1:
            ray.shutdown()
            raise LaneFailed(f"the Ray cluster at --address {address} declares no GPU: start its nodes with GPUs "
                             "(`ray start --num-gpus N`)")
        self._args = (config, make_grader, on_cpu)
        self._actor = ray.remote(LaneActor).options(num_gpus=1, num_cpus=0, max_restarts=0, max_task_retries=0)
        self._start_timeout_s = config.import_timeout_s
        self._version = grader_version()
        super().__init__(gpus, hard_timeout_s or hard_timeout(config), max_attempts)

    def _start(self, index: int) -> _RayLane:
        lane = _RayLane(self._actor, (index, *self._args), self._start_timeout_s)
        if lane.info.grader_version != self._version:
            lane.stop(graceful=True)
            raise LaneFailed(f"the node {lane.info.host} runs other grader code than this driver (source hash "
                             f"{lane.info.grader_version[:12]} vs {self._version[:12]}): install this "
                             "metakernelbench on every node")
        return lane

    def close(self) -> None:
        super().close()
        self._ray.shutdown()


__all__ = ["LaneActor", "RAY_MISSING", "RayLanes"]
