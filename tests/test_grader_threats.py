"""Adversarial tests of the grader: one real exploit submission per GRADER-THREATS row must be rejected for the right reason.

Every submission lives in tests/adversarial/ (one-line docstring naming the exploit). Grading runs on the CPU: TIRx
kernels compile for the host through LLVM. One module-scoped Grader (one fork server) serves every test; tests that
need other settings swap its config for the duration of one grading. Where both a static rule and a runtime defence
exist, the same file is graded twice: at default settings (the static rule must object) and with static_rules=False
(the runtime defence must object on its own). The runtime variants reach forbidden modules through a `try: import X
except ImportError:` fallback, so they exercise the defence behind the import guard rather than the guard itself.
Also here: honest baseline passes, bad inputs fail with clear reasons and leave the grader usable, the suite audit
behind rows 14-16, and the "also required" properties (no secrets, private cwd, capped output).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
if str(SRC) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(SRC))

from metakernelbench.dsl import get_adapter  # noqa: E402
from metakernelbench.grader import Grader, GraderConfig  # noqa: E402
from metakernelbench.grader.compare import compare  # noqa: E402
from metakernelbench.grader.parent import reverified_count  # noqa: E402
from metakernelbench.suite import load_problem, load_suite  # noqa: E402

pytest.importorskip("tvm_tirx", reason="the adversarial submissions are TIRx kernels (apache-tvm-tirx)")

ADV = Path(__file__).resolve().parent / "adversarial"
HONEST = ADV / "honest_rmsnorm.py"
CANARY = "mkb-canary-7d1f0c"  # also hard-coded in adversarial/also_required_probe.py
CANARY_VAR = "MKB_CANARY_API_KEY"  # a secret-looking name the fork server must scrub
PYTHONPATH = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH", "")) if p)

# Small but complete: the default 5 + 2 correctness draws (row 6's file counts on them), 7 timed calls of which 3 are
# re-verified, one eager baseline process.
BASE = GraderConfig(device="cpu", warmup_calls=2, timed_calls=5, reverified_calls=3, baseline_processes=1,
                    import_timeout_s=60, first_call_timeout_s=60, call_timeout_s=20, total_timeout_s=300,
                    extra_env={"PYTHONPATH": PYTHONPATH})
# A plausible host roofline (50 GB/s, 1 TFLOP/s): problem 28 at size cpu moves 198 kB, so the floor is ~4 us.
CPU_PEAKS = dict(peak_bandwidth=50e9, peak_flops=1e12)
STATIC_OFF = dict(static_rules=False)


@pytest.fixture(scope="module")
def grader():
    previous = os.environ.get(CANARY_VAR)
    os.environ[CANARY_VAR] = CANARY  # present when the fork server starts: it must not reach the child
    g = Grader(BASE)
    try:
        yield g
    finally:
        g.close()
        if previous is None:
            os.environ.pop(CANARY_VAR, None)
        else:
            os.environ[CANARY_VAR] = previous


@pytest.fixture(scope="module")
def p28():
    return load_problem("28")


@contextlib.contextmanager
def configured(g: Grader, **changes):
    """Grade with some config fields changed (the fork server and baselines stay)."""
    saved = g.config
    g.config = dataclasses.replace(saved, **changes)
    try:
        yield g
    finally:
        g.config = saved


def grade(g: Grader, problem, name: str | Path, **changes):
    path = name if isinstance(name, Path) else ADV / name
    with configured(g, **changes):
        return g.grade(problem, "tirx", path)


def describe(v) -> str:
    return (f"passed={v.passed} failed_check={v.failed_check!r} reason={v.reason!r} "
            f"median_ms={v.runtime.get('median_ms')} stdout={v.stdout_tail[-300:]!r} stderr={v.stderr_tail[-600:]!r}")


def assert_rejected(v, checks: str | tuple[str, ...], reason: str) -> None:
    checks = (checks,) if isinstance(checks, str) else checks
    assert not v.passed, f"the grader accepted an exploit: {describe(v)}"
    assert v.failed_check in checks, f"expected failed_check in {checks}: {describe(v)}"
    assert re.search(reason, v.reason), f"reason should match {reason!r}: {describe(v)}"


# ---------------------------------------------------------------------------------------------------------------
# The honest baseline
# ---------------------------------------------------------------------------------------------------------------
def test_honest_submission_passes(grader, p28):
    v = grade(grader, p28, HONEST)
    assert v.passed, describe(v)
    assert v.compiled and v.correct and v.failed_check is None
    assert v.checks["ghost_replay"]["passed"] and v.checks["threads"]["passed"] and v.checks["unpatched"]["passed"]
    assert len(v.draws) >= BASE.check_draws + BASE.extra_size_draws
    assert {d["size"] for d in v.draws} == {"cpu", "cpu_odd"}
    assert v.runtime["n"] == BASE.timed_calls and v.runtime["median_ms"] > 0
    assert "max_over_median" in v.runtime  # row 17: super-batching would show here
    assert v.speedup_vs_eager and v.speedup_vs_eager > 0


def test_honest_submission_passes_under_cpu_roofline(grader, p28):
    v = grade(grader, p28, HONEST, **CPU_PEAKS)
    assert v.passed, describe(v)
    assert v.roofline["floor_ms"] and 0 < v.roofline["fraction"] < 1


# ---------------------------------------------------------------------------------------------------------------
# One exploit per threat row (plus variants). (file, config changes, accepted failed_check(s), reason regex)
# ---------------------------------------------------------------------------------------------------------------
THREATS = [
    # 1: eager PyTorch computes the answer; a real TIRx kernel only writes scratch -> ghost replay
    pytest.param("row01_torch_fallback.py", {}, "ghost_replay", r"DSL kernel does not compute them", id="01-torch-fallback"),
    pytest.param("row01b_no_dsl_kernel.py", {}, "launch", r"launched no kernel written in the variant's DSL",
                 id="01b-no-dsl-kernel"),
    # 1 (gap): the kernel only writes a flag the host checks -> neutralising it "changes" the outputs
    pytest.param("row01c_ghost_aware_flag.py", {}, ("ghost_replay", "dsl_share"), r"DSL kernel", id="01c-ghost-aware-flag"),
    # 2: hunt expected outputs via gc / frames
    pytest.param("row02_read_expected.py", {}, "static_rules", r"import of 'gc' is not allowed", id="02-static"),
    pytest.param("row02_read_expected.py", STATIC_OFF, ("correctness", "runtime_error"),
                 r"size 'cpu', output 'y'|not allowed", id="02-runtime"),
    # 3: mutate the inputs so a later reference agrees
    pytest.param("row03_mutate_inputs.py", {}, "integrity",
                 r"input 0 was modified but the problem does not declare it an in-place output", id="03-mutate-inputs"),
    # 4: uninitialised outputs (stale memory) -> poisoned
    pytest.param("row04_stale_memory.py", {}, "correctness", r"output 'y': (\d+ non-finite values|error)",
                 id="04-stale-memory"),
    pytest.param("row04b_stale_when_timed.py", {}, "correctness",
                 r"timed call \d+ was wrong.*honest only while checked", id="04b-stale-when-timed"),
    # 5: cache keyed on pointer/version (runtime side: see test_row05_pointer_cache_never_hits)
    pytest.param("row05_cache_by_pointer.py", {}, "static_rules", r"_version", id="05-static"),
    # 6: honest while checked, stale afterwards -> re-verified timed calls
    pytest.param("row06_honest_when_checked.py", {}, "correctness", r"timed call \d+ was wrong.*honest only while checked",
                 id="06-honest-when-checked"),
    # 7: side stream (GPU): static rule here; timer logic in test_row07_timer_check_flags_escaped_work
    pytest.param("row07_side_stream.py", {}, "static_rules", r"torch\.cuda\.Stream' is not allowed", id="07-static"),
    # 8: finish the work in a background thread
    pytest.param("row08_background_thread.py", {}, "static_rules", r"import of 'threading' is not allowed",
                 id="08-static"),
    pytest.param("row08_background_thread.py", STATIC_OFF, "integrity", r"thread", id="08-runtime-per-call-thread"),
    pytest.param("row08b_lingering_thread.py", STATIC_OFF, "integrity", r"thread",
                 id="08b-runtime-lingering-thread"),
    # 9: lazy tensor subclass
    pytest.param("row09_lazy_subclass.py", {}, "static_rules", r"defining '__torch_function__' is forbidden",
                 id="09-static"),
    pytest.param("row09_lazy_subclass.py", STATIC_OFF, "integrity", r"output 0 is submission\.Lazy, not torch\.Tensor",
                 id="09-lazy-subclass"),
    # 10: patch the timer
    pytest.param("row10_patch_timer.py", {}, "static_rules", r"import of 'time' is not allowed", id="10-static"),
    pytest.param("row10_patch_timer.py", STATIC_OFF, "integrity",
                 r"time\.perf_counter was replaced", id="10-runtime"),
    # 10 (gap): rebind the child's own saved timer instead of the watched module attribute
    pytest.param("row10b_rebind_child_timer.py", {}, "static_rules", r"'\.sys' is forbidden", id="10b-static"),
    pytest.param("row10b_rebind_child_timer.py", STATIC_OFF, ("integrity", "timer", "import"),
                 r"replaced|timer|wall clock|not allowed",
                 id="10b-rebind-child-timer"),
    pytest.param("row10c_rebind_timer_via_frames.py", {}, "static_rules", r"frame, traceback, generator", id="10c-static"),
    pytest.param("row10c_rebind_timer_via_frames.py", STATIC_OFF, ("integrity", "timer"), r"replaced|timer|wall clock",
                 id="10c-rebind-timer-via-frames"),
    pytest.param("row10d_rebind_timer_and_watchlist.py", {}, "static_rules", r"frame, traceback, generator", id="10d-static"),
    pytest.param("row10d_rebind_timer_and_watchlist.py", STATIC_OFF, ("integrity", "timer"),
                 r"replaced|timer|wall clock", id="10d-rebind-timer-and-watchlist"),
    # 11: forge the result channel / exit early
    pytest.param("row11_forge_channel.py", {}, "static_rules", r"import of 'socket' is not allowed", id="11-static"),
    pytest.param("row11_forge_channel.py", STATIC_OFF, ("integrity", "runtime_error"),
                 r"did not carry its request's nonce|not allowed",
                 id="11-runtime-forged-reply"),
    pytest.param("row11b_exit_early.py", {}, "static_rules", r"'\.sys' is forbidden", id="11b-static"),
    pytest.param("row11b_exit_early.py", STATIC_OFF, "crash", r"process died or closed the channel.*exit code 0",
                 id="11b-exit-early"),
    # 12: seeds from env/argv, precomputed at import
    pytest.param("row12_seed_peek.py", {}, "static_rules", r"import of 'os' is not allowed", id="12-static"),
    pytest.param("row12_seed_peek.py", STATIC_OFF, "correctness", r"size 'cpu', output 'y'", id="12-runtime"),
    # 13 (gap): bf16 accumulation; fails atol=rtol=1e-2 yet sits inside the current budget
    pytest.param("row13_precision_downgrade.py", {}, "correctness", r"output 'y'.*budget", id="13-precision-downgrade"),
    # 14: constant output
    pytest.param("row14_constant_output.py", {}, "correctness", r"output 'y': error .* got 0,", id="14-constant-output"),
    # 15: closed form from the generator's distribution (caught per draw with p~0.5 only; see report)
    pytest.param("row15_closed_form.py", {}, "correctness", r"output 'y'", id="15-closed-form"),
    # 16: hard-coded cpu shape, rejected at the cpu_odd size
    pytest.param("row16_hardcoded_shape.py", {}, "correctness", r"size 'cpu_odd', output 'y'", id="16-hardcoded-shape"),
    # 17: super-batching by predicting later inputs
    pytest.param("row17_superbatch.py", {}, "static_rules", r"'torch\.Generator' is not allowed", id="17-static"),
    pytest.param("row17_superbatch.py", STATIC_OFF, "correctness", r"size 'cpu', output 'y'", id="17-superbatch"),
    # 18: persisting L2 (GPU): static rule here
    pytest.param("row18_l2_persistence.py", {}, "static_rules", r"import from 'cuda\.bindings' is not allowed", id="18-static"),
    # 19: crash the worker (segfault); test_grader_survives_bad_submissions checks the next grading
    pytest.param("row19_crash_context.py", {}, "crash", r"process died or closed the channel.*exit code -11",
                 id="19-segfault"),
    # 20: runtime below the physical floor (timer faked 1000x; a CPU roofline configured)
    pytest.param("row20_below_roofline.py", CPU_PEAKS, "static_rules", r"'\.sys' is forbidden", id="20-static"),
    pytest.param("row20_below_roofline.py", {**CPU_PEAKS, **STATIC_OFF}, ("roofline", "integrity", "timer", "import"),
                 r"below the physical floor|replaced|wall clock|not allowed", id="20-below-roofline"),
    # 21: import the suite's reference
    pytest.param("row21_import_reference.py", {}, "static_rules", r"import from 'metakernelbench\.suite' is not allowed",
                 id="21-static"),
    pytest.param("row21_import_reference.py", STATIC_OFF, "import", r"import of 'metakernelbench\.suite' is not allowed",
                 id="21-runtime"),
    # 21 (gap): importlib reached through torch: the static rule must object, and so must the runtime import hook
    pytest.param("row21b_import_bypass.py", {}, "static_rules", r"importlib", id="21b-static"),
    pytest.param("row21b_import_bypass.py", STATIC_OFF, "import", r"not allowed", id="21b-importlib-bypass"),
    # 22: builtins and the grader reached through allowed objects
    pytest.param("row22_builtins_via_print_self.py", {}, "static_rules", r"'\.__self__' is forbidden", id="22-static"),
    pytest.param("row22_builtins_via_print_self.py", STATIC_OFF, "import", r"import of 'gc' is not allowed",
                 id="22-import-guard-judges-the-frame"),
    pytest.param("row22b_getattribute_reach.py", {}, "static_rules", r"'torch\.cuda\.graphs' is not allowed",
                 id="22b-static"),
    pytest.param("row22b_getattribute_reach.py", STATIC_OFF, "integrity", r"runner\.timed was replaced",
                 id="22b-one-shot-timer-seen-at-its-call"),
    # 23: torch patched by assignment, restored before the end, or hooked by a mode
    pytest.param("row23_patch_tensor_method.py", {}, "static_rules", r"assigning or deleting '\.detach' is forbidden",
                 id="23-static"),
    pytest.param("row23_patch_tensor_method.py", STATIC_OFF, "integrity", r"torch\.Tensor\.detach was replaced",
                 id="23-patch-seen-before-the-first-call"),
    pytest.param("row23b_patch_and_restore.py", {}, "static_rules", r"assigning or deleting '\.equal' is forbidden",
                 id="23b-static"),
    pytest.param("row23b_patch_and_restore.py", STATIC_OFF, "integrity", r"torch\.equal was replaced",
                 id="23b-patch-seen-at-its-call"),
    pytest.param("row23c_function_mode.py", {}, "static_rules", r"'torch\.overrides' is not allowed", id="23c-static"),
    pytest.param("row23c_function_mode.py", STATIC_OFF, "integrity", r"torch function or dispatch mode is active",
                 id="23c-mode-seen"),
    # 24: another implementation behind a DSL shell
    pytest.param("row24_eager_behind_copy_kernel.py", {}, "dsl_share", r"eager PyTorch outside its DSL kernels "
                 r"\(.*aten::mean", id="24-eager-behind-copy-kernel"),
    pytest.param("row24b_torchscript.py", {}, "static_rules", r"'torch\.jit' is not allowed", id="24b-static"),
    pytest.param("row24b_torchscript.py", STATIC_OFF, "dsl_share", r"eager PyTorch outside its DSL kernels",
                 id="24b-torchscript-logged"),
    pytest.param("row24c_packed_callback.py", {}, "static_rules", r"register_global_func' is forbidden",
                 id="24c-static"),
    pytest.param("row24c_packed_callback.py", STATIC_OFF, "dsl_share", r"eager PyTorch outside its DSL kernels",
                 id="24c-callback-inside-the-launch-logged"),
    pytest.param("row24d_inline_cpp.py", {}, "static_rules", r"load_inline' is forbidden", id="24d-static"),
    pytest.param("row24d_inline_cpp.py", STATIC_OFF, "import", r"Operation not permitted",
                 id="24d-no-compiler-can-start"),
    pytest.param("row24e_native_library.py", {}, "static_rules", r"'open' is forbidden", id="24e-static"),
    pytest.param("row24e_native_library.py", STATIC_OFF, "integrity", r"native code was loaded from outside",
                 id="24e-foreign-native-code-seen"),
    pytest.param("row24f_jiterator.py", {}, "static_rules", r"'torch\.cuda\.jiterator' is not allowed", id="24f-static"),
    pytest.param("row24f_jiterator.py", STATIC_OFF, "import", r"another kernel language",
                 id="24f-jiterator-shut-in-the-child"),
    # 25: OS access through allowed roots (runtime sides: test_row25_*)
    pytest.param("row25_extern_system.py", {}, "static_rules", r"call_extern\('system', \.\.\.\) is forbidden",
                 id="25-static"),
    pytest.param("row25b_collect_env_run.py", {}, "static_rules", r"'torch\.utils\.collect_env' is not allowed",
                 id="25b-static"),
    pytest.param("row25c_storage_from_file.py", {}, "static_rules", r"'\.from_file' is forbidden", id="25c-static"),
    # 26: native threads finishing the work after solve returns
    pytest.param("row26_native_thread.py", {}, "static_rules", r"'torch\.jit' is not allowed", id="26-static"),
    pytest.param("row26_native_thread.py", STATIC_OFF, "integrity", r"native thread .* after solve returned",
                 id="26-native-thread-seen"),
    # 27: skip the work on timed calls never read back (every timed call verified here; see test_row27_*)
    pytest.param("row27_skip_unread_calls.py", dict(reverified_calls=7), "correctness",
                 r"timed call \d+ was wrong", id="27-every-timed-call-verified"),
]


@pytest.mark.parametrize("name, changes, checks, reason", THREATS)
def test_threat_rejected(grader, p28, name, changes, checks, reason):
    v = grade(grader, p28, name, **changes)
    assert_rejected(v, checks, reason)


def test_every_row_has_an_exploit_file():
    rows = {int(m.group(1)) for p in ADV.glob("row*.py") if (m := re.match(r"row(\d\d)", p.name))}
    assert rows == set(range(1, 28))
    for p in ADV.glob("*.py"):
        doc = p.read_text().split("\n", 1)[0]
        assert doc.startswith('"""') and doc.endswith('"""'), f"{p.name} needs a one-line docstring"


def test_row05_pointer_cache_never_hits(grader, p28):
    """Runtime side of row 5: fresh storage per call with old buffers kept alive, so the cache can never serve."""
    v = grade(grader, p28, "row05_cache_by_pointer.py", **STATIC_OFF)
    hits = [int(h) for h in re.findall(r"hits=(\d+)", v.stdout_tail)]
    assert hits and max(hits) == 0, describe(v)
    assert v.draws and all(d["passed"] for d in v.draws), f"with no hits the file computes honestly: {describe(v)}"
    assert v.passed or v.failed_check == "dsl_share", describe(v)  # its cache copies are eager work (row 24)


def test_row12_and_row17_never_predict_inputs(grader, p28):
    """Seeds come from `secrets` after import: precomputed / super-batched answers never match a real call."""
    for name in ("row12_seed_peek.py", "row17_superbatch.py"):
        v = grade(grader, p28, name, **STATIC_OFF)
        hits = [int(h) for h in re.findall(r"hits=(\d+)", v.stdout_tail)]
        assert hits and max(hits) == 0, describe(v)


def test_row25_kernel_extern_cannot_start_a_program(grader, p28):
    """With the static rules off, `system` from a TIRx kernel runs, but the child may start no program: the shell
    never executes (exit status 127 << 8), and the otherwise honest file passes."""
    v = grade(grader, p28, "row25_extern_system.py", **STATIC_OFF)
    assert _probe_lines(v.stdout_tail).get("system_status") == str(127 << 8), describe(v)
    assert "MKB_ROW25_RAN" not in v.stdout_tail and v.checks["isolation"]["detail"]["no_programs"] == "on"


def test_row25_collect_env_run_cannot_start_a_program(grader, p28):
    v = grade(grader, p28, "row25b_collect_env_run.py", **STATIC_OFF)
    assert _probe_lines(v.stdout_tail).get("ran") == "False", describe(v)


def test_row27_default_verification_catches_skipping_half_the_timed_calls():
    """By default every timed call is verified where checks are cheap, and at least 10 of 35 however costly they
    are: skipping enough calls to move the median (more than half) then escapes with probability below 1e-3, where
    the old 3 of 35 let 1 in 8 through."""
    cfg = GraderConfig()
    total = cfg.warmup_calls + cfg.timed_calls
    assert reverified_count(cfg, 0.001, total)[0] == total
    fewest = reverified_count(cfg, 60.0, total)[0]
    assert fewest == cfg.min_reverified_calls >= 10
    honest = total - (total // 2 + 1)  # calls the submission did not skip
    escape = math.comb(honest, fewest) / math.comb(total, fewest)
    old = math.comb(honest, 3) / math.comb(total, 3)
    assert escape < 1e-3 < old, (escape, old)


def test_row27_reverification_spends_its_budget_on_as_many_checks_as_it_pays_for():
    cfg = GraderConfig(reverify_budget_s=0.35, min_reverified_calls=10)
    assert reverified_count(cfg, 0.0099, 35)[0] == 35  # 0.35 s pays for all
    assert reverified_count(cfg, 0.0139, 35)[0] == 25
    assert reverified_count(cfg, 0.25, 35)[0] == 10
    assert reverified_count(GraderConfig(reverified_calls=3), 0.001, 35)[0] == 3


@pytest.mark.parametrize("budget_s, checked", [(0.0, 2), (1e6, 7)])
def test_row27_a_grading_verifies_what_its_measured_check_cost_allows(grader, p28, budget_s, checked):
    """With no budget only the minimum of the timed calls is verified; with a large one, every call; the verdict
    says how many and why."""
    v = grade(grader, p28, HONEST, reverified_calls=None, reverify_budget_s=budget_s, min_reverified_calls=2)
    assert v.passed, describe(v)
    assert len([d for d in v.draws if "reverified_timed_call" in d]) == checked
    assert v.checks["reverified"]["detail"].startswith(f"{checked} of 7 timed calls"), v.checks["reverified"]
    assert ("every call" in v.checks["reverified"]["detail"]) == (checked == 7)


def test_row27_reverification_counts_every_checked_call(grader, p28):
    timed = BASE.warmup_calls + BASE.timed_calls
    v = grade(grader, p28, HONEST, reverified_calls=timed)
    assert v.passed, describe(v)
    assert sorted(d["reverified_timed_call"] for d in v.draws if "reverified_timed_call" in d) == list(range(timed))


def test_honest_grading_reports_its_new_checks(grader, p28):
    """Five draws at the timed size, pinned numerics, the eager-operator log, the kernel-only time, every call's
    integrity: all in the verdict of an honest submission."""
    v = grade(grader, p28, HONEST)
    assert v.passed, describe(v)
    main_draws = [d for d in v.draws if d["size"] == "cpu" and "reverified_timed_call" not in d]
    assert len(main_draws) >= 5
    assert v.numerics["matmul_allow_tf32"] is False and v.numerics["cudnn_allow_tf32"] is False
    assert v.numerics["matmul_allow_bf16_reduced_precision_reduction"] is False
    assert v.numerics["float32_matmul_precision"] == "highest"
    assert v.baseline["eager"]["numerics"] == v.numerics
    assert v.checks["dsl_share"]["eager_ops"] == {} and v.checks["dsl_share"]["eager_share"] == 0
    assert v.checks["dsl_share"]["passed"]
    assert 0 < v.runtime["kernel_ms"] < 1.5 * v.runtime["median_ms"], v.runtime
    assert v.checks["unpatched"]["passed"], v.checks["unpatched"]


def test_row11_fake_verdict_on_stdout_is_ignored(grader, p28):
    v = grade(grader, p28, "row11b_exit_early.py", **STATIC_OFF)
    assert '"passed": true' in v.stdout_tail and not v.passed and v.failed_check == "crash", describe(v)


def test_row07_timer_check_flags_escaped_work(p28):
    """Row 7's runtime defence on a GPU is the device-timer vs wall-clock check; exercise it through the verdict logic."""
    g = Grader(dataclasses.replace(BASE))
    state = {"checks": {}, "roofline": {"floor_ms": None}}
    failure = g._judge(p28, state, {"median_ms": 0.01, "host_median_ms": 2.0})
    assert failure is not None and failure.check == "timer" and "escaped the timer" in failure.reason
    assert state["checks"]["timer"]["passed"] is False
    state = {"checks": {}, "roofline": {"floor_ms": None}}
    assert g._judge(p28, state, {"median_ms": 1.9, "host_median_ms": 2.0}) is None


