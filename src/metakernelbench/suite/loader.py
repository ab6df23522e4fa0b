"""Load problem modules from files into one uniform `Problem` record, whatever layout they were written in."""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import torch

from metakernelbench.suite import spec
from metakernelbench.suite.bundle import bundle_source, bundled_file

_FOLDER = re.compile(r"^(\d+)_(\w+)$")


class ProblemError(Exception):
    """A problem that cannot be found or does not honour the problem contract."""


def default_suite_path() -> Path:
    return Path(__file__).resolve().parent


@dataclass(frozen=True)
class Problem:
    """One fused subgraph: semantics (`reference`), a seeded input generator, and its numeric contract."""

    name: str
    number: int
    family: str
    source_model: str
    dtype: str
    description: str
    path: Path
    sizes: tuple[str, ...]
    outputs: tuple[str, ...]
    compare: dict[str, Any]
    inplace: dict[str, int]
    module: ModuleType = field(repr=False, compare=False)
    published_layout: bool = False

    @property
    def id(self) -> str:
        return f"{self.family}/{self.number:02d}_{self.name}"

    @property
    def summary(self) -> str:
        return self.description.strip().splitlines()[0] if self.description.strip() else self.name

    def solution_path(self, dsl: str) -> Path:
        """The hidden reference solution as written (it imports the DSL's kit: see `graded_solution`)."""
        return self.path.parent / f"{dsl}.py"

    def graded_solution(self, dsl: str) -> Path:
        """The reference with its kit inlined: the self-contained file the grader grades and records vouch for."""
        return bundled_file(self.solution_path(dsl))

    def solution_sha256(self, dsl: str) -> str:
        return hashlib.sha256(bundle_source(self.solution_path(dsl)).encode()).hexdigest()

    def solution_runs_on_cpu(self, dsl: str) -> bool:
        """References that also build for the host say so (`CPU_PATH = True`): the demo and CI grade those."""
        path = self.solution_path(dsl)
        if not path.is_file():
            return False
        return any(isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "CPU_PATH" for t in node.targets)
                   and getattr(node.value, "value", None) is True for node in ast.parse(path.read_text()).body)

    def gpu_size_dims(self) -> list[dict]:
        """The dimensions of every GPU size, in order: what a reference's `compile_for` compiles for."""
        sizes = getattr(self.module, "SIZES", {})
        return [dict(sizes[s]) for s in self.check_sizes("cuda") if isinstance(sizes.get(s), dict)]

    def load_solution(self, dsl: str) -> ModuleType:
        """Import the graded reference solution: trusted code, for benchmarks and tests (the grader imports
        candidates in its child)."""
        return _load_module(self.graded_solution(dsl))

    def check_sizes(self, device_type: str) -> tuple[str, ...]:
        """Sizes checked for correctness: the CPU ones on a CPU, the others on a GPU; several catch hard-coded shapes."""
        on_cpu = [s for s in self.sizes if s.startswith("cpu")]
        on_gpu = [s for s in self.sizes if not s.startswith("cpu")]
        chosen = on_cpu if device_type == "cpu" else on_gpu
        return tuple(chosen or self.sizes)

    def timed_size(self, device_type: str) -> str:
        return self.check_sizes(device_type)[0]

    def make_inputs(self, seed: int, device: str, size: str) -> tuple:
        if self.published_layout:
            torch.manual_seed(seed)
            made = self.module.make_inputs()
            made = tuple(made) if isinstance(made, (list, tuple)) else (made,)
            return tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in made)
        made = self.module.make_inputs(seed, device, size)
        return tuple(made) if isinstance(made, (list, tuple)) else (made,)

    def reference(self, *inputs) -> tuple:
        out = self.module.reference(*inputs)
        return tuple(out) if isinstance(out, (list, tuple)) else (out,)

    def flops(self, inputs: tuple) -> float:
        fn: Callable | None = getattr(self.module, "flops", None)
        return float(fn(*inputs)) if fn else 0.0

    def bytes_moved(self, inputs: tuple, outputs: tuple) -> float:
        fn: Callable | None = getattr(self.module, "bytes_moved", None)
        if fn:
            return float(fn(*inputs))
        tensors = [t for t in (*inputs, *outputs) if isinstance(t, torch.Tensor)]
        return float(sum(t.numel() * t.element_size() for t in tensors))


def _load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"mkb_problem_{abs(hash(str(path)))}", path)
    if spec is None or spec.loader is None:
        raise ProblemError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ProblemError(f"{path}: failed to import ({type(exc).__name__}: {exc})") from exc
    return module


def problem_from_file(path: Path) -> Problem:
    path = Path(path).resolve()
    module = _load_module(path)
    for required in ("reference", "make_inputs"):
        if not callable(getattr(module, required, None)):
            raise ProblemError(f"{path}: defines no `{required}` function")
    params = inspect.signature(module.make_inputs).parameters
    published = len(params) == 0
    if not published:
        try:
            spec.check_module(path, module)
        except spec.SpecError as exc:
            raise ProblemError(str(exc)) from exc
    folder = _FOLDER.match(path.parent.name)
    number = int(getattr(module, "NUMBER", folder.group(1) if folder else 0))
    name = getattr(module, "NAME", folder.group(2) if folder else path.stem)
    family = getattr(module, "FAMILY", path.parent.parent.name if path.parent.parent.name in spec.FAMILIES else "unknown")
    sizes = tuple(getattr(module, "SIZES", {"default": {}}).keys())
    outputs = tuple(getattr(module, "OUTPUTS", ()))
    compare = dict(getattr(module, "COMPARE", {}))
    return Problem(
        name=name,
        number=number,
        family=family,
        source_model=getattr(module, "SOURCE_MODEL", "unknown"),
        dtype=getattr(module, "DTYPE", "unknown"),
        description=module.__doc__ or "",
        path=path,
        sizes=sizes,
        outputs=outputs,
        compare=compare,
        inplace=dict(getattr(module, "INPLACE", {})),
        module=module,
        published_layout=published,
    )


def load_suite(suite_path: Path | None = None) -> list[Problem]:
    root = Path(suite_path) if suite_path else default_suite_path()
    if not root.is_dir():
        raise ProblemError(f"suite folder {root} does not exist: pass an existing folder with --suite")
    files = sorted(p for p in root.rglob("problem.py") if p.parent != root) or sorted(p for p in root.glob("*.py") if not p.name.startswith("_"))
    problems = sorted((problem_from_file(p) for p in files), key=lambda p: (p.number, p.id))
    try:
        spec.check_numbers(problems)
    except spec.SpecError as exc:
        raise ProblemError(str(exc)) from exc
    return problems


def load_problem(spec: str, suite_path: Path | None = None) -> Problem:
    """Find a problem by number (`38`), name (`fused_add_rmsnorm`), id (`mlp_norm/38_fused_add_rmsnorm`) or file."""
    if spec.endswith(".py") and Path(spec).is_file():
        return problem_from_file(Path(spec))
    problems = load_suite(suite_path)
    matches = [p for p in problems if spec in (p.id, p.name, f"{p.number:02d}_{p.name}")
               or (spec.isdigit() and int(spec) == p.number)]
    if len(matches) != 1:
        known = ", ".join(f"{p.number}:{p.name}" for p in problems)
        reason = "is ambiguous" if matches else "is not in the suite"
        raise ProblemError(f"problem '{spec}' {reason}; run `mkb list` (known: {known})")
    return matches[0]
