"""Pinned numerics and the references' fp64 anchor: how the trusted side computes what a submission is judged by.

References and eager/compile baselines run with TF32 and reduced-precision reductions off, so the budget is
anchored to the precision the problem states, not to whatever a backend defaults to. The fp64 anchor widens only
float inputs of 16 bits or more (fp8 values are exact in their own type; widening them multiplies memory by 8 for
nothing) and, where the reference is row-separable, runs in slices of rows so one check's extra memory stays
bounded (the anchor of an output is computed slice by slice whenever it is read, never held whole): separability is
not declared but proven, once per problem and size, by the low-precision reference on slices reproducing the whole
one bit for bit.
"""
from __future__ import annotations

import math

import torch

# Each slice's widened inputs are at most this share of the inputs' own bytes, or SLICE_FLOOR_BYTES where that is
# more (smaller slices only multiply the reference's calls); below SLICE_ABOVE_BYTES of widened inputs a whole widen
# fits on any GPU a full-size draw fits on, and slicing would only cost time.
SLICE_SHARE = 0.25
SLICE_FLOOR_BYTES = 1 << 30
SLICE_ABOVE_BYTES = 2 << 30


def pin() -> dict:
    """Turn TF32 and reduced-precision reductions off in this process; returns what is in force, for the verdict."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.set_float32_matmul_precision("highest")
    return pinned()


def pinned() -> dict:
    matmul = torch.backends.cuda.matmul
    return {"matmul_allow_tf32": matmul.allow_tf32, "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "matmul_allow_bf16_reduced_precision_reduction": matmul.allow_bf16_reduced_precision_reduction,
            "matmul_allow_fp16_reduced_precision_reduction": matmul.allow_fp16_reduced_precision_reduction,
            "float32_matmul_precision": torch.get_float32_matmul_precision()}


def widen(value):
    """The fp64 anchor's copy of one input: fp16/bf16/fp32 tensors in fp64, every other value as it is."""
    if isinstance(value, torch.Tensor):
        if value.dtype.is_floating_point and value.element_size() >= 2:
            return value.to(torch.float64)
        return value.clone()
    return value


def _tensor_bytes(values) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