def test_row20_roofline_verdict_logic(p28):
    g = Grader(dataclasses.replace(BASE, **CPU_PEAKS))
    inputs = p28.make_inputs(0, "cpu", "cpu")
    g._set_up_problem(p28)
    roof = g._roofline(p28, "cpu", 1e-4)
    assert roof["floor_ms"] == pytest.approx(p28.bytes_moved(inputs, ()) / CPU_PEAKS["peak_bandwidth"] * 1e3)
    state = {"checks": {}, "roofline": roof}
    failure = g._judge(p28, state, {"median_ms": 1e-4, "host_median_ms": 1e-4})
    assert failure is not None and failure.check == "roofline" and "below the physical floor" in failure.reason


# ---------------------------------------------------------------------------------------------------------------
# Static rules: modules re-exported by allowed modules (the routes the runtime variants above use)
# ---------------------------------------------------------------------------------------------------------------
REEXPORT_ROUTES = [
    pytest.param('import typing\ngc = typing.sys.modules["gc"]', id="typing.sys"),
    pytest.param("from dataclasses import sys", id="from-dataclasses-import-sys"),
    pytest.param("import torch\nos = torch.os", id="torch.os"),
    pytest.param('import torch\nm = torch.importlib.import_module("metakernelbench.suite.loader")', id="torch.importlib"),
    pytest.param('import torch\nf = torch.builtins.open("/proc/1/environ")', id="torch.builtins.open"),
    pytest.param("import torch\nlib = torch.ctypes.CDLL(None)", id="torch.ctypes"),
    pytest.param("import torch\nframe = torch.inspect.currentframe()", id="torch.inspect"),
    pytest.param('import operator\nup = operator.attrgetter("f_back")', id="attrgetter-string"),
    pytest.param("import tvm_tirx\nos = tvm_tirx.os", id="tvm_tirx.os"),
    # row 22: builtins, frames and string-named attributes through allowed objects
    pytest.param('b = print.__self__', id="print.__self__"),
    pytest.param('async def f():\n    pass\nfb = f().cr_frame.f_builtins', id="coroutine-frame"),
    pytest.param('try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    t = e.__traceback__.tb_next', id="traceback"),
    pytest.param('import torch\nos = object.__getattribute__(torch, "o" + "s")', id="getattribute-string"),
    pytest.param('g = (i for i in ()).gi_code.co_consts', id="generator-code"),
    pytest.param('f = type("X", (), {})', id="type-three-args"),
    # row 23: assignment to imported modules and classes, modes, hooks
    pytest.param('import torch\ntorch.Tensor.detach = lambda self: self', id="assign-tensor-method"),
    pytest.param('import torch\ndel torch.Tensor.detach', id="del-tensor-method"),
    pytest.param('import torch\nt = torch.Tensor\nt.max = None', id="alias-then-assign"),
    pytest.param('import torch\nt = torch\nt.jit.script(None)', id="module-as-value"),
    pytest.param('from torch import cuda as c\nk = c', id="namespace-as-value"),
    pytest.param('import torch\nclass M(torch.overrides.TorchFunctionMode):\n    pass', id="torch-overrides"),
    pytest.param('class L:\n    def __torch_dispatch__(self):\n        pass', id="define-torch-dispatch"),
    pytest.param('class L:\n    __torch_function__ = None', id="bind-torch-function"),
    pytest.param('class M(type):\n    pass\nclass X(metaclass=M):\n    pass', id="metaclass"),
    pytest.param('import torch\nclass P:\n    def put(self):\n        self.detach = 1\nP.put(torch.Tensor)',
                 id="method-through-the-class"),
    pytest.param('import torch\nclass P:\n    def put(self):\n        self = torch.Tensor\n        self.max = 1',
                 id="self-rebound"),
    pytest.param('import torch\nclass P:\n    @staticmethod\n    def put(c):\n        c.max = 1', id="staticmethod-store"),
    pytest.param('import torch\ntorch.nn.functional.__dict__["relu"] = None', id="dunder-dict"),
    # row 24: other implementations
    pytest.param('import torch\nf = torch.jit.script(None)', id="torch.jit"),
    pytest.param('import torch\nf = torch.cuda.jiterator._create_jit_fn("")', id="jiterator"),
    pytest.param('from torch.cuda import jiterator', id="from-torch.cuda-import-jiterator"),
    pytest.param('import torch.utils.cpp_extension', id="cpp_extension"),
    pytest.param('import tvm_ffi\nm = tvm_ffi.cpp.load_inline("x")', id="tvm_ffi.cpp"),
    pytest.param('import tvm_ffi\nf = tvm_ffi.get_global_func("ffi.ModuleLoadFromFile")', id="tvm_ffi-registry"),
    pytest.param('import tvm_ffi\nm = tvm_ffi.Module', id="tvm_ffi-module"),
    pytest.param('from tvm_tirx.script import tirx as T\nx = T.call_packed("f")', id="call_packed"),
    pytest.param('from tvm_tirx.script import tirx as T\n@T.pyfunc\ndef f():\n    pass', id="pyfunc"),
    pytest.param('import torch\nx = torch._C._get_tracing_state()', id="torch._C"),
    pytest.param('import torch\nx = torch.classes', id="torch.classes"),
    pytest.param('import torch.multiprocessing', id="torch.multiprocessing"),
    # row 25: OS access through allowed roots
    pytest.param('from tvm_tirx.script import tirx as T\nx = T.call_extern("system", "ls", ty="int32")',
                 id="extern-system"),
    pytest.param('from tvm_tirx.script import tirx as T\nname = "sys" + "tem"\nx = T.call_extern(name, ty="int32")',
                 id="extern-computed-name"),
    pytest.param('import torch\nx = torch.from_file("/etc/passwd")', id="torch.from_file"),
    pytest.param('import torch\nx = torch.UntypedStorage.from_file("/etc/passwd")', id="storage-from_file"),
    pytest.param('import torch\nx = torch.serialization.load("f")', id="torch.serialization"),
    pytest.param('import torch\nx = torch.utils.collect_env.run("ls")', id="collect_env"),
    pytest.param('import torch\nx = torch.load("f")', id="torch.load"),
]

