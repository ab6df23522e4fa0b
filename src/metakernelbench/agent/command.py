"""Command agents: any coding-agent CLI (`command:CMD`) attempts a trial in a sandboxed workspace that holds only its
task, a `submit` script and its own API key, while the harness grades each submission from outside and enforces the
budget (submissions, wall time).

The workspace starts with TASK.md (the chat trial's first message plus how to work here and what the sandbox has)
and `submit`, which sends `kernel.py` over a unix socket to the harness and prints the grader's verdict. The agent
writes its skill to SKILL.md. The agent's whole output and its CLI's own conversation files (HOME is the workspace)
are kept, secrets redacted. An agent that made no submission and exited non-zero, could not start, or reported an
error of its own (a CLI's JSON report) never attempted the task: the trial ends as agent_error, not as a failure.
Isolation, named in the trial's result: bubblewrap where it works ("bwrap": new mount, PID, IPC, UTS and user
namespaces; the system directories and the Python interpreter read-only; the workspace at /workspace; the socket at
/run/mkb; a private /tmp; minimal /proc and /dev; the network kept, for the agent's model API). Otherwise, when the
harness runs as root, the agent runs as the user `nobody` ("user nobody"), refused unless `nobody` cannot reach the
benchmark's package (reference solutions, grader) or the store; file permissions are then all that protects, so any
world-readable copy of the suite elsewhere, and other agents running as `nobody`, stay visible. The agent CLI must be
installed under the system directories to be found in the sandbox.
"""
from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

import importlib.util

import metakernelbench
from metakernelbench.agent.clients import ClientError
from metakernelbench.agent.presets import AgentCommand
from metakernelbench.agent.secrets import redact
from metakernelbench.agent.trial import (DISTILL_PROMPT, TrialResult, audit_skill, feedback, regrade, task_prompt,
                                         trial_result)
from metakernelbench.agent.usage import Prices, cli_report
from metakernelbench.protocol import TrialSpec
from metakernelbench.store import Store

BWRAP = "bwrap"
KERNEL_LIMIT = 1 << 20  # bytes of kernel.py one submission may send
SKILL_LIMIT = 64 << 10  # bytes of SKILL.md the harness reads
OUTPUT_TAIL = 8000  # characters of the agent's output quoted in the transcript
OUTPUT_LIMIT = 32 << 20  # bytes of the agent's whole output kept (compressed), and of each conversation file
CONVERSATIONS = (".claude/projects", ".codex/sessions")  # where the CLIs keep their conversation logs under HOME
DSL_PACKAGES = {"cute": "cutlass", "tirx": "tvm"}
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TOP_LEVEL = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")  # symlinks into /usr on merged-/usr systems
ETC = ("/etc/passwd", "/etc/group", "/etc/hosts", "/etc/resolv.conf", "/etc/nsswitch.conf", "/etc/host.conf",
       "/etc/gai.conf", "/etc/services", "/etc/protocols", "/etc/localtime", "/etc/ld.so.cache", "/etc/ld.so.conf",
       "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/ssl/certs", "/etc/ssl/openssl.cnf", "/etc/ca-certificates")
SANDBOX_WORKSPACE, SANDBOX_SOCKETS = "/workspace", "/run/mkb"

WORKSPACE_GUIDE = """
## Your workspace
This folder is yours; grading happens outside it. Write your module to `kernel.py` here and run `./submit`: it \
grades `kernel.py` and prints the grader's verdict (exit status 0 when it passed, 1 when it failed, 2 when refused). \
You have {submissions} submissions and {wall_s:.0f} seconds in all. Improve correctness first, then speed.
Before you stop, pass or fail, write `SKILL.md`. {distill}

## What this sandbox has
{facts} `./submit` is the only way to run your kernel: it is graded outside, on the benchmark's device.
"""

SUBMIT = '''#!/usr/bin/env python3
"""Sends kernel.py (beside this script) to the grader and prints its verdict; exit 0 passed, 1 failed, 2 refused."""
import os
import socket
import sys

kernel = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.py")
try:
    with open(kernel, "rb") as file:
        code = file.read()
except OSError as exc:
    sys.exit(f"submit: cannot read {{kernel}} ({{exc.strerror}}): write your kernel there first")
try:
    with socket.socket(socket.AF_UNIX) as grader:
        grader.connect({socket_path!r})
        grader.sendall(code)
        grader.shutdown(socket.SHUT_WR)
        reply = b"".join(iter(lambda: grader.recv(1 << 16), b"")).decode()
except OSError as exc:
    sys.exit(f"submit: the grader is not answering ({{exc}}): the trial is over")
status, _, text = reply.partition("\\n")
print(text)
sys.exit(int(status or 2))
'''


