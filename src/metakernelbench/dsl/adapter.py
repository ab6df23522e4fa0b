"""The adapter interface and the registry of DSLs."""
from __future__ import annotations

import importlib
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from metakernelbench.dsl.gate import LaunchGate
from metakernelbench.dsl.rules import check_source

DSL_NAMES = ("cute", "tirx")


class UnknownDSL(Exception):
    pass


@dataclass(frozen=True)
class CompileCheck:
    """The outcome of compiling a solution's kernels for one GPU architecture without launching them."""

    path: str
    dsl: str
    arch: str
    ok: bool
    seconds: float
    error: str = ""


class Adapter:
    name: str = ""
    title: str = ""
    package: str = ""
    allowed_roots: tuple[str, ...] = ()
    guide_file: str = ""

    def guide(self) -> str:
        """The DSL section of a variant's task statement (correct for the pinned version)."""
        return (Path(__file__).parent / "guides" / self.guide_file).read_text()

    def check_source(self, source: str, filename: str = "submission.py") -> list[str]:
        return check_source(source, self.allowed_roots, filename)

    def available(self) -> bool:
        try:
            importlib.import_module(self.package)
        except Exception:
            return False
        return True

    def preload(self) -> None:
        """Import the DSL once in the fork server so every child starts with it loaded."""
        importlib.import_module(self.package)

    def install_gate(self, gate: LaunchGate) -> None:
        raise NotImplementedError

    def compile_check(self, path: Path, arch: str, timeout_s: float = 600.0) -> CompileCheck:
        """Compile a reference solution's kernels for `arch` in a fresh process, through its `compile_for(arch)`."""
        started = time.monotonic()
        code = (
            "import importlib.util, sys\n"
            "spec = importlib.util.spec_from_file_location('mkb_compile_check', sys.argv[1])\n"
            "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
            "module.compile_for(sys.argv[2])\n"
        )
        try:
            proc = subprocess.run([sys.executable, "-c", code, str(path), arch], capture_output=True, text=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return CompileCheck(str(path), self.name, arch, False, time.monotonic() - started, "timed out")
        error = "" if proc.returncode == 0 else (proc.stderr or proc.stdout)[-4000:]
        return CompileCheck(str(path), self.name, arch, proc.returncode == 0, time.monotonic() - started, error)


def get_adapter(name: str) -> Adapter:
    from metakernelbench.dsl.cute import CuteAdapter
    from metakernelbench.dsl.tirx import TirxAdapter

    adapters = {"cute": CuteAdapter(), "tirx": TirxAdapter()}
    if name not in adapters:
        raise UnknownDSL(f"unknown DSL '{name}'; choose one of: {', '.join(DSL_NAMES)}")
    return adapters[name]