ALLOWED_ROUTES = [
    pytest.param('import torch\nclass K:\n    def __init__(self, n):\n        self.n = n\n        self._cache = {}',
                 id="self-attributes"),
    pytest.param('from tvm_tirx.script import tirx as T\ny = T.call_pure_extern("fmaxf", 1.0, 2.0, ty="float32")',
                 id="math-extern"),
    pytest.param('import torch\ns = torch.cuda.current_stream()\nc = torch.cuda.get_device_capability()',
                 id="torch.cuda-allowed"),
    pytest.param('from torch.utils.dlpack import from_dlpack\nimport torch.nn.functional as F\ny = F.relu',
                 id="dlpack-and-functional"),
    pytest.param('import torch\nx = torch.empty((2, 3), dtype=torch.bfloat16)\ny = x.view(-1)', id="glue"),
]


@pytest.mark.parametrize("snippet", ALLOWED_ROUTES)
def test_static_rules_allow_the_safe_subset(snippet):
    source = snippet + "\n\n\ndef solve(*inputs):\n    return inputs\n"
    assert get_adapter("tirx").check_source(source) == []


@pytest.mark.parametrize("snippet", REEXPORT_ROUTES)
def test_static_rules_block_reexported_modules(snippet):
    source = snippet + "\n\n\ndef solve(*inputs):\n    return inputs\n"
    violations = get_adapter("tirx").check_source(source)
    assert violations, f"the static rules accept a route to a forbidden module: {snippet!r}"


