"""Suite audit (threat 14): every output must vary with the seed and must not be near-constant.

A problem whose outputs barely depend on the inputs lets a submission return constants and pass; the audit
rejects such problems before any agent sees them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from metakernelbench.suite.loader import Problem

MIN_CHANGED_FRACTION = 0.05
MIN_DISTINCT_VALUES = 32
MIN_RELATIVE_SPREAD = 1e-3


@dataclass(frozen=True)
class OutputAudit:
    problem: str
    size: str
    output: str
    changed_fraction: float
    distinct_values: int
    relative_spread: float
    passed: bool
    reason: str


def _as_comparable(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float64) if t.dtype.is_floating_point else t.to(torch.int64)


def audit_problem(problem: Problem, device: str = "cpu", seeds: tuple[int, int] = (1, 2)) -> list[OutputAudit]:
    results = []
    sizes = problem.check_sizes(torch.device(device).type)
    for size in sizes:
        runs = []
        for seed in seeds:
            inputs = tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in problem.make_inputs(seed, device,
                                                                                                     size))
            runs.append(problem.reference(*inputs))
        names = list(problem.outputs) or [f"output{i}" for i in range(len(runs[0]))]
        returned = {names[i]: j for i, out in enumerate(runs[-1]) for j, t in enumerate(inputs) if out is t}
        if returned != problem.inplace:
            results.append(OutputAudit(problem.id, size, "in-place outputs", 1.0, 0, 0.0, False,
                                       f"the reference returns inputs as outputs {returned}, but the problem's "
                                       f"in-place outputs are {problem.inplace}: declare INPLACE to match"))
        for name, a, b in zip(names, runs[0], runs[1]):
            floating = a.dtype.is_floating_point
            a, b = _as_comparable(a), _as_comparable(b)
            changed = float((a != b).double().mean()) if a.shape == b.shape else 1.0
            flat = a.flatten()
            distinct = int(torch.unique(flat).numel())
            scale = float(flat.abs().max()) if flat.numel() else 0.0
            spread = float(flat.double().std() / scale) if scale > 0 and flat.numel() > 1 else 0.0
            reasons = []
            if changed < MIN_CHANGED_FRACTION:
                reasons.append(f"only {changed:.1%} of elements change with the seed")
            # few distinct values is what an index, a mask or a group id has: integers answer to the change rule
            if floating and distinct < min(MIN_DISTINCT_VALUES, flat.numel() // 2):
                reasons.append(f"only {distinct} distinct values")
            if spread < MIN_RELATIVE_SPREAD:
                reasons.append(f"near-constant (std/max {spread:.2g})")
            results.append(OutputAudit(problem.id, size, name, changed, distinct, spread, not reasons,
                                       "; ".join(reasons)))
    return results