class AgentSetupError(ClientError):
    """The agent never really attempted the task (it could not start, authenticate or reach its model)."""


def _recorded(verdict: dict, hide: list[str]) -> dict:
    """A verdict fit for the store: what the kernel printed, with the agent's secrets redacted."""
    return {**verdict, **{tail: redact(verdict.get(tail) or "", hide) for tail in ("stdout_tail", "stderr_tail")}}


class _Submissions:
    """Serves `submit` from outside the sandbox, one submission at a time: grades each kernel until the budget is
    spent, then refuses; records every exchange (a refusal once per distinct text). The agent knows its key, so what
    it sent and what its kernel printed are recorded with `hide` (the key's value) redacted; the file graded, and
    the verdict's file_sha256, are the file as sent."""

    def __init__(self, spec: TrialSpec, grader, problem, store: Store, scratch: Path, listener: socket.socket,
                 on_error, hide: list[str] = ()) -> None:
        self.spec, self.grader, self.problem, self.store, self.scratch = spec, grader, problem, store, scratch
        self.listener, self.on_error, self.hide = listener, on_error, list(hide)
        self.verdicts: list[dict] = []
        self.refused = 0
        self.next_message = 1  # message 0 is TASK.md
        self.error: BaseException | None = None
        self._said: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"mkb-submit-{spec.trial_id}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def record(self, role: str, content: str) -> None:
        self.store.add_message(self.spec.trial_id, self.next_message, role, content)
        self.next_message += 1

    def _serve(self) -> None:
        self.listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                connection, _ = self.listener.accept()
            except TimeoutError:
                continue
            with connection:
                try:
                    connection.settimeout(60)
                    data = b""
                    while len(data) <= KERNEL_LIMIT and (chunk := connection.recv(1 << 16)):
                        data += chunk
                    status, text = self._answer(data)
                    connection.sendall(f"{status}\n{text}".encode())
                except OSError:
                    pass  # the agent hung up or stalled; its next submit gets a fresh connection
                except BaseException as exc:  # the grader or the store failed: end the trial, re-raise in the harness
                    self.error = exc
                    self.on_error()
                    return

    def _answer(self, data: bytes) -> tuple[int, str]:
        budget = self.spec.budget.submissions
        if len(self.verdicts) >= budget:
            return self._refuse(f"refused: the submission budget is spent ({budget} of {budget} used); "
                                "write SKILL.md and stop")
        if len(data) > KERNEL_LIMIT:
            return self._refuse(f"refused: kernel.py is over {KERNEL_LIMIT} bytes; submit a smaller module")
        try:
            code = data.decode()
        except UnicodeDecodeError:
            return self._refuse("refused: kernel.py is not UTF-8 text")
        if not code.strip():
            return self._refuse("refused: kernel.py is empty; write your module into it")
        index = len(self.verdicts)
        path = self.scratch / f"submission_{index:03d}.py"
        path.write_text(code)
        verdict = self.grader.grade(self.problem, self.spec.dsl, path).to_dict()
        kept = redact(code, self.hide)
        self.store.add_submission(self.spec.trial_id, index, kept, _recorded(verdict, self.hide))
        self.verdicts.append(verdict)
        text = feedback(verdict)
        self.record("assistant", f"./submit\n```python\n{kept.rstrip()}\n```")
        self.record("user", redact(text, self.hide))
        return (0 if verdict["passed"] else 1), text

    def _refuse(self, text: str) -> tuple[int, str]:
        self.refused += 1
        if text not in self._said:
            self._said.add(text)
            self.record("assistant", "./submit")
            self.record("user", text)
        return 2, text


def _interpreter_prefix() -> str | None:
    """The harness's Python installation when it lies outside /usr (pyenv, conda), bound so agents can run Python."""
    prefix = os.path.realpath(sys.base_prefix)
    return None if prefix == "/usr" or prefix.startswith("/usr/") else prefix


