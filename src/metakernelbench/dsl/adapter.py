"""The adapter interface: everything the benchmark knows about one DSL, in one class per DSL."""
from __future__ import annotations

import importlib
import importlib.metadata
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from metakernelbench.dsl.gate import LaunchGate
from metakernelbench.dsl.rules import DslRules, check_source


@dataclass(frozen=True)
class CompileCheck:
    """The outcome of compiling a solution's kernels for one GPU architecture without launching them."""

    path: str
    dsl: str
    arch: str
    ok: bool
    seconds: float
    error: str = ""


@dataclass(frozen=True)
class CompileJob:
    """One file to compile-check: `compile_for(arch, sizes)` is called with the problem's GPU sizes (dicts of dims)."""

    key: str
    path: str
    sizes: tuple[dict, ...]


class Adapter:
    name: str = ""
    title: str = ""
    package: str = ""  # imported to tell whether the DSL is installed, and preloaded by the fork server
    allowed_roots: tuple[str, ...] = ()  # import roots a submission in this DSL may use (besides the common ones)
    exclusive_roots: tuple[str, ...] = ()  # roots that are this DSL's own kernel machinery: forbidden elsewhere
    distributions: tuple[str, ...] = ()  # pip distributions whose versions key the validation ledger
    leak_identifiers: tuple[str, ...] = ()  # regex alternatives: a skill containing one carries code
    guide_file: str = ""
    # Static-rule facts: restricted namespaces (dotted path -> the members a submission may use), attribute names
    # refused on any object, and the extern-call functions whose callee must be a literal math name.
    namespaces: dict[str, frozenset[str]] = {}
    forbidden_attributes: dict[str, str] = {}
    extern_calls: frozenset[str] = frozenset()
    # Whether torch operators running inside this DSL's launches are the DSL's own work (a DSL whose kernels are
    # Python over tensors); where not (a compiled DSL, whose launches run no torch of their own), the logged calls
    # count them as eager compute like any other, so a host callback inside a launch buys nothing.
    launches_run_torch: bool = True
    # Whether compiling and launching this DSL's kernels starts other programs (a compiler binary); where not, the
    # child may start none, so `system` from a kernel extern or a foreign-code compiler fails at the kernel.
    spawns_programs: bool = True

    def guide(self) -> str:
        """The DSL section of a variant's task statement (correct for the pinned version)."""
        return (Path(__file__).parent / "guides" / self.guide_file).read_text()

    def check_source(self, source: str, filename: str = "submission.py") -> list[str]:
        return check_source(source, self.rules(), filename)

    def rules(self) -> DslRules:
        return DslRules(self.allowed_roots, dict(self.namespaces), dict(self.forbidden_attributes), self.extern_calls)

    def available(self) -> bool:
        try:
            importlib.import_module(self.package)
        except Exception:
            return False
        return True

    def preload(self) -> None:
        """Import the DSL once in the fork server so every child starts with it loaded."""
        importlib.import_module(self.package)

    def versions(self) -> dict[str, str | None]:
        found = {}
        for dist in self.distributions:
            try:
                found[dist] = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                found[dist] = None
        return found

    def install_gate(self, gate: LaunchGate) -> None:
        raise NotImplementedError

    def compile_checks(self, jobs: list[CompileJob], arch: str, timeout_s: float = 1800.0) -> list[CompileCheck]:
        """Compile many solutions for `arch` in ONE fresh process (the DSL's import is paid once), each through its
        `compile_for(arch, sizes)`. A crash or timeout fails the file in flight and every file after it."""
        request = json.dumps({"arch": arch, "jobs": [job.__dict__ for job in jobs]})
        started = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, "-m", "metakernelbench.dsl.compile_worker"], input=request,
                                  capture_output=True, text=True, timeout=timeout_s)
            stdout, tail = proc.stdout, (proc.stderr or "")[-4000:]
        except subprocess.TimeoutExpired as exc:
            stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            tail = f"timed out after {timeout_s:.0f} s"
        done = {}
        for line in stdout.splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                done[row["key"]] = row
        checks = []
        for job in jobs:
            row = done.get(job.key)
            if row is None:
                checks.append(CompileCheck(job.path, self.name, arch, False, time.monotonic() - started,
                                           f"the compile process ended before this file: {tail}"))
            else:
                checks.append(CompileCheck(job.path, self.name, arch, row["ok"], row["seconds"], row["error"]))
        return checks
