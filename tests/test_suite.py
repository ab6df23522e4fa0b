"""The suite loads in both layouts, problems honour their contract, and the audit catches constant outputs."""
import tempfile
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from metakernelbench.suite import ProblemError, load_problem, load_suite
from metakernelbench.suite.audit import audit_problem
from metakernelbench.suite.bundle import bundle_source


def test_the_suite_covers_every_family_with_upstream_numbers(suite):
    from metakernelbench.suite.spec import FAMILIES

    assert sorted({p.family for p in suite}) == sorted(FAMILIES)
    assert len({p.number for p in suite}) == len(suite) and all(1 <= p.number <= 77 for p in suite)
    assert {1, 28, 72, 75, 76, 77} <= {p.number for p in suite}


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


def write_problem(root, body, folder="mlp_norm/90_constant", spec=None):
    """A problem in this suite's layout: `body` (make_inputs, reference) plus the spec fields of `spec`."""
    path = root / folder / "problem.py"
    path.parent.mkdir(parents=True)
    path.write_text(textwrap.dedent(body) + textwrap.dedent(SPEC if spec is None else spec))
    return path


SPEC = """
    FAMILY = "mlp_norm"
    SOURCE_MODEL = "test"
    DTYPE = "fp32"
    SIZES = {"full": {}, "odd": {}, "cpu": {}, "cpu_odd": {}}
    OUTPUTS = ("y",)
    COMPARE = {"y": "float"}
    def flops(x): return x.numel()
    def bytes_moved(x): return 8 * x.numel()
"""


def test_audit_rejects_a_near_constant_problem(tmp_path):
    path = write_problem(tmp_path, '''
        """Nearly constant output."""
        import torch
        def make_inputs(seed, device, size):
            return (torch.randn(64, generator=torch.Generator().manual_seed(seed)),)
        def reference(x):
            return torch.ones_like(x) + 1e-9 * x
    ''')
    rows = audit_problem(load_problem(str(path)), "cpu")
    assert rows and not any(r.passed for r in rows) and "near-constant" in rows[0].reason


@pytest.mark.parametrize("dtype,passes", [("torch.int64", True), ("torch.float32", False)])
def test_few_distinct_values_fail_floats_only(tmp_path, dtype, passes):
    """Upstream's problem 26 returns group ids (13 distinct values, most changing with the seed): fine for an index
    or id; a float output quantised to 13 levels is near-constant in disguise."""
    path = write_problem(tmp_path, f'''
        """Thirteen levels."""
        import torch
        def make_inputs(seed, device, size):
            return (torch.randint(0, 13, (4096,), generator=torch.Generator().manual_seed(seed)),)
        def reference(x):
            return (x * 3).to({dtype})
    ''')
    rows = audit_problem(load_problem(str(path)), "cpu")
    assert rows and all(r.passed == passes for r in rows), rows
    assert passes or "13 distinct values" in rows[0].reason


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
    assert p.bytes_moved(x1, (out,)) is None  # declares no formula: no roofline floor


def test_missing_suite_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ProblemError, match="--suite"):
        load_suite(tmp_path / "nowhere")


GOOD = '''
    """A well-formed problem."""
    import torch
    def make_inputs(seed, device, size):
        return (torch.randn(64, generator=torch.Generator().manual_seed(seed)),)
    def reference(x):
        return x * 2
'''


@pytest.mark.parametrize("change,field,hint", [
    (('COMPARE = {"y": "float"}', 'COMPARE = {"yy": "float"}'), "COMPARE", "names 'yy', which is not an output"),
    (('COMPARE = {"y": "float"}', 'COMPARE = {}'), "COMPARE", "has no rule for output 'y'"),
    (('COMPARE = {"y": "float"}', 'COMPARE = {"y": "exakt"}'), "COMPARE", "unknown rule 'exakt'"),
    (('OUTPUTS = ("y",)', 'OUTPUTS = ("y",)\n    INPLACE = {"z": 0}'), "INPLACE", "names 'z'"),
    (('OUTPUTS = ("y",)', 'OUTPUTS = ("y",)\n    INPLACE = {"y": 3}'), "INPLACE", "points at input 3"),
    (('"cpu_odd": {}', '"cpu_2": {}'), "SIZES", "lacks cpu_odd"),
    (('FAMILY = "mlp_norm"', 'FAMILY = "moe"'), "FAMILY", "the folder says 'mlp_norm'"),
    (('DTYPE = "fp32"', ''), "DTYPE", "is missing"),
    (('def flops(x): return x.numel()', ''), "flops", "is not defined"),
])
def test_a_malformed_spec_is_one_line_naming_file_field_and_fix(tmp_path, change, field, hint):
    path = write_problem(tmp_path, GOOD, spec=SPEC.replace(*change))
    with pytest.raises(ProblemError) as caught:
        load_problem(str(path))
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: {field}: ") and hint in message and "; " in message


def test_folder_names_and_numbers_are_checked(tmp_path):
    bad = write_problem(tmp_path, GOOD, folder="mlp_norm/7-constant")
    with pytest.raises(ProblemError, match=r"folder: '7-constant' is not <nn>_<name>"):
        load_problem(str(bad))
    suite = tmp_path / "suite"
    write_problem(suite, GOOD, folder="mlp_norm/90_one")
    write_problem(suite, GOOD, folder="mlp_norm/90_two")
    with pytest.raises(ProblemError, match=r"number: 90 is also mlp_norm/90_one"):
        load_suite(suite)


def test_work_checks_run_the_formulas(tmp_path):
    from metakernelbench.suite.spec import check_work

    path = write_problem(tmp_path, GOOD, spec=SPEC.replace("return 8 * x.numel()", "return 0"))
    faults = check_work(load_problem(str(path)))
    assert len(faults) == 2 and all("bytes_moved returns 0" in f for f in faults)


def test_the_whole_suite_passes_the_spec_and_work_checks(suite):
    from metakernelbench.suite.spec import check_work

    assert [f for p in suite for f in check_work(p)] == []


def test_trial_threads_bundling_one_reference_at_once_all_get_it(tmp_path, monkeypatch):
    """Two replicates of a variant start together in one process, and each bundles the same reference."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    problem = load_problem("28")
    with ThreadPoolExecutor(8) as pool:
        paths = list(pool.map(lambda _: problem.graded_solution("cute"), range(8)))
    assert len(set(paths)) == 1 and paths[0].read_text() == bundle_source(problem.solution_path("cute"))
