"""Problem specs, checked: a malformed problem fails at load with one line naming its file, the field and the fix.

Without the check a typo is silent: a `COMPARE` key that names no output leaves that output on the default rule, an
`INPLACE` index past the inputs is never enforced, a missing held-out size quietly tests one shape. `check_module`
runs at every load of a problem written in this suite's layout; `check_work` also runs the generator, reference and
roofline formulas at the CPU sizes (`mkb audit`, CI).
"""
from __future__ import annotations

import inspect
import math
import re
from pathlib import Path
from types import ModuleType

import torch

FAMILIES = ("attention", "kv_cache", "linear_attention", "mlp_norm", "moe", "quantization")
REQUIRED_SIZES = ("full", "odd", "cpu", "cpu_odd")  # timed, held-out, and the two CPU sizes CI checks
COMPARE_RULES = ("float", "exact", "fp8_dequant")
FOLDER = re.compile(r"^(\d{2})_([a-z0-9]+(?:_[a-z0-9]+)*)$")
MAKE_INPUTS_PARAMS = ("seed", "device", "size")


class SpecError(Exception):
    """A problem module that breaks the problem contract; the message is one line: file, field, fix."""


def _fail(path: Path, field: str, problem: str, fix: str) -> None:
    raise SpecError(f"{path}: {field}: {problem}; {fix}")


def check_module(path: Path, module: ModuleType) -> None:
    """Static checks of a problem in this suite's layout (`<family>/<nn>_<name>/problem.py`)."""
    folder = FOLDER.match(path.parent.name)
    if not folder:
        _fail(path, "folder", f"'{path.parent.name}' is not <nn>_<name>", "name the folder like 28_fused_add_rmsnorm "
              "(two digits, then lower-case words joined by _)")
    family = path.parent.parent.name
    if family not in FAMILIES:
        _fail(path, "folder", f"the family folder '{family}' is not one of {', '.join(FAMILIES)}",
              "move the problem under its family's folder")
    if getattr(module, "FAMILY", None) != family:
        _fail(path, "FAMILY", f"is {getattr(module, 'FAMILY', None)!r}, the folder says {family!r}",
              f'set FAMILY = "{family}"')
    for name in ("NUMBER", "NAME"):
        if hasattr(module, name):
            _fail(path, name, "is set, but the folder name is the problem's number and name", f"delete {name}")
    for name in ("SOURCE_MODEL", "DTYPE"):
        if not isinstance(getattr(module, name, None), str) or not getattr(module, name):
            _fail(path, name, "is missing", f'set {name} = "..." (see SUITE.md\'s row)')
    for name in ("reference", "make_inputs", "flops", "bytes_moved"):
        if not callable(getattr(module, name, None)):
            _fail(path, name, "is not defined", f"define `{name}` (see DESIGN.md's problem contract)")
    params = tuple(inspect.signature(module.make_inputs).parameters)
    if params != MAKE_INPUTS_PARAMS:
        _fail(path, "make_inputs", f"takes ({', '.join(params)})", "take (seed, device, size)")
    sizes = getattr(module, "SIZES", None)
    if not isinstance(sizes, dict) or not all(isinstance(v, dict) for v in sizes.values()):
        _fail(path, "SIZES", "is not a dict of size name -> dict of dimensions", "declare SIZES = {name: dict(...)}")
    missing = [s for s in REQUIRED_SIZES if s not in sizes]
    if missing:
        _fail(path, "SIZES", f"lacks {', '.join(missing)}", "declare the timed size 'full', a held-out 'odd' and the "
              "CPU sizes 'cpu' and 'cpu_odd'")
    outputs = getattr(module, "OUTPUTS", None)
    if not isinstance(outputs, tuple) or not outputs or not all(isinstance(o, str) for o in outputs):
        _fail(path, "OUTPUTS", "is not a non-empty tuple of names", 'declare OUTPUTS = ("out", ...) in return order')
    if len(set(outputs)) != len(outputs):
        _fail(path, "OUTPUTS", f"repeats a name in {outputs}", "give every output its own name")
    compare = getattr(module, "COMPARE", None)
    if not isinstance(compare, dict):
        _fail(path, "COMPARE", "is missing", "declare one rule per output: COMPARE = {name: rule}")
    for name in compare:
        if name not in outputs:
            _fail(path, "COMPARE", f"names '{name}', which is not an output ({', '.join(outputs)})",
                  "fix the name or the typo")
    for name in outputs:
        if name not in compare:
            _fail(path, "COMPARE", f"has no rule for output '{name}'", f"add '{name}': one of {COMPARE_RULES}")
        _check_rule(path, name, compare[name], outputs)
    if not isinstance(getattr(module, "DEMO", False), bool):
        _fail(path, "DEMO", "is not True or False", "set DEMO = True to put the problem in `mkb demo`, or drop it")
    if getattr(module, "DEMO", False) and not (path.parent / "tirx.py").is_file():
        _fail(path, "DEMO", "is set but the problem has no TIRx reference", "the demo grades TIRx references on "
              "the CPU: add one with CPU_PATH = True, or drop DEMO")
    reference_params = len(inspect.signature(module.reference).parameters)
    inplace = getattr(module, "INPLACE", {})
    if not isinstance(inplace, dict):
        _fail(path, "INPLACE", "is not a dict", "declare INPLACE = {output name: input index}")
    for name, index in inplace.items():
        if name not in outputs:
            _fail(path, "INPLACE", f"names '{name}', which is not an output ({', '.join(outputs)})",
                  "fix the name or the typo")
        if not isinstance(index, int) or not 0 <= index < reference_params:
            _fail(path, "INPLACE", f"'{name}' points at input {index!r}, but reference takes {reference_params}",
                  "give the 0-based index of the input updated in place")