class Anchor:
    """Computes one problem's references at one size; remembers whether its reference is row-separable."""

    def __init__(self, problem, slice_above_bytes: int = SLICE_ABOVE_BYTES,
                 slice_floor_bytes: int = SLICE_FLOOR_BYTES) -> None:
        self.problem = problem
        self.slice_above_bytes = slice_above_bytes
        self.slice_floor_bytes = slice_floor_bytes
        self.separable: dict[str, bool] = {}
        self.proven_rows: dict[tuple, int] = {}
        self.slices_used = 0

    @staticmethod
    def _shapes(inputs: tuple) -> tuple:
        return tuple((tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else repr(t) for t in inputs)

    def references(self, inputs: tuple, size: str, needs_fp64: bool) -> tuple[tuple, tuple]:
        """(low-precision reference, fp64 anchor); once a size is proven row-separable, both come slice by slice."""
        if self.separable.get(size):
            rows = self._rows(inputs, None)
            if rows is not None:
                return self._sliced_lp(inputs, rows), self._sliced(inputs, rows)
        lp = self.problem.reference(*[t.clone() if isinstance(t, torch.Tensor) else t for t in inputs])
        if not needs_fp64:
            return lp, lp
        wide_bytes = sum(t.numel() * 8 for t in inputs if isinstance(t, torch.Tensor) and t.dtype.is_floating_point
                         and t.element_size() >= 2)
        rows = self._rows(inputs, lp) if wide_bytes > self.slice_above_bytes else None
        if size not in self.separable:
            self.separable[size] = rows is not None and self._proven(inputs, lp, rows)
        if not self.separable[size] or rows is None:
            self.slices_used = 1
            return lp, self.problem.reference(*[widen(t) for t in inputs])
        return lp, self._sliced(inputs, rows)

    def _rows(self, inputs: tuple, outputs: tuple | None) -> int | None:
        """The leading size every output shares, if some inputs share it too (the candidate row dimension); with no
        outputs at hand, the one proven for these inputs' shapes."""
        if outputs is None:
            return self.proven_rows.get(self._shapes(inputs))
        if not outputs or any(not isinstance(o, torch.Tensor) or o.dim() == 0 for o in outputs):
            return None
        rows = outputs[0].shape[0]
        if rows < 2 or any(o.shape[0] != rows for o in outputs):
            return None
        if not any(isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == rows for t in inputs):
            return None
        return rows

    @staticmethod
    def _cut(inputs: tuple, rows: int, begin: int, end: int, convert) -> list:
        return [convert(t[begin:end]) if isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == rows
                else convert(t) for t in inputs]

    def _step(self, inputs: tuple, rows: int) -> int:
        sliced = [t for t in inputs if isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == rows]
        wide_bytes = sum(t.numel() * 8 for t in sliced if t.dtype.is_floating_point and t.element_size() >= 2)
        budget = max(SLICE_SHARE * max(_tensor_bytes(inputs), 1), self.slice_floor_bytes)
        return max(1, min(rows, int(rows * budget / wide_bytes) if wide_bytes else rows))

    def _proven(self, inputs: tuple, lp: tuple, rows: int) -> bool:
        step = max(1, min(self._step(inputs, rows), rows // 2))
        parts = []
        for begin in range(0, rows, step):
            try:
                part = self.problem.reference(*self._cut(inputs, rows, begin, begin + step, lambda t: t.clone()
                                                         if isinstance(t, torch.Tensor) else t))
            except Exception:  # cut along a dimension its reference does not map row to row: not separable
                return False
            if len(part) != len(lp) or any(not isinstance(p, torch.Tensor) or p.shape[0] != min(step, rows - begin)
                                           for p in part):
                return False
            parts.append(part)
        if not all(torch.equal(torch.cat([p[i] for p in parts]), lp[i]) for i in range(len(lp))):
            return False
        self.proven_rows[self._shapes(inputs)] = rows
        return True

    def _sliced_lp(self, inputs: tuple, rows: int) -> tuple:
        """The low-precision reference slice by slice, into whole outputs (bit for bit the whole reference's)."""
        step, whole = self._step(inputs, rows), None
        for begin in range(0, rows, step):
            part = self.problem.reference(*self._cut(inputs, rows, begin, begin + step, lambda t: t.clone()
                                                     if isinstance(t, torch.Tensor) else t))
            if whole is None:
                whole = [torch.empty((rows, *p.shape[1:]), dtype=p.dtype, device=p.device) for p in part]
            for target, value in zip(whole, part):
                target[begin:begin + step] = value
        return tuple(whole)

    def _sliced(self, inputs: tuple, rows: int) -> tuple:
        """Each float output's fp64 anchor as a SlicedOutput; other outputs are compared exactly and need none."""
        step = self._step(inputs, rows)
        self.slices_used = -(-rows // step)
        lp_like = self.problem.reference(*self._cut(inputs, rows, 0, 1, lambda t: t.clone()
                                                    if isinstance(t, torch.Tensor) else t))
        return tuple(SlicedOutput(self, inputs, rows, step, i, (rows, *o.shape[1:])) if o.dtype.is_floating_point
                     and o.element_size() >= 2 else None for i, o in enumerate(lp_like))


class SlicedOutput:
    """One output's fp64 anchor, computed slice of rows by slice of rows when the comparison reads it, so no fp64
    copy of the whole output or of its inputs ever exists."""

    def __init__(self, anchor: Anchor, inputs: tuple, rows: int, step: int, index: int, shape) -> None:
        self.anchor, self.inputs, self.rows, self.step, self.index = anchor, inputs, rows, step, index
        self.shape = tuple(shape)

    def pieces(self):
        inner = math.prod(self.shape[1:])
        for begin in range(0, self.rows, self.step):
            part = self.anchor.problem.reference(*Anchor._cut(self.inputs, self.rows, begin, begin + self.step,
                                                              widen))
            yield begin * inner, part[self.index].reshape(-1).to(torch.float64)
