"""A fork server: one process imports torch and the DSLs once (≈8 s), then forks a fresh child per submission.

The server never initialises CUDA, so each forked child can. Children start in their own session (so a hang is
killed with its whole process group), in a private temp dir, without secrets in the environment, with rlimits and,
where the platform allows, without network.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass

SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION)|^(OPENAI|ANTHROPIC|AWS|GOOGLE|"
                         r"AZURE|HF|HUGGING|GITHUB|GH|MODAL|WANDB|GEMINI|DEEPSEEK|OPENROUTER)_", re.IGNORECASE)
CLONE_NEWNET = 0x40000000
FILE_SIZE_LIMIT = 1 << 30


def scrubbed_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not SECRET_NAME.search(k)}
    env.update(extra or {})
    return env


def _isolate(job: dict) -> dict:
    """Runs in the freshly forked child, before any submission code."""
    os.setsid()
    os.chdir(job["workdir"])
    for fd, name in ((1, "stdout.txt"), (2, "stderr.txt")):
        out = os.open(os.path.join(job["workdir"], name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, fd)
        os.close(out)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))
    if job.get("memory_limit_bytes"):
        limit = int(job["memory_limit_bytes"])
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    os.environ["TMPDIR"] = job["workdir"]
    os.environ["HOME"] = job["workdir"]
    try:
        network_isolated = ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET) == 0
    except (OSError, AttributeError):
        network_isolated = False
    return {"network_isolated": network_isolated}


def serve(control: socket.socket, dsls: list[str]) -> None:
    import torch  # noqa: F401  (imported once here so children inherit it)

    from metakernelbench.dsl import get_adapter
    from metakernelbench.grader import child

    for name in dsls:
        adapter = get_adapter(name)
        if adapter.available():
            adapter.preload()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    control.sendall(b'{"up": true}\n')
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(control, 1 << 20, 1)
        except OSError:
            return
        if not data:
            return
        job = json.loads(data)
        pid = os.fork()
        if pid == 0:
            control.close()
            sock = socket.socket(fileno=fds[0])
            try:
                job.update(_isolate(job))
                child.serve(sock, job)
            finally:
                os._exit(0)
        os.close(fds[0])
        control.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        _, status = os.waitpid(pid, 0)
        control.sendall(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")


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
            pass_fds=[theirs.fileno()], env=scrubbed_env({"PYTORCH_NVML_BASED_CUDA_CHECK": "1", **(env or {})}),
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

    def close(self) -> None:
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
