"""The suite loads in both layouts, problems honour their contract, and the audit catches constant outputs."""
import textwrap

import pytest
import torch

from metakernelbench.suite import ProblemError, load_problem, load_suite
from metakernelbench.suite.audit import audit_problem


def test_six_problems_one_per_family(suite):
    assert [p.number for p in suite] == [1, 26, 28, 75, 76, 77]
    assert sorted({p.family for p in suite}) == ["attention", "kv_cache", "linear_attention", "mlp_norm", "moe",
                                                  "quantization"]


@pytest.mark.parametrize("spec", ["28", "fused_add_rmsnorm_h4096_llama31_8b", "mlp_norm/28_fused_add_rmsnorm_h4096_llama31_8b", "28_fused_add_rmsnorm_h4096_llama31_8b"])
def test_lookup_by_number_name_and_id(spec):
    assert load_problem(spec).number == 28


def test_unknown_problem_names_the_fix():
    with pytest.raises(ProblemError, match="mkb list"):
        load_problem("no_such_problem")


def test_inputs_are_deterministic_per_seed_and_differ_across_seeds(suite):
    for p in suite:
        a, b, c = (p.make_inputs(s, "cpu", "cpu") for s in (7, 7, 8))
        tensors = [(x, y, z) for x, y, z in zip(a, b, c) if isinstance(x, torch.Tensor)]
        assert all(torch.equal(x, y) for x, y, _ in tensors), p.id
        assert any(not torch.equal(x, z) for x, _, z in tensors if x.numel() > 1), p.id


def test_held_out_sizes_change_shapes(suite):
    for p in suite:
        shapes = {size: tuple(t.shape for t in p.make_inputs(0, "cpu", size) if isinstance(t, torch.Tensor))
                  for size in p.check_sizes("cpu")}
        assert len(set(shapes.values())) == len(shapes) > 1, p.id


def test_every_output_varies_with_the_seed(suite):
    for p in suite:
        rows = audit_problem(p, "cpu")
        assert rows and all(r.passed for r in rows), [r for r in rows if not r.passed]


def test_audit_rejects_a_near_constant_problem(tmp_path):
    path = tmp_path / "constant" / "problem.py"
    path.parent.mkdir()
    path.write_text(textwrap.dedent('''
        """Nearly constant output."""
        import torch
        def make_inputs(seed, device, size="cpu"):
            return (torch.randn(64, generator=torch.Generator().manual_seed(seed)),)
        def reference(x):
            return torch.ones_like(x) + 1e-9 * x
    '''))
    (row,) = audit_problem(load_problem(str(path)), "cpu")
    assert not row.passed and "near-constant" in row.reason


def test_published_layout_loads_unchanged(tmp_path):
    folder = tmp_path / "suite"
    folder.mkdir()
    (folder / "gelu_mul.py").write_text(textwrap.dedent('''
        """Published layout: module constants, reference(*inputs), make_inputs() on torch's global RNG."""
        import torch
        N = 256
        def make_inputs():
            return [torch.randn(N), torch.randn(N)]
        def reference(a, b):
            return torch.nn.functional.gelu(a) * b
    '''))
    (p,) = load_suite(folder)
    assert p.published_layout and p.name == "gelu_mul"
    x1, x2 = p.make_inputs(3, "cpu", p.sizes[0]), p.make_inputs(3, "cpu", p.sizes[0])
    assert torch.equal(x1[0], x2[0]) and not torch.equal(x1[0], p.make_inputs(4, "cpu", p.sizes[0])[0])
    (out,) = p.reference(*x1)
    assert torch.allclose(out, torch.nn.functional.gelu(x1[0]) * x1[1])
    assert p.bytes_moved(x1, (out,)) == 3 * 256 * 4


def test_missing_suite_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ProblemError, match="--suite"):
        load_suite(tmp_path / "nowhere")