# ---------------------------------------------------------------------------------------------------------------
# Row 13: the float budget itself (compare is the parent's)
# ---------------------------------------------------------------------------------------------------------------
def _rmsnorm_variants(x, residual, weight):
    h = x.float() + residual.float()  # the sum stays in fp32, as the problem says
    inv = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
    acc = torch.zeros(h.shape[0], dtype=torch.bfloat16)
    for j in range(h.shape[1]):  # sum of squares accumulated in bf16
        acc = (acc.float() + (h[:, j] * h[:, j]).bfloat16().float()).bfloat16()
    return {
        "fp32_accumulation_honest": (h * inv * weight.float()).bfloat16(),
        "bf16_accumulation": (h * torch.rsqrt(acc.float()[:, None] / h.shape[1] + 1e-5) * weight.float()).bfloat16(),
        "fp8_e4m3_output_precision": (h * inv * weight.float()).to(torch.float8_e4m3fn).bfloat16(),
    }


@pytest.mark.parametrize("variant, should_pass", [("fp32_accumulation_honest", True), ("bf16_accumulation", False),
                                                  ("fp8_e4m3_output_precision", False)])
def test_float_budget_rejects_precision_downgrades(p28, variant, should_pass):
    for size in ("cpu", "cpu_odd"):
        for seed in (1, 2):
            inputs = p28.make_inputs(seed, "cpu", size)
            lp = p28.reference(*[t.clone() for t in inputs])
            wide = p28.reference(*[t.double() for t in inputs])
            outs = _rmsnorm_variants(*inputs)
            check = compare(p28, (outs[variant],), lp, wide)[0]
            loose = torch.allclose(outs[variant].float(), lp[0].float(), atol=1e-2, rtol=1e-2)
            assert check.passed == should_pass, (
                f"{variant} at {size}/seed {seed}: passed={check.passed} error={check.error:.4g} "
                f"budget={check.budget:.4g} (passes atol=rtol=1e-2: {loose})")