def _bwrap_argv(workspace: Path, sockets: Path, hidden: list[Path]) -> list[str]:
    args = [BWRAP, "--unshare-all", "--share-net", "--unshare-user", "--disable-userns", "--uid", "65534",
            "--gid", "65534", "--die-with-parent", "--ro-bind", "/usr", "/usr"]
    for path in TOP_LEVEL:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in ETC:
        args += ["--ro-bind-try", path, path]
    bound = [Path("/usr")]
    if prefix := _interpreter_prefix():
        args += ["--ro-bind", prefix, prefix]
        bound.append(Path(prefix))
    # A benchmark installed into a bound prefix (pip install into /usr/local or conda) stays out of sight.
    for path in hidden:
        if any(path.is_relative_to(b) for b in bound):
            args += ["--tmpfs", str(path)]
    return args + ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--bind", str(workspace), SANDBOX_WORKSPACE,
                   "--bind", str(sockets), SANDBOX_SOCKETS, "--chdir", SANDBOX_WORKSPACE]


def _isolation(workspace: Path, sockets: Path, hidden: list[Path]) -> str:
    """'bwrap' where bubblewrap can build this sandbox, else 'user nobody' where that is safe; otherwise the fix."""
    if shutil.which(BWRAP) and subprocess.run(_bwrap_argv(workspace, sockets, hidden) + ["true"],
                                              capture_output=True).returncode == 0:
        return "bwrap"
    if os.geteuid() != 0:
        raise ClientError("command agents need bubblewrap, which is missing or cannot sandbox here: apt-get install "
                          "bubblewrap (and allow unprivileged user namespaces), or run as root to isolate agents "
                          "as the user nobody")
    nobody = pwd.getpwnam("nobody")
    probe = subprocess.run(["/bin/sh", "-c", 'for p; do [ -x "$p" ] && echo "$p"; done', "sh", *map(str, hidden)],
                           capture_output=True, text=True, user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[])
    if probe.stdout.strip():
        raise ClientError(f"bubblewrap is missing or cannot sandbox here, and the fallback user nobody can reach "
                          f"{probe.stdout.splitlines()[0]}: apt-get install bubblewrap, or chmod o-rwx a folder "
                          "above it")
    return "user nobody"


def _read_skill(path: Path) -> str | None:
    """SKILL.md if it is a regular file (never following a link the agent planted), at most SKILL_LIMIT bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = file.read(SKILL_LIMIT).decode(errors="replace").strip()
    return text or None


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def sandbox_facts(isolation: str, dsl: str) -> str:
    """What an agent can use where it runs, stated plainly in TASK.md: under bubblewrap no GPU device exists."""
    bound = [Path("/usr")] + ([Path(prefix)] if (prefix := _interpreter_prefix()) else [])

    def visible(module: str) -> bool:
        found = importlib.util.find_spec(module)
        origin = Path(found.origin or "").resolve() if found is not None and found.origin else None
        return origin is not None and any(origin.is_relative_to(b) for b in bound)

    python = f"Python {sys.version_info.major}.{sys.version_info.minor} (`python3`)"
    have = lambda name, module: f"{name} {'is' if visible(module) else 'is not'} importable"  # noqa: E731
    where = ("There is no GPU here" if isolation == "bwrap" else
             "You run as the user `nobody`: do not use this machine's GPUs, which the grader times on")
    return (f"{where}; the network is there for your model's API. {python} is installed; "
            f"{have('PyTorch', 'torch')} and {have('the DSL package', DSL_PACKAGES.get(dsl, dsl))} here.")


def _sandboxed(isolation: str, workspace: Path, sockets: Path, hidden: list[Path]):
    """(argv prefix, Popen user options, HOME) of a process run in the agent's sandbox."""
    if isolation == "bwrap":
        return _bwrap_argv(workspace, sockets, hidden), {}, SANDBOX_WORKSPACE
    nobody = pwd.getpwnam("nobody")
    return [], {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}, str(workspace)


def _agent_path() -> str:
    prefix = _interpreter_prefix()
    return f"{prefix}/bin:{SYSTEM_PATH}" if prefix else SYSTEM_PATH


