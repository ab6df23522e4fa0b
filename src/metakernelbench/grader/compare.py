"""Correctness rules, run in the trusted parent: fp64-anchored float budgets, exact integers, FP8 within one step.

Float rule: each element's error against an fp64 reference, measured relative to |ref| + rms (the low-precision
reference's root mean square: tiny elements are judged on the output's own scale, not exempted), may be at most BUDGET_FACTOR times the worst such
error of the low-precision reference, floored at FLOOR_FACTOR·eps of the output dtype (so a reference that happens
to be exact does not demand bit-exactness). The L2 norm of the error obeys the same factor, which catches wholesale
precision downgrades that stay under the elementwise bound. The check's own arithmetic is fp32 for 16-bit outputs and
fp64 otherwise: at least 2^16 times finer than the rounding it judges.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

BUDGET_FACTOR = 8.0
FLOOR_FACTOR = 0.5  # half an ulp: the largest error of a correctly rounded result
CHUNK_ELEMENTS = 1 << 24  # 128 MiB of fp64 (64 MiB of fp32) per operand and chunk: few launches, bounded memory


@dataclass(frozen=True)
class OutputCheck:
    """How one output of one draw compared with the reference."""

    name: str
    rule: str
    passed: bool
    error: float
    budget: float
    reason: str = ""


def _eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps if dtype.is_floating_point else 0.0


def _structure(name: str, got: torch.Tensor, want: torch.Tensor, rule: str) -> OutputCheck | None:
    if got.dtype != want.dtype:
        return OutputCheck(name, rule, False, float("inf"), 0.0, f"dtype {got.dtype} != expected {want.dtype}")
    if tuple(got.shape) != tuple(want.shape):
        return OutputCheck(name, rule, False, float("inf"), 0.0,
                           f"shape {tuple(got.shape)} != expected {tuple(want.shape)}")
    return None


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The arithmetic of a check: fp32 for 16-bit outputs (2^16 times finer than their rounding, half the bytes of
    fp64), fp64 for wider ones."""
    return torch.float32 if dtype.itemsize <= 2 else torch.float64


def _chunks(tensor: torch.Tensor, dtype: torch.dtype = torch.float64):
    """(flat offset, chunk in `dtype`) of a tensor, CHUNK_ELEMENTS at a time: a check's extra memory stays a few
    chunks, never several wide copies of a whole output."""
    flat = tensor.reshape(-1)
    for start in range(0, flat.numel(), CHUNK_ELEMENTS):
        yield start, flat[start:start + CHUNK_ELEMENTS].to(dtype)


def _pieces(ref64, dtype: torch.dtype):
    """The fp64 reference in flat pieces of `dtype`: a whole tensor chunked, or an anchor computed slice by slice
    (`pieces()`), never held whole."""
    if isinstance(ref64, torch.Tensor):
        yield from _chunks(ref64, dtype)
        return
    for start, piece in ref64.pieces():
        yield start, piece.to(dtype)


def check_float(name: str, got: torch.Tensor, ref_lp: torch.Tensor, ref64) -> OutputCheck:
    """`ref64` is an fp64 tensor, or anything with its `shape` and `pieces()` (read once)."""
    bad = _structure(name, got, ref_lp, "float")
    if bad:
        return bad
    shape = tuple(ref64.shape)
    numel = math.prod(shape)
    if numel == 0:
        return OutputCheck(name, "float", True, 0.0, 0.0)
    work, eps = _work_dtype(got.dtype), _eps(got.dtype)
    # The output's scale from the low-precision reference (within its rounding of the fp64 one's), so the fp64
    # anchor is read once. Every statistic stays on the device until one read at the end: a host sync per piece
    # costs more than the arithmetic on a GPU (a sliced anchor has dozens of pieces per output).
    typical = (float(sum(torch.dot(c, c).double() for _, c in _chunks(ref_lp, work))) / numel) ** 0.5
    got_flat, lp_flat = got.reshape(-1), ref_lp.reshape(-1)
    stats = []
    for start, r in _pieces(ref64, work):
        end = start + r.numel()
        g, lp = torch.sub(got_flat[start:end], r), torch.sub(lp_flat[start:end], r)  # widened exactly, then in `work`
        scale = r.abs().add_(typical)
        sums = (torch.dot(g, g), torch.dot(lp, lp), torch.dot(r, r))
        worst, at = g.abs_().div_(scale).max(0)  # NaN propagates: a non-finite output makes its piece's worst NaN
        stats.append(torch.stack([t.double() for t in (worst, at + start, r[at], lp.abs_().div_(scale).max(),
                                                       *sums)]))
    rows = torch.stack(stats).tolist()
    worst, worst_at, worst_ref = max(rows, key=lambda row: (math.isnan(row[0]), row[0]))[:3]
    if not math.isfinite(worst):
        count = sum(int((~torch.isfinite(c)).sum()) for _, c in _chunks(got, work))
        reason = (f"{count} non-finite values (NaN/Inf)" if count else
                  "the error is not finite where the fp64 reference is not")
        return OutputCheck(name, "float", False, float("inf"), 0.0, reason)
    worst_at = int(worst_at)
    lp_worst = max(row[3] for row in rows)
    err_sq, lp_sq, square_sum = (sum(row[k] for row in rows) for k in (4, 5, 6))
    budget = BUDGET_FACTOR * max(lp_worst, FLOOR_FACTOR * eps)
    if worst > budget:
        idx, rest = [], worst_at
        for extent in reversed(shape):  # torch.unravel_index would import sympy (a second) for one message
            rest, i = divmod(rest, extent)
            idx.insert(0, i)
        idx = tuple(idx)
        return OutputCheck(name, "float", False, worst, budget,
                           f"error {worst:.3g} > budget {budget:.3g} (relative to |ref| + rms) at index {idx}: "
                           f"got {float(got_flat[worst_at]):.6g}, expected {worst_ref:.6g}")
    norm_ref = square_sum ** 0.5
    err_l2 = err_sq ** 0.5
    budget_l2 = BUDGET_FACTOR * max(lp_sq ** 0.5, FLOOR_FACTOR * eps * norm_ref)
    if err_l2 > budget_l2:
        return OutputCheck(name, "float", False, err_l2, budget_l2,
                           f"L2 error {err_l2:.3g} > budget {budget_l2:.3g} (precision too low overall)")
    return OutputCheck(name, "float", True, worst, budget)


