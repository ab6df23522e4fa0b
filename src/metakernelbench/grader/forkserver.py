"""A fork server: one process imports torch and the DSLs once (≈8 s), then forks a fresh child per submission.

The server never initialises CUDA, so each forked child can. When the grader says `prepare` (as a grading's child
starts importing), it forks a spare child that starts CUDA for the device ahead and waits; the next job goes to it,
so a grading does not wait for a CUDA start; `await_spare` lets the grader hold its timed calls until the spare is
idle. Children start their own session once they hold a job (so a hang is killed
with its whole process group) and are isolated as `sandbox.isolate_child` says, before any submission code runs.
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
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


class _Spare:
    """A child forked ahead for one device, prepared (`child.prepare`) and waiting on its link for a job."""

    def __init__(self, pid: int, link: socket.socket) -> None:
        self.pid, self.link, self.ready = pid, link, False

    def wait_ready(self, timeout_s: float = 120.0) -> bool:
        """Block until the spare says it is prepared; False when it died or stays silent (then it is killed)."""
        if not self.ready:
            self.link.settimeout(timeout_s)
            try:
                self.ready = self.link.recv(1) == b"R"
            except OSError:
                self.ready = False
            if not self.ready:
                kill_group(self.pid)
        return self.ready

    def take(self, data: bytes, fd: int) -> bool:
        """Hand the spare a job and the socket `fd`; False (and the spare killed) where it did not take it."""
        if not self.wait_ready():
            return False
        try:
            socket.send_fds(self.link, [data], [fd])
            if self.link.recv(1) == b"J":  # taken: a spare that died meanwhile never says so
                return True
        except OSError:
            pass
        kill_group(self.pid)
        return False


def _run_job(job: dict, fd: int, host: dict | None) -> None:
    """In a child: isolate, then serve the job on the socket `fd`; never returns."""
    from metakernelbench.grader import child

    sock = socket.socket(fileno=fd)
    try:
        started = time.perf_counter()
        job["isolation"] = isolate_child(job["workdir"], job.get("memory_limit_bytes"), bool(job.get("no_exec")))
        job["isolate_s"] = time.perf_counter() - started
        child.serve(sock, job, host)
    finally:
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
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    spares: dict[str, _Spare] = {}
    watched: dict[int, int] = {}  # pidfd -> pid of every live child, spares included
    working: set[int] = set()  # pids that were given a job: their exits are reported

    def fork(run) -> int:
        """Fork a child that keeps none of the server's descriptors (control, other children's links, pidfds)."""
        pid = os.fork()
        if pid == 0:
            selector.close()
            control.close()
            for spare in spares.values():
                spare.link.close()
            for pidfd in watched:
                os.close(pidfd)
            run()
        pidfd = os.pidfd_open(pid)
        watched[pidfd] = pid
        selector.register(pidfd, selectors.EVENT_READ)
        return pid

    def spare_main(device: str, ours: socket.socket, theirs: socket.socket) -> None:
        ours.close()  # the server's end: held here too, the link would never tell the spare that the server left
        try:
            host = child.prepare(device)
            theirs.sendall(b"R")
            data, fds, _, _ = socket.recv_fds(theirs, 1 << 20, 1)
        except BaseException:
            os._exit(1)
        if not data or not fds:
            os._exit(0)  # the server left, or handed nothing: no job will come
        theirs.sendall(b"J")
        theirs.close()
        _run_job(json.loads(data), fds[0], host)

    while True:
        for key, _ in selector.select():
            if key.fileobj is not control:
                pidfd = key.fd
                selector.unregister(pidfd)
                pid = watched.pop(pidfd)
                os.close(pidfd)
                _, status = os.waitpid(pid, 0)
                if pid in working:
                    working.discard(pid)
                    _tell(control, json.dumps({"exit": os.waitstatus_to_exitcode(status), "pid": pid}).encode()
                          + b"\n")
                for device, spare in list(spares.items()):
                    if spare.pid == pid:  # a spare that died before any job: the next job forks afresh
                        spare.link.close()
                        del spares[device]
                continue
            try:
                data, fds, _, _ = socket.recv_fds(control, 1 << 20, 1)
            except OSError:
                os._exit(0)
            if not data:  # the grader closed the control socket: leave at once (no slow interpreter teardown)
                os._exit(0)
            message = json.loads(data)
            if message.get("op") == "await_spare":
                spare = spares.get(message["device"])
                ready = spare is not None and spare.wait_ready()
                _tell(control, json.dumps({"spare_ready": ready}).encode() + b"\n")
                continue
            if message.get("op") == "prepare":
                device = message["device"]
                _tell(control, b'{"prepared": true}\n')  # first: one message in flight, so none run together
                if device not in spares:
                    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                    pid = fork(lambda: spare_main(device, ours, theirs))
                    theirs.close()
                    spares[device] = _Spare(pid, ours)
                continue
            job = message
            spare = spares.pop(job["device"], None)
            if spare is not None and spare.take(data, fds[0]):
                pid = spare.pid
            else:
                pid = fork(lambda: _run_job(job, fds[0], None))
            if spare is not None:
                spare.link.close()
            os.close(fds[0])
            working.add(pid)
            _tell(control, json.dumps({"pid": pid}).encode() + b"\n")


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
        self._exits: dict[int, int] = {}
        self._reader = self._control.makefile("rb")
        line = self._reader.readline()
        if not line:
            raise RuntimeError("the fork server failed to start (see its stderr above)")

    def _next(self) -> dict | None:
        """The server's next report; exits are kept by pid, since they arrive whenever a child ends."""
        line = self._reader.readline()
        if not line:
            return None
        report = json.loads(line)
        if "exit" in report:
            self._exits[int(report["pid"])] = int(report["exit"])
        return report

    def spawn(self, job: dict) -> ChildHandle:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        socket.send_fds(self._control, [json.dumps(job).encode()], [theirs.fileno()])
        theirs.close()
        while True:
            report = self._next()
            if report is None:
                raise RuntimeError("the fork server died")
            if "pid" in report and "exit" not in report:
                return ChildHandle(pid=int(report["pid"]), sock=ours)

    def prepare(self, device: str) -> None:
        """Have a spare child for `device` start CUDA now, while nothing is being timed."""
        self._control.sendall(json.dumps({"op": "prepare", "device": device}).encode())
        while (report := self._next()) is not None and "prepared" not in report:
            pass

    def await_spare(self, device: str) -> None:
        """Return once the spare for `device` (if one is being prepared) is ready: nothing it does overlaps what
        follows (timed calls)."""
        self._control.sendall(json.dumps({"op": "await_spare", "device": device}).encode())
        while (report := self._next()) is not None and "spare_ready" not in report:
            pass

    def reap(self, handle: ChildHandle) -> int:
        """Wait for the child's exit code (the server reports it); kills the child's process group first."""
        kill_group(handle.pid)
        handle.sock.close()
        while handle.pid not in self._exits:
            if self._next() is None:
                return -1
        return self._exits.pop(handle.pid)

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