def preflight(agent: AgentCommand, store_path: Path) -> str:
    """Check what can be checked before a run's first trial: the named variables are set and the agent's program
    resolves inside the sandbox. Returns the isolation; raises ClientError naming the fix."""
    missing = [key for key in agent.env_keys if key not in os.environ]
    if missing:
        raise ClientError(f"{agent.label.partition(':')[0]}: needs {missing[0]}, which is not set: export it (the "
                          "agent gets it by name), or drop it from --agent-env")
    with tempfile.TemporaryDirectory(prefix="mkb-preflight-", ignore_cleanup_errors=True) as tmp:
        workspace, sockets = Path(tmp, f"workspace-{secrets.token_hex(8)}"), Path(tmp, f"socket-{secrets.token_hex(8)}")
        for folder in (workspace, sockets):
            folder.mkdir(mode=0o700)
        hidden = [Path(metakernelbench.__file__).resolve().parent, Path(store_path).resolve().parent]
        isolation = _isolation(workspace, sockets, hidden)
        if agent.program is None:
            return isolation
        if isolation == "user nobody":
            os.chmod(tmp, 0o711)
            os.chown(workspace, pwd.getpwnam("nobody").pw_uid, -1)
        argv, user, home = _sandboxed(isolation, workspace, sockets, hidden)
        probe = subprocess.run(argv + ["/bin/sh", "-c", 'command -v "$1"', "sh", agent.program], cwd=workspace,
                               env={"PATH": _agent_path(), "HOME": home}, capture_output=True, text=True,
                               stdin=subprocess.DEVNULL, **user)
    if probe.returncode != 0:
        outside = shutil.which(agent.program)
        where = (f"it is installed at {outside}, outside the system folders the sandbox shows: install it under "
                 "/usr or /usr/local (npm install -g as root does)") if outside else \
            "it is not installed: install it under /usr or /usr/local"
        raise ClientError(f"the agent program '{agent.program}' cannot be found inside the sandbox ({isolation}): "
                          f"{where}")
    return isolation