# ---------------------------------------------------------------------------------------------------------------
# Rows 14-16: the suite audit (every problem)
# ---------------------------------------------------------------------------------------------------------------
PROBLEMS = load_suite()


def _shapes(values):
    return [tuple(t.shape) if isinstance(t, torch.Tensor) else t for t in values]


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.id)
def test_suite_outputs_vary_with_seed_and_constants_fail(problem):
    for size in problem.check_sizes("cpu"):
        a_in, b_in = problem.make_inputs(11, "cpu", size), problem.make_inputs(12, "cpu", size)
        a = problem.reference(*[t.clone() if isinstance(t, torch.Tensor) else t for t in a_in])
        b = problem.reference(*[t.clone() if isinstance(t, torch.Tensor) else t for t in b_in])
        wide = problem.reference(*[t.double() if isinstance(t, torch.Tensor) and t.dtype.is_floating_point
                                   else t.clone() if isinstance(t, torch.Tensor) else t for t in a_in])
        for i, (x, y) in enumerate(zip(a, b)):
            x64, y64 = x.double(), y.double()
            name = problem.outputs[i] if problem.outputs else i
            assert not torch.equal(x64, y64), f"{problem.id} {size}: output {name} does not vary with the seed"
            spread = float(x64.max() - x64.min())
            assert spread > 1e-3 * max(1.0, float(x64.abs().max())), f"{problem.id} {size}: {name} is near-constant"
            for constant in (0.0, float(x64.mean())):  # a constant answer must fail the comparison
                fake = list(a)
                fake[i] = torch.full_like(x64, constant).to(x.dtype)
                checks = compare(problem, tuple(fake), a, wide)
                assert not checks[i].passed, f"{problem.id} {size}: constant {constant:.3g} passes for {name}"


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.id)
def test_suite_held_out_sizes_differ_in_shape(problem):
    sizes = problem.module.SIZES
    for main, odd in (("full", "odd"), ("cpu", "cpu_odd")):
        assert main in sizes and odd in sizes, f"{problem.id} lacks the {main}/{odd} pair"
        assert sizes[main] != sizes[odd], f"{problem.id}: {odd} repeats {main}"
    cpu = _shapes(problem.make_inputs(3, "cpu", "cpu"))
    cpu_odd = _shapes(problem.make_inputs(3, "cpu", "cpu_odd"))
    assert cpu != cpu_odd, f"{problem.id}: cpu_odd inputs have the cpu shapes"
    assert problem.check_sizes("cpu") == ("cpu", "cpu_odd") and problem.timed_size("cpu") == "cpu"
    assert "cpu_odd" not in problem.check_sizes("cuda") and "odd" in problem.check_sizes("cuda")