def check_exact(name: str, got: torch.Tensor, want: torch.Tensor) -> OutputCheck:
    bad = _structure(name, got, want, "exact")
    if bad:
        return bad
    same = got.view(torch.uint8) == want.view(torch.uint8) if got.dtype.is_floating_point else got == want
    mismatched = int((~same).sum())
    if mismatched:
        return OutputCheck(name, "exact", False, float(mismatched), 0.0, f"{mismatched} elements differ (exact match required)")
    return OutputCheck(name, "exact", True, 0.0, 0.0)


def e4m3_step(magnitude: torch.Tensor) -> torch.Tensor:
    """Spacing of float8_e4m3fn numbers at |value| (3 mantissa bits; subnormal spacing 2^-9)."""
    exponent = torch.floor(torch.log2(magnitude.clamp(min=2.0 ** -6)))
    return torch.pow(2.0, exponent - 3)


def check_fp8_dequant(name: str, got: torch.Tensor, got_scales: torch.Tensor, ref_q: torch.Tensor,
                      ref_scales: torch.Tensor, group: int) -> OutputCheck:
    bad = _structure(name, got, ref_q, "fp8_dequant")
    if bad:
        return bad
    if tuple(got_scales.shape) != tuple(ref_scales.shape):
        return OutputCheck(name, "fp8_dequant", False, float("inf"), 0.0, "scales have the wrong shape")
    if got.dtype == torch.uint8:  # e4m3 codes stored as their bit patterns (a uint8 cache)
        got, ref_q = got.view(torch.float8_e4m3fn), ref_q.view(torch.float8_e4m3fn)
    q, q_ref = got.to(torch.float64), ref_q.to(torch.float64)
    # Where the reference holds NaN codes (arbitrary bytes of cache slots nothing writes) the bytes must be kept.
    kept = torch.isnan(q_ref)
    if not torch.equal(got.view(torch.uint8)[kept], ref_q.view(torch.uint8)[kept]):
        return OutputCheck(name, "fp8_dequant", False, float("inf"), 0.0, "NaN codes of the reference were changed")
    if not torch.isfinite(q[~kept]).all():
        return OutputCheck(name, "fp8_dequant", False, float("inf"), 0.0, "NaN in quantised output")

    def expand(scales):
        """One scale per `group` codes along the last axis; scales one axis short cover the whole last axis."""
        scales = scales.unsqueeze(-1) if scales.dim() == q.dim() - 1 else scales
        return scales.to(torch.float64).repeat_interleave(group, dim=-1)[..., : q.shape[-1]]

    deq, deq_ref = q * expand(got_scales), q_ref * expand(ref_scales)
    budget = e4m3_step(q_ref.abs()) * expand(ref_scales) * 1.0001
    excess = ((deq - deq_ref).abs() - budget).masked_fill(kept, 0.0)
    worst = int(excess.argmax())
    if float(excess.flatten()[worst]) > 0:
        count = int((excess > 0).sum())
        return OutputCheck(name, "fp8_dequant", False, float((deq - deq_ref).abs().flatten()[worst]),
                           float(budget.flatten()[worst]),
                           f"{count} dequantised values off by more than one e4m3 step (worst at flat index {worst})")
    judged = ~kept  # the kept NaN bytes have no error to report
    error = float((deq - deq_ref).abs()[judged].max()) if judged.any() else 0.0
    return OutputCheck(name, "fp8_dequant", True, error, float(budget[judged].max()) if judged.any() else 0.0)


def needs_fp64(problem) -> bool:
    """Only the float rule reads the fp64 reference; problems compared exactly skip computing it."""
    declared = [problem.compare.get(name) for name in problem.outputs]
    return not problem.outputs or any(rule in (None, "float") for rule in declared)


def compare(problem, got: tuple, ref_lp: tuple, ref64: tuple) -> list[OutputCheck]:
    """Compare every output by the rule its problem declares ("float" when undeclared and floating, else "exact")."""
    names = list(problem.outputs) or [f"output{i}" for i in range(len(ref_lp))]
    if len(got) != len(ref_lp):
        return [OutputCheck("outputs", "structure", False, float("inf"), 0.0,
                            f"returned {len(got)} outputs, expected {len(ref_lp)}")]
    checks = []
    for i, (name, g, lp, r64) in enumerate(zip(names, got, ref_lp, ref64)):
        rule = problem.compare.get(name, "float" if lp.dtype.is_floating_point and lp.element_size() > 1 else "exact")
        if isinstance(rule, dict) and rule.get("rule") == "fp8_dequant":
            scale_index = names.index(rule["scales"])
            checks.append(check_fp8_dequant(name, g, got[scale_index], lp, ref_lp[scale_index], int(rule["group"])))
        elif rule == "exact":
            checks.append(check_exact(name, g, lp))
        else:
            checks.append(check_float(name, g, lp, r64))
    return checks