def _check_rule(path: Path, name: str, rule, outputs: tuple) -> None:
    if isinstance(rule, dict):
        if rule.get("rule") != "fp8_dequant":
            _fail(path, "COMPARE", f"'{name}' has the rule {rule!r}", "a dict rule must be {'rule': 'fp8_dequant', "
                  "'scales': <output>, 'group': <int>}")
        if rule.get("scales") not in outputs:
            _fail(path, "COMPARE", f"'{name}' takes its scales from '{rule.get('scales')}', which is not an output",
                  "name the output that holds the scales")
        if not isinstance(rule.get("group"), int) or rule["group"] < 1:
            _fail(path, "COMPARE", f"'{name}' has group {rule.get('group')!r}", "give the quantisation group size")
    elif rule not in ("float", "exact"):
        _fail(path, "COMPARE", f"'{name}' has the unknown rule {rule!r}", f"use one of {COMPARE_RULES}")


def check_numbers(problems) -> None:
    """Numbers are unique across a suite."""
    seen = {}
    for problem in problems:
        if problem.number in seen and not problem.published_layout:
            _fail(problem.path, "number", f"{problem.number:02d} is also {seen[problem.number]}",
                  "give each problem its own number (SUITE.md's numbering)")
        seen.setdefault(problem.number, problem.id)


def check_work(problem) -> list[str]:
    """Run the generator, the reference and the roofline formulas at the CPU sizes; returns one line per fault."""
    faults = []
    params = len(inspect.signature(problem.module.reference).parameters)
    for size in problem.check_sizes("cpu"):
        where = f"{problem.path}: size '{size}'"
        try:
            inputs = problem.make_inputs(1, "cpu", size)
        except Exception as exc:
            faults.append(f"{where}: make_inputs raised {type(exc).__name__}: {exc}")
            continue
        if len(inputs) != params:
            faults.append(f"{where}: make_inputs returns {len(inputs)} inputs, reference takes {params}")
            continue
        outputs = problem.reference(*inputs)
        if problem.outputs and len(outputs) != len(problem.outputs):
            faults.append(f"{where}: reference returns {len(outputs)} outputs, OUTPUTS names {len(problem.outputs)}")
        for name, index in problem.inplace.items():
            position = problem.outputs.index(name)
            if position < len(outputs) and outputs[position] is not inputs[index]:
                faults.append(f"{where}: INPLACE says '{name}' is input {index}, but reference returns another tensor")
        for formula, value in (("flops", problem.flops(inputs)), ("bytes_moved", problem.bytes_moved(inputs, outputs))):
            if value is None or not math.isfinite(value) or value < 0 or (formula == "bytes_moved" and value == 0):
                faults.append(f"{where}: {formula} returns {value}: count what a correct kernel must do "
                              f"({'positive' if formula == 'bytes_moved' else 'zero or more'})")
        if not any(isinstance(t, torch.Tensor) and t.numel() for t in outputs):
            faults.append(f"{where}: the reference returns no non-empty tensor")
    return faults