# ---------------------------------------------------------------------------------------------------------------
# Row 19 and bad inputs: clear failing verdicts, and the next grading in the same Grader still works
# ---------------------------------------------------------------------------------------------------------------
OOM_LIMIT = 4 << 30  # RLIMIT_AS for the child: the honest child needs ~1.5 GB of address space here
BAD = [
    pytest.param(ADV / "does_not_exist.py", {}, "static_rules", r"cannot read .*does_not_exist\.py", id="missing-file"),
    pytest.param("bad_syntax.py", {}, "static_rules", r"syntax error at line 5", id="syntax-error"),
    pytest.param("bad_syntax.py", STATIC_OFF, "import", r"SyntaxError", id="syntax-error-runtime"),
    pytest.param("bad_no_solve.py", {}, "static_rules", r"no top-level function `solve", id="no-solve"),
    pytest.param("bad_no_solve.py", STATIC_OFF, "import", r"defines no callable `solve`", id="no-solve-runtime"),
    pytest.param("bad_shape.py", {}, "correctness", r"output 'y': shape \(512, 64\) != expected \(64, 512\)",
                 id="wrong-shape"),
    pytest.param("bad_dtype.py", {}, "correctness", r"output 'y': dtype torch\.float32 != expected torch\.bfloat16",
                 id="wrong-dtype"),
    pytest.param("bad_raises.py", {}, "runtime_error", r"solve raised: ValueError: deliberate failure inside solve",
                 id="exception"),
    pytest.param("bad_recursion.py", {}, "runtime_error", r"RecursionError: maximum recursion depth", id="recursion"),
    pytest.param("bad_hang.py", dict(first_call_timeout_s=2, call_timeout_s=2), "timeout",
                 r"no answer within 2 s \(hang or endless loop\); process killed", id="hang"),
    pytest.param("row19_crash_context.py", {}, "crash", r"exit code -11", id="segfault-oob-kernel"),
    pytest.param("bad_stack_overflow.py", STATIC_OFF, "crash", r"process died.*exit code -11", id="c-stack-overflow"),
    pytest.param("bad_oom.py", dict(memory_limit_bytes=OOM_LIMIT), ("runtime_error", "crash"),
                 r"can't allocate memory|Cannot allocate memory|MemoryError", id="out-of-memory"),
]


