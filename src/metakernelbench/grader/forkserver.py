"""A fork server: one process imports torch and the DSLs once (≈8 s), then forks a fresh child per submission.

The server never initialises CUDA, so each forked child can. Children start in their own session (so a hang is
killed with its whole process group) and are isolated as `sandbox.isolate_child` says.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass

from metakernelbench.grader.sandbox import isolate_child, protect_this_process, scrubbed_env

# Thread pools (OpenMP's for ATen, TVM's for TIRx host kernels) sleep at once after a parallel region instead of
# spinning, so the child can demand that no thread runs between `solve` returning and the output report.
IDLE_POOLS = {"OMP_WAIT_POLICY": "PASSIVE", "TVM_THREAD_POOL_SPIN_COUNT": "0"}


def _tell(control: socket.socket, message: bytes) -> None:
    """Report to the grader; a grader that is gone (killed, say) leaves nothing to serve: exit without a traceback."""
    try:
        control.sendall(message)
    except OSError:
        os._exit(0)


def serve(control: socket.socket, dsls: list[str]) -> None:
    import torch  # noqa: F401  (imported once here so children inherit it)

    from metakernelbench.dsl import get_adapter
    from metakernelbench.dsl.rules import torch_namespaces
    from metakernelbench.grader import child

    child.prime()
    torch_namespaces()  # the static rules' view of torch, computed once for every child

    for name in dsls:
        adapter = get_adapter(name)
        if adapter.available():
            adapter.preload()
    protect_this_process()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _tell(control, b'{"up": true}\n')
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(control, 1 << 20, 1)
        except OSError:
            os._exit(0)
        if not data:  # the grader closed the control socket: leave at once (no slow interpreter teardown)
            os._exit(0)
        job = json.loads(data)
        pid = os.fork()
        if pid == 0:
            control.close()
            sock = socket.socket(fileno=fds[0])
            try:
                job["isolation"] = isolate_child(job["workdir"], job.get("memory_limit_bytes"),
                                                 bool(job.get("no_exec")))
                child.serve(sock, job)
            finally:
                os._exit(0)
        os.close(fds[0])
        _tell(control, json.dumps({"pid": pid}).encode() + b"\n")
        _, status = os.waitpid(pid, 0)
        _tell(control, json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")


@dataclass
class ChildHandle:
    pid: int
    sock: socket.socket


class ForkServer:
    """The parent's handle on a fork server process: start it once, then spawn one child per submission."""

    def __init__(self, dsls: list[str], env: dict | None = None) -> None:
        self.dsls = dsls
        self._control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.process = subprocess.Popen(
            [sys.executable, "-c", "import sys; from metakernelbench.grader.forkserver import main; main(sys.argv[1:])",
             str(theirs.fileno()), *dsls],
            pass_fds=[theirs.fileno()], env=scrubbed_env({**IDLE_POOLS, "PYTORCH_NVML_BASED_CUDA_CHECK": "1", **(env or {})}),
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self._reader = self._control.makefile("rb")
        line = self._reader.readline()
        if not line:
            raise RuntimeError("the fork server failed to start (see its stderr above)")

    def spawn(self, job: dict) -> ChildHandle:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        socket.send_fds(self._control, [json.dumps(job).encode()], [theirs.fileno()])
        theirs.close()
        reply = json.loads(self._reader.readline())
        return ChildHandle(pid=int(reply["pid"]), sock=ours)

    def reap(self, handle: ChildHandle) -> int:
        """Wait for the child's exit code (the server reports it); kills the child's process group first."""
        kill_group(handle.pid)
        handle.sock.close()
        line = self._reader.readline()
        return int(json.loads(line)["exit"]) if line else -1

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        self._reader.close()
        self._control.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def kill_group(pid: int) -> None:
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
        except (ProcessLookupError, PermissionError):
            pass


def main(argv: list[str]) -> None:
    serve(socket.socket(fileno=int(argv[0])), argv[1:])