def _read_capped(path: Path, limit: int) -> tuple[str, bool] | None:
    """A regular file's text (never following a link the agent planted), at most `limit` bytes, and whether cut."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = file.read(limit + 1)
    return data[:limit].decode(errors="replace"), len(data) > limit


def _conversations(workspace: Path) -> list[tuple[str, str, bool]]:
    """(name, text, truncated) of the CLIs' own conversation logs under the workspace (the agent's HOME)."""
    found = []
    for folder in CONVERSATIONS:
        root = workspace / folder
        if root.is_dir() and not root.is_symlink():
            for path in sorted(root.rglob("*.jsonl")):
                if (read := _read_capped(path, OUTPUT_LIMIT)) is not None:
                    found.append((path.relative_to(workspace).as_posix(), *read))
    return found


def _setup_failure(exit_status: int, out_of_time: bool, submissions: int, report, tail: str) -> str | None:
    """Why an agent never attempted the task, or None when it did (or may have: killed at the wall budget)."""
    if submissions or out_of_time:
        return None
    last = next((line.strip() for line in reversed(tail.splitlines()) if line.strip()), "no output")[:300]
    if exit_status in (126, 127):
        return f"the agent program could not start (exit status {exit_status}: {last})"
    if report is not None and report.error:
        return f"the agent reported an error before its first submission: {report.error[:300]}"
    if report is not None and report.permission_denials:
        return (f"the agent was refused permission for {report.permission_denials} tool calls and made no submission: "
                "let it run tools without asking (Claude Code: --dangerously-skip-permissions)")
    if exit_status != 0:
        return f"the agent exited with status {exit_status} before its first submission: {last}"
    return None


def run_command_trial(spec: TrialSpec, agent: AgentCommand, grader, problem, store: Store, skill: str | None, *,
                      prices: Prices = Prices()) -> TrialResult:
    """Run `agent` on one trial to its end and record it as `run_trial` records a chat model's trial. The agent's
    environment holds only PATH, HOME, LANG, the agent's fixed variables and those named in `agent.env_keys`.
    Raises AgentSetupError (after recording what the agent printed) when the agent never attempted the task."""
    missing = [key for key in agent.env_keys if key not in os.environ]
    if missing:
        raise ClientError(f"the agent's environment variable {missing[0]} is not set: export it or drop it from "
                          "--agent-env")
    started = time.monotonic()
    budget, hide = spec.budget, agent.secrets()
    with tempfile.TemporaryDirectory(prefix="mkb-agent-", ignore_cleanup_errors=True) as tmp:
        # Unguessable names: under the fallback, other agents running as nobody cannot find this workspace.
        workspace, sockets = Path(tmp, f"workspace-{secrets.token_hex(8)}"), Path(tmp, f"socket-{secrets.token_hex(8)}")
        scratch = Path(tmp, "scratch")
        for folder in (workspace, sockets, scratch):
            folder.mkdir(mode=0o700)
        hidden = [Path(metakernelbench.__file__).resolve().parent, store.path.resolve().parent]
        isolation = _isolation(workspace, sockets, hidden)
        task = task_prompt(problem, spec.dsl, skill) + WORKSPACE_GUIDE.format(
            submissions=budget.submissions, wall_s=budget.wall_s, distill=DISTILL_PROMPT.removeprefix(
                "Your attempt is over. "), facts=sandbox_facts(isolation, spec.dsl))
        store.add_message(spec.trial_id, 0, "user", task)
        socket_path = sockets / "submit.sock"
        argv, user, home = _sandboxed(isolation, workspace, sockets, hidden)
        env = {"PATH": _agent_path(), "LANG": os.environ.get("LANG", "C.UTF-8"), **agent.env,
               **{key: os.environ[key] for key in agent.env_keys}, "HOME": home}
        inside_socket = f"{SANDBOX_SOCKETS}/{socket_path.name}" if isolation == "bwrap" else str(socket_path)
        (workspace / "TASK.md").write_text(task)
        (workspace / "submit").write_text(SUBMIT.format(socket_path=inside_socket))
        (workspace / "submit").chmod(0o755)
        with socket.socket(socket.AF_UNIX) as listener, open(scratch / "output.txt", "wb+") as output:
            listener.bind(str(socket_path))
            listener.listen()
            if isolation == "user nobody":
                nobody = pwd.getpwnam("nobody")
                os.chmod(tmp, 0o711)
                os.chmod(sockets, 0o711)
                for path in (workspace, workspace / "TASK.md", workspace / "submit", socket_path):
                    os.chown(path, nobody.pw_uid, nobody.pw_gid)
            process = subprocess.Popen(argv + ["/bin/sh", "-c", agent.command], cwd=workspace, env=env,
                                       stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                       start_new_session=True, **user)
            server = _Submissions(spec, grader, problem, store, scratch, listener, lambda: _kill_group(process),
                                  hide)
            try:
                process.wait(timeout=max(0.0, budget.wall_s - (time.monotonic() - started)))
                out_of_time = False
            except subprocess.TimeoutExpired:
                out_of_time = True
            finally:
                _kill_group(process)  # the agent at its wall budget, or whatever it left running
                process.wait()
                server.stop()
            if server.error is not None:
                raise server.error
            output.seek(0)
            data = output.read(OUTPUT_LIMIT + 1)
        whole = redact(data[:OUTPUT_LIMIT].decode(errors="replace"), hide)
        store.add_artifact(spec.trial_id, "agent-output.txt", whole, len(data) > OUTPUT_LIMIT)
        for name, text, cut in _conversations(workspace):
            store.add_artifact(spec.trial_id, name, redact(text, hide), cut)
        skill_text = _read_skill(workspace / "SKILL.md")
        skill_text = redact(skill_text, hide) if skill_text else None
        fresh = regrade(spec, grader, problem, store, server.verdicts, lambda i: scratch / f"submission_{i:03d}.py",
                        lambda verdict: _recorded(verdict, hide))
    tail = whole[-OUTPUT_TAIL:]
    status = "killed at the wall budget" if out_of_time else f"exit status {process.returncode}"
    server.record("assistant", f"agent output ({status}; last {len(tail)} of {len(whole)} characters, the whole in "
                               f"`mkb trial {spec.trial_id} --files`):\n{tail}")
    report = cli_report(whole)
    cause = _setup_failure(process.returncode, out_of_time, len(server.verdicts), report, tail)
    if cause is not None:
        raise AgentSetupError(cause)
    if out_of_time:
        stop = "budget: wall time"
    elif len(server.verdicts) >= budget.submissions:
        stop = "budget: submissions"
    elif report is not None and report.max_turns:
        stop = "budget: turns"
    else:
        stop = "agent exited"
    usage = {"wall_s": time.monotonic() - started, "agent_exit_status": process.returncode,
             "refused_submits": server.refused}
    if report is not None:
        cost = report.cost_usd
        if cost is None and agent.api is not None:
            cost = prices.cost(agent.api[0], report.input_tokens, report.cached_tokens, report.output_tokens)
        usage.update(input_tokens=report.input_tokens, output_tokens=report.output_tokens,
                     cached_tokens=report.cached_tokens, cost_usd=cost, agent_turns=report.turns)
    result = trial_result(server.verdicts, None, stop, False, isolation, fresh)
    store.finish_trial(spec.trial_id, asdict(result), skill_text, audit_skill(skill_text) if skill_text else None,
                       usage)
    return result