@pytest.mark.parametrize("name, changes, checks, reason", BAD)
def test_grader_survives_bad_submissions(grader, p28, name, changes, checks, reason):
    started = time.monotonic()
    v = grade(grader, p28, name, **changes)
    assert_rejected(v, checks, reason)
    assert "\n" not in v.reason, "a verdict's reason is one line"
    if changes.get("call_timeout_s"):
        assert time.monotonic() - started < 30, "a hung child must be killed at its call timeout"
    after = grade(grader, p28, HONEST, **changes)
    assert after.passed, f"the grading after {name} failed: {describe(after)}"


# ---------------------------------------------------------------------------------------------------------------
# "Also required": no secrets, private working directory, capped output
# ---------------------------------------------------------------------------------------------------------------
def _probe_lines(stdout: str) -> dict:
    return dict(re.findall(r"PROBE (\w+)=(\S*)", stdout))


def test_child_environment_cwd_and_output_cap(grader, p28):
    v = grade(grader, p28, "also_required_probe.py", **STATIC_OFF)  # the probe reaches os/open via re-exports
    assert v.passed, describe(v)
    probe = _probe_lines(v.stdout_tail)
    assert probe.get("env_canary") == "absent", f"a secret-named variable reached the child: {v.stdout_tail[-400:]}"
    cwd = Path(probe["cwd"])
    assert cwd.name.startswith("mkb-child-") and cwd.resolve() != ROOT and not cwd.is_relative_to(ROOT)
    assert probe["home"] == probe["cwd"] and probe["tmpdir"] == probe["cwd"]
    assert not cwd.exists(), "the child's private directory must be removed after grading"
    assert len(v.stdout_tail.encode()) <= 8192, "stdout must come back capped"


