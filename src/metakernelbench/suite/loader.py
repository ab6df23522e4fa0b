"""Load problem modules from files into one uniform `Problem` record, whatever layout they were written in."""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import re
import textwrap
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
            try:
                made = self.module.make_inputs()
            except (AssertionError, RuntimeError) as exc:
                if torch.cuda.is_available() or not re.search(r"CUDA|NVIDIA|cuda", str(exc)):
                    raise
                raise ProblemError(f"{self.path}: make_inputs() builds its inputs on CUDA and this machine has no "
                                   "GPU: audit and grade it on a GPU machine") from exc
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

    def bytes_moved(self, inputs: tuple, outputs: tuple) -> float | None:
        """What a correct kernel must move, as the problem declares it; None when it declares nothing. Guessing
        from the tensors would count whole cache pools (5-17x what a paged kernel touches upstream) and fail
        honest fast kernels, so only declared formulas set a roofline floor."""
        fn: Callable | None = getattr(self.module, "bytes_moved", None)
        return float(fn(*inputs)) if fn else None


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


def _returned_parameters(module: ModuleType) -> tuple[int, dict[str, int]]:
    """(number of outputs, in-place outputs) of a module that declares neither, read from its reference's `return`
    statements: a returned parameter (upstream returns its updated caches so) is an in-place output, also through
    plain aliases (`counts = num_blocks`, `tables = [t0, t1]` then `tables[0]`). (0, {}) when the returns are not
    literal tuples or names; `mkb audit` checks the inference against the reference's returned objects."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(module.reference)))
    except (OSError, TypeError, SyntaxError):
        return 0, {}
    params = list(inspect.signature(module.reference).parameters)
    aliases: dict[str, object] = {name: name for name in params}  # name -> parameter, or list of parameters

    def resolve(node):
        if isinstance(node, ast.Name):
            return aliases.get(node.id)
        if isinstance(node, (ast.List, ast.Tuple)):
            return [resolve(item) for item in node.elts]
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            seq = resolve(node.value)
            index = node.slice.value
            return seq[index] if isinstance(seq, list) and isinstance(index, int) and -len(seq) <= index < len(seq) \
                else None
        return None

    shapes = []
    for node in ast.walk(tree.body[0]):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            aliases[node.targets[0].id] = resolve(node.value)
        elif isinstance(node, ast.Return) and node.value is not None:
            items = node.value.elts if isinstance(node.value, (ast.Tuple, ast.List)) else [node.value]
            shapes.append([resolve(item) for item in items])
    if not shapes or len({len(names) for names in shapes}) != 1:
        return 0, {}
    inplace = {f"output{i}": params.index(name) for i, name in enumerate(shapes[0])
               if isinstance(name, str) and all(names[i] == name for names in shapes)}
    return len(shapes[0]), inplace


def problem_from_file(path: Path) -> Problem:
    path = Path(path).resolve()
    if path.suffix == ".json":
        raise ProblemError(f"{path}: a SOL-ExecBench recipe, not a problem module: assemble it into a .py module with "
                           "the licensed dataset first (upstream's licenses/README.md)")
    module = _load_module(path)
    for required in ("reference", "make_inputs"):
        if not callable(getattr(module, required, None)):
            raise ProblemError(f"{path}: defines no `{required}` function")
    params = inspect.signature(module.make_inputs).parameters
    published = len(params) == 0
    if published:  # upstream's layout: <family>/<nn>_<stem>.py, nothing declared beyond the constants
        stem = _FOLDER.match(path.stem)
        number, name = (int(stem.group(1)), stem.group(2)) if stem else (0, path.stem)
        family = path.parent.name if path.parent.name in spec.FAMILIES else "unknown"
        count, inplace = _returned_parameters(module)
        outputs = tuple(getattr(module, "OUTPUTS", ())) or tuple(f"output{i}" for i in range(count))
        inplace = dict(getattr(module, "INPLACE", inplace))
    else:
        try:
            spec.check_module(path, module)
        except spec.SpecError as exc:
            raise ProblemError(str(exc)) from exc
        folder = _FOLDER.match(path.parent.name)
        number, name, family = int(folder.group(1)), folder.group(2), module.FAMILY
        outputs, inplace = tuple(module.OUTPUTS), dict(getattr(module, "INPLACE", {}))
    return Problem(
        name=name,
        number=number,
        family=family,
        source_model=getattr(module, "SOURCE_MODEL", "unknown"),
        dtype=getattr(module, "DTYPE", "unknown"),
        description=module.__doc__ or "",
        path=path,
        sizes=tuple(getattr(module, "SIZES", {"default": {}}).keys()),
        outputs=outputs,
        compare=dict(getattr(module, "COMPARE", {})),
        inplace=inplace,
        module=module,
        published_layout=published,
    )


def problem_files(root: Path) -> list[Path]:
    """This suite's layout (`<family>/<nn>_<name>/problem.py`) when the folder has it; otherwise every module of
    upstream's layout below it (`<family>/<nn>_<stem>.py`, recursively; names starting with `_` or `.` skipped)."""
    ours = sorted(p for p in root.rglob("problem.py") if p.parent != root)
    if ours:
        return ours
    return sorted(p for p in root.rglob("*.py")
                  if not any(part.startswith(("_", ".")) for part in p.relative_to(root).parts))


def recipes(root: Path) -> list[Path]:
    """SOL-ExecBench recipes below `root`: problems only once assembled with the licensed dataset."""
    return sorted(Path(root).rglob("*.json"))


def load_suite(suite_path: Path | None = None) -> list[Problem]:
    root = Path(suite_path) if suite_path else default_suite_path()
    if not root.is_dir():
        raise ProblemError(f"suite folder {root} does not exist: pass an existing folder with --suite")
    problems = sorted((problem_from_file(p) for p in problem_files(root)), key=lambda p: (p.number, p.id))
    try:
        spec.check_numbers(problems)
    except spec.SpecError as exc:
        raise ProblemError(str(exc)) from exc
    return problems


def load_problem(which: str, suite_path: Path | None = None) -> Problem:
    """Find a problem by number (`28`), name, id (`mlp_norm/28_fused_add_rmsnorm_h4096_llama31_8b`) or file."""
    if which.endswith((".py", ".json")) and Path(which).is_file():
        return problem_from_file(Path(which))
    problems = load_suite(suite_path)
    matches = [p for p in problems if which in (p.id, p.name, f"{p.number:02d}_{p.name}")
               or (which.isdigit() and int(which) == p.number)]
    if len(matches) != 1:
        known = ", ".join(f"{p.number}:{p.name}" for p in problems)
        reason = "is ambiguous" if matches else "is not in the suite"
        raise ProblemError(f"problem '{which}' {reason}; run `mkb list` (known: {known})")
    return matches[0]
