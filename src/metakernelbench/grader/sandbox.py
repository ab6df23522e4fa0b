"""What a submission's process may not do, enforced by the kernel where Linux allows it: no secrets in its
environment, no reading the grading processes' environments, no signalling or tracing other processes, no network,
and (where its DSL compiles in-process) no starting programs.

Each measure reports whether it took effect, so a verdict says which isolation it ran under.
"""
from __future__ import annotations

import ctypes
import os
import platform
import re
import resource
import struct

SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION)|^(OPENAI|ANTHROPIC|AWS|GOOGLE|"
                         r"AZURE|HF|HUGGING|GITHUB|GH|MODAL|WANDB|GEMINI|DEEPSEEK|OPENROUTER)_", re.IGNORECASE)
CLONE_NEWNET = 0x40000000
FILE_SIZE_LIMIT = 1 << 30
PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_CAPBSET_DROP = 4, 38, 22, 24
SECCOMP_MODE_FILTER = 2
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC = 1, 1
_SECCOMP_SYSCALL = {"x86_64": 317, "aarch64": 277}
# Syscalls that reach other processes: kill, tkill, tgkill (allowed for the process itself), ptrace,
# process_vm_readv/writev, pidfd_open/pidfd_send_signal/pidfd_getfd.
_SYSCALLS = {
    "x86_64": {"arch": 0xC000003E, "kill": 62, "tkill": 200, "tgkill": 234, "ptrace": 101, "process_vm_readv": 310,
               "process_vm_writev": 311, "pidfd_send_signal": 424, "pidfd_open": 434, "pidfd_getfd": 438,
               "execve": 59, "execveat": 322},
    "aarch64": {"arch": 0xC00000B7, "kill": 129, "tkill": 130, "tgkill": 131, "ptrace": 117, "process_vm_readv": 270,
                "process_vm_writev": 271, "pidfd_send_signal": 424, "pidfd_open": 434, "pidfd_getfd": 438,
                "execve": 221, "execveat": 281},
}
# Capabilities a root-run submission keeps: enough for GPU memory and resource limits, none that reach other
# processes (SYS_PTRACE, KILL), administer the system, or change identity.
_KEPT_CAPS = {0, 1, 3, 14, 23, 24}  # CHOWN, DAC_OVERRIDE, FOWNER, IPC_LOCK, SYS_NICE, SYS_RESOURCE

_libc = ctypes.CDLL(None, use_errno=True)


def scrubbed_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not SECRET_NAME.search(k)}
    env.update(extra or {})
    return env


def protect_this_process() -> bool:
    """Make this (trusted) process's /proc entries, environ included, unreadable to unprivileged processes."""
    return _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0


def _bpf(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def _seccomp_filter(own_pid: int, no_exec: bool) -> bytes | None:
    table = _SYSCALLS.get(platform.machine())
    if table is None:
        return None
    ld_w_abs, jeq, ret = 0x20, 0x15, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    denied = [table[n] for n in ("kill", "tkill", "ptrace", "process_vm_readv", "process_vm_writev",
                                 "pidfd_send_signal", "pidfd_open", "pidfd_getfd")]
    if no_exec:  # no new programs: `system` from a kernel's extern, subprocesses, compilers of foreign code
        denied += [table["execve"], table["execveat"]]
    # Another ABI's syscall numbers (i386 or x32 on x86-64) would dodge the table: refuse them outright.
    prog = [_bpf(ld_w_abs, 0, 0, 4), _bpf(jeq, 1, 0, table["arch"]), _bpf(ret, 0, 0, deny),
            _bpf(ld_w_abs, 0, 0, 0), _bpf(0x35, 0, 1, 0x40000000), _bpf(ret, 0, 0, deny)]
    for nr in denied:
        prog += [_bpf(jeq, 0, 1, nr), _bpf(ret, 0, 0, deny)]
    # tgkill(tgid, tid, sig): allowed only at this process's own threads (Python signals its own threads so).
    prog += [_bpf(jeq, 0, 3, table["tgkill"]), _bpf(ld_w_abs, 0, 0, 16), _bpf(jeq, 1, 0, own_pid),
             _bpf(ret, 0, 0, deny), _bpf(ret, 0, 0, allow)]
    return b"".join(prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _install_seccomp(no_exec: bool) -> bool:
    """On every thread of the process (a spare child already runs CUDA's threads): seccomp(2) with TSYNC, which
    also gives them no_new_privs; prctl, the calling thread's alone, only where a process has one thread."""
    program = _seccomp_filter(os.getpid(), no_exec)
    if program is None or _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    buffer = ctypes.create_string_buffer(program)
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    number = _SECCOMP_SYSCALL.get(platform.machine())
    if number is not None and _libc.syscall(number, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC,
                                            ctypes.byref(fprog)) == 0:
        return True
    if len(os.listdir("/proc/self/task")) != 1:
        return False
    return _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0


def _drop_capabilities() -> bool:
    if os.geteuid() != 0:
        return True
    for cap in range(64):
        if cap not in _KEPT_CAPS:
            _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    with open("/proc/self/status") as status:
        permitted = next(int(line.split()[1], 16) for line in status if line.startswith("CapPrm:"))
    kept = permitted & sum(1 << c for c in _KEPT_CAPS)
    header = struct.pack("Ii", 0x20080522, 0)
    data = struct.pack("IIIIII", kept & 0xFFFFFFFF, kept & 0xFFFFFFFF, 0, kept >> 32, kept >> 32, 0)
    return _libc.capset(ctypes.c_char_p(header), ctypes.c_char_p(data)) == 0


def isolate_child(workdir: str, memory_limit_bytes: int | None, no_exec: bool = False) -> dict:
    """Runs in a freshly forked child before any submission code; returns which measures took effect. In a spare
    child CUDA's own threads exist already: the seccomp filter covers them too; the network namespace and the
    dropped capabilities are the main thread's, the one that runs submission code (threads are refused)."""
    os.setsid()
    os.chdir(workdir)
    for fd, name in ((1, "stdout.txt"), (2, "stderr.txt")):
        out = os.open(os.path.join(workdir, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, fd)
        os.close(out)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))
    if memory_limit_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
    os.environ["TMPDIR"] = workdir
    os.environ["HOME"] = workdir
    isolation = {"network": _libc.unshare(CLONE_NEWNET) == 0}
    isolation["capabilities"] = _drop_capabilities()
    isolation["other_processes"] = _install_seccomp(no_exec)
    if no_exec:
        isolation["no_programs"] = isolation["other_processes"]
    return isolation
