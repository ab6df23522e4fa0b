"""Correctness rules: fp64-anchored budgets accept honest rounding and reject real errors and downgrades."""
import torch

from metakernelbench.grader.compare import check_exact, check_float, check_fp8_dequant, e4m3_step
from metakernelbench.suite import load_problem


def _rmsnorm_refs(seed=0):
    p = load_problem("28")
    inputs = p.make_inputs(seed, "cpu", "cpu")
    lp = p.reference(*inputs)
    wide = p.reference(*[t.double() for t in inputs])
    return p, inputs, lp, wide


def test_reference_passes_its_own_rule_and_an_fp32_path_too():
    p, inputs, lp, wide = _rmsnorm_refs()
    assert check_float("y", lp[0], lp[0], wide[0]).passed
    alt = p.reference(*[t.float() for t in inputs])[0].bfloat16()
    assert check_float("y", alt, lp[0], wide[0]).passed


def test_single_wrong_element_fails_with_its_index():
    p, inputs, lp, wide = _rmsnorm_refs()
    bad = lp[0].clone()
    bad[3, 5] += 1.0
    check = check_float("y", bad, lp[0], wide[0])
    assert not check.passed and "(3, 5)" in check.reason


def test_fp16_downgrade_of_an_fp32_output_fails():
    wide = torch.randn(4096, dtype=torch.float64)
    lp = wide.float()
    downgraded = lp.half().float()
    check = check_float("x", downgraded, lp, wide)
    assert not check.passed


def test_nan_dtype_and_shape_fail():
    p, inputs, lp, wide = _rmsnorm_refs()
    nan = lp[0].clone()
    nan[0, 0] = float("nan")
    assert "non-finite" in check_float("y", nan, lp[0], wide[0]).reason
    assert "dtype" in check_float("y", lp[0].float(), lp[0], wide[0]).reason
    assert "shape" in check_float("y", lp[0][:-1], lp[0], wide[0]).reason


def test_exact_rule_counts_mismatches():
    want = torch.arange(10, dtype=torch.int32)
    got = want.clone()
    got[2] = 7
    assert check_exact("ids", want.clone(), want).passed
    assert check_exact("ids", got, want).reason.startswith("1 elements differ")


def test_e4m3_step_matches_the_format():
    values = torch.tensor([448.0, 1.0, 1.125, 2 ** -6, 2 ** -8])
    assert e4m3_step(values).tolist() == [32.0, 0.125, 0.125, 2 ** -9, 2 ** -9]


def test_fp8_rule_allows_one_step_not_two():
    p = load_problem("77")
    (x,) = p.make_inputs(0, "cpu", "cpu")
    q, s = p.reference(x)
    assert check_fp8_dequant("q", q, s, q, s, 128).passed
    q32 = q.float()
    one_up = torch.nextafter(q32, torch.full_like(q32, 1e9)).to(torch.float8_e4m3fn)
    assert check_fp8_dequant("q", one_up, s, q, s, 128).passed
    two_up = torch.nextafter(one_up.float(), torch.full_like(q32, 1e9)).to(torch.float8_e4m3fn)
    two_up = torch.where(q32.abs() < 400, (q32 + 2.5 * e4m3_step(q32.abs()) * q32.sign()), q32).to(torch.float8_e4m3fn)
    assert not check_fp8_dequant("q", two_up, s, q, s, 128).passed


def test_fp8_rule_reads_uint8_caches_as_e4m3_and_keeps_their_nan_bytes():
    """A uint8 cache holds e4m3 bit patterns, one scale per (token, head) row; slots nothing writes hold arbitrary
    bytes, NaN codes among them, which must come back unchanged (and must not make the check pass vacuously)."""
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 256, (4, 8, 128), generator=gen, dtype=torch.uint8)
    codes[codes == 0x7F] = 0x7E  # no NaN among the written codes
    codes[codes == 0xFF] = 0xFE
    codes[0, 0, :3] = torch.tensor([0x7F, 0xFF, 0x7F], dtype=torch.uint8)  # untouched NaN bytes
    scales = torch.rand((4, 8), generator=gen) + 0.1
    same = check_fp8_dequant("cache", codes.clone(), scales, codes, scales, 128)
    assert same.passed and same.error == 0.0 and same.budget > 0  # NaN bytes do not make the figures NaN
    one_step = codes.clone()
    one_step[1, 2, 5] += 1 if one_step[1, 2, 5] % 0x80 < 0x7E else -1
    assert check_fp8_dequant("cache", one_step, scales, codes, scales, 128).passed
    far = codes.clone()
    far[1, 2, 5] = (far[1, 2, 5] & 0x80) | ((far[1, 2, 5] & 0x7F) ^ 0x40)
    assert not check_fp8_dequant("cache", far, scales, codes, scales, 128).passed
    changed_nan = codes.clone()
    changed_nan[0, 0, 1] = 0x01
    verdict = check_fp8_dequant("cache", changed_nan, scales, codes, scales, 128)
    assert not verdict.passed and "NaN codes of the reference were changed" in verdict.reason
    written_nan = codes.clone()
    written_nan[2, 3, 4] = 0x7F
    assert not check_fp8_dequant("cache", written_nan, scales, codes, scales, 128).passed