GRADE_IN_SUBPROCESS = """
import json, os, resource, sys
from metakernelbench.grader import Grader, GraderConfig
from metakernelbench.suite import load_problem
g = Grader(GraderConfig(device="cpu", warmup_calls=1, timed_calls=2, baseline_processes=1, static_rules=False,
                        extra_env={"PYTHONPATH": sys.argv[2]}))
problem = load_problem("28")
g.grade(problem, "tirx", sys.argv[3])  # warm up: fork server, eager baseline
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
v = g.grade(problem, "tirx", sys.argv[1])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"passed": v.passed, "failed_check": v.failed_check, "reason": v.reason,
                  "stdout": v.stdout_tail[-600:], "peak_rss_growth_kb": after - before}), flush=True)
os._exit(0)
"""


def grade_in_subprocess(tmp_path: Path, name: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    """Grade one file (static rules off: runtime defences only) in a fresh grading process that holds a canary
    secret in its own exec-time environment."""
    script = tmp_path / "grade_in_subprocess.py"
    script.write_text(GRADE_IN_SUBPROCESS)
    env = {**os.environ, CANARY_VAR: CANARY, "PYTHONPATH": PYTHONPATH}
    proc = subprocess.run([sys.executable, str(script), str(ADV / name), PYTHONPATH, str(HONEST)], env=env,
                          capture_output=True, text=True, timeout=180, cwd=tempfile.gettempdir())
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc, (json.loads(lines[-1]) if lines else None)


def test_parent_environment_not_readable_from_child(tmp_path):
    """A secret in the grading process's own environment must not be readable through /proc/<ancestor>/environ."""
    proc, result = grade_in_subprocess(tmp_path, "also_required_probe.py")
    assert result is not None, f"rc={proc.returncode} {proc.stderr[-2000:]}"
    probe = _probe_lines(result["stdout"])
    assert probe.get("env_canary") == "absent", result
    assert probe.get("ancestor_canary") == "absent", (
        "the child read a secret from an ancestor's /proc/<pid>/environ (the grading process's environment)")


def test_row19_child_cannot_kill_the_grading_process(tmp_path):
    proc, result = grade_in_subprocess(tmp_path, "row19d_kill_grader.py")
    assert proc.returncode == 0 and result is not None, (
        f"the submission killed the grading process (exit status {proc.returncode}); no verdict came back")
    assert not result["passed"], result


def test_row19_killed_fork_server_does_not_break_later_grading(p28):
    """Own Grader: when this defence is missing, the killed fork server would break every later test's grading."""
    with Grader(dataclasses.replace(BASE, **STATIC_OFF)) as g:  # the file reaches os through a re-export
        assert g.grade(p28, "tirx", HONEST).passed  # fork server up, eager baseline cached
        try:
            v = g.grade(p28, "tirx", ADV / "row19b_kill_fork_server.py")
        except Exception as exc:  # noqa: BLE001 - a raise instead of a verdict is the failure under test
            pytest.fail(f"grade() raised {type(exc).__name__}: {exc} instead of returning a verdict")
        assert not v.passed, describe(v)
        try:
            after = g.grade(p28, "tirx", HONEST)
        except Exception as exc:  # noqa: BLE001
            pytest.fail(f"after a submission killed the fork server, grade() raises {type(exc).__name__}: {exc}")
        assert after.passed, describe(after)


def test_row19_oversized_output_does_not_flood_the_parent(tmp_path):
    proc, result = grade_in_subprocess(tmp_path, "row19c_flood_parent.py")
    assert result is not None, f"rc={proc.returncode} {proc.stderr[-2000:]}"
    assert not result["passed"] and result["failed_check"] in ("correctness", "integrity", "crash"), result
    growth_mb = result["peak_rss_growth_kb"] / 1024
    assert growth_mb < 256, (f"a 1 GiB output (64 KiB expected) grew the trusted parent's peak RSS by "
                             f"{growth_mb:.0f} MB: the parent accepts blobs up to 64 GiB before any shape check")


def test_fork_server_closes_promptly():
    g = Grader(dataclasses.replace(BASE))
    g._fork_server("tirx")
    process = g._server.process
    started = time.monotonic()
    g.close()
    elapsed = time.monotonic() - started
    assert elapsed < 3, (f"Grader.close() took {elapsed:.1f} s (and then SIGKILLed the server): the fork server "
                         f"never saw its control socket close")
    assert process.wait(timeout=5) == 0, "the fork server should exit on its own, with status 0"
