"""Pinned numerics (issue 17, item 4): TF32 and reduced-precision reductions off, at least 5 draws at the timed size,
the fp64 anchor widening only 16-bit-and-wider floats and running in row slices where the reference allows it, the
comparison in bounded chunks; and the hand-over of Python scalars beside tensors."""
import pytest
import torch

from metakernelbench.grader import GraderConfig, channel, compare, numerics
from metakernelbench.suite import load_problem
from metakernelbench.task import task_statement


def test_pin_turns_tf32_and_reduced_precision_reductions_off():
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    torch.set_float32_matmul_precision("medium")
    pinned = numerics.pin()
    assert pinned == {"matmul_allow_tf32": False, "cudnn_allow_tf32": False,
                      "matmul_allow_bf16_reduced_precision_reduction": False,
                      "matmul_allow_fp16_reduced_precision_reduction": False, "float32_matmul_precision": "highest"}
    assert not torch.backends.cuda.matmul.allow_tf32 and torch.get_float32_matmul_precision() == "highest"


def test_five_draws_at_the_timed_size_as_the_statement_promises():
    assert GraderConfig().check_draws >= 5
    assert "at least 5 draws at the main size" in task_statement(load_problem("28"), "tirx")


def test_widen_only_floats_of_sixteen_bits_or_more():
    assert numerics.widen(torch.ones(3, dtype=torch.bfloat16)).dtype == torch.float64
    assert numerics.widen(torch.ones(3, dtype=torch.float32)).dtype == torch.float64
    assert numerics.widen(torch.ones(3).to(torch.float8_e4m3fn)).dtype == torch.float8_e4m3fn
    assert numerics.widen(torch.ones(3, dtype=torch.int32)).dtype == torch.int32
    assert numerics.widen(0.125) == 0.125 and numerics.widen(8) == 8


def test_anchor_slices_a_row_separable_reference_and_matches_the_full_widen():
    problem = load_problem("28")
    inputs = problem.make_inputs(5, "cpu", "cpu")
    small = numerics.Anchor(problem)
    small.references(inputs, "cpu", needs_fp64=True)
    assert small.slices_used == 1, "a widen this small is done whole"
    anchor = numerics.Anchor(problem, slice_above_bytes=0, slice_floor_bytes=0)
    lp, wide = anchor.references(inputs, "cpu", needs_fp64=True)
    assert anchor.separable["cpu"] and anchor.slices_used > 1
    full = problem.reference(*[numerics.widen(t) for t in inputs])
    assembled = torch.cat([piece for _, piece in wide[0].pieces()]).view(full[0].shape)
    assert torch.allclose(assembled, full[0], rtol=0, atol=1e-12)
    assert compare.check_float("y", lp[0], lp[0], wide[0]) == compare.check_float("y", lp[0], lp[0], full[0])
    assert torch.equal(lp[0], problem.reference(*[t.clone() for t in inputs])[0])


class _AcrossRows:
    """A reference that normalises over the rows: slices of rows would change its answer."""

    @staticmethod
    def reference(x, w):
        return ((x.float() / x.float().abs().sum(0, keepdim=True)) * w.float()).to(x.dtype),


def test_anchor_widens_whole_when_slices_would_change_the_reference():
    anchor = numerics.Anchor(_AcrossRows, slice_above_bytes=0, slice_floor_bytes=0)
    x, w = torch.randn(64, 32).bfloat16(), torch.randn(32).bfloat16()
    lp, wide = anchor.references((x, w), "s", needs_fp64=True)
    assert anchor.separable["s"] is False and anchor.slices_used == 1
    assert torch.equal(wide[0], _AcrossRows.reference(x.double(), w.double())[0])


class _GatherOfRows:
    """Problem 01's shape of trouble: the output's leading size also leads an index tensor whose values point at rows
    anywhere in the data, so a cut of both cannot even be computed (the index runs past the cut)."""

    @staticmethod
    def reference(x, index):
        return (x.float()[index] * 2).to(x.dtype),


def test_anchor_widens_whole_when_a_cut_cannot_be_computed():
    anchor = numerics.Anchor(_GatherOfRows, slice_above_bytes=0, slice_floor_bytes=0)
    x, index = torch.randn(32, 8).bfloat16(), torch.arange(31, -1, -1)
    lp, wide = anchor.references((x, index), "s", needs_fp64=True)
    assert anchor.separable["s"] is False and anchor.slices_used == 1
    assert torch.equal(wide[0], _GatherOfRows.reference(x.double(), index)[0])


@pytest.mark.parametrize("variant", ["honest", "downgraded"])
def test_chunked_comparison_equals_the_whole_one(monkeypatch, variant):
    problem = load_problem("28")
    inputs = problem.make_inputs(3, "cpu", "cpu")
    lp = problem.reference(*[t.clone() for t in inputs])
    wide = problem.reference(*[t.double() for t in inputs])
    got = lp[0] if variant == "honest" else lp[0].to(torch.float8_e4m3fn).bfloat16()
    whole = compare.check_float("y", got, lp[0], wide[0])
    monkeypatch.setattr(compare, "CHUNK_ELEMENTS", 997)
    chunked = compare.check_float("y", got, lp[0], wide[0])
    assert chunked.passed == whole.passed == (variant == "honest")
    # fp32 sums of squares (the rms scale) in other orders: equal to fp32 rounding, far inside any budget
    assert chunked.error == pytest.approx(whole.error, rel=1e-6) and chunked.budget == pytest.approx(whole.budget)


def test_inputs_cross_with_their_python_scalars():
    values = (torch.arange(6, dtype=torch.int32).view(2, 3), 0.125, 8, True, None, (1, 2), [3], torch.float16, "mode")
    records, tensors = channel.input_records(values)
    assert [r["kind"] for r in records] == ["tensor", "scalar", "scalar", "scalar", "scalar", "tuple", "list",
                                            "dtype", "scalar"]
    again = channel.input_values(records, [t.clone() for t in tensors])
    assert torch.equal(again[0], values[0]) and again[1:] == values[1:]
    with pytest.raises(TypeError, match="cannot be handed"):
        channel.input_records((object(),))
