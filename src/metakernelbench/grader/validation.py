"""Validation: grade every reference solution on a GPU, or compile-check each for a GPU arch where there is none.

The record it writes (GPU, driver, versions, per-variant verdicts) is what backs a "passes on H200" claim.
"""
from __future__ import annotations

import datetime
import importlib.metadata
import platform
import time
from pathlib import Path

import torch

from metakernelbench.dsl import get_adapter
from metakernelbench.grader.parent import Grader, GraderConfig, device_name
from metakernelbench.suite import Problem

RECORD_LEGEND = {
    "mode": "'grade' (every reference solution graded on the GPU) or 'compile' (CPU only: compiled for `arch`)",
    "environment": "machine, GPU, driver, Python, torch and DSL versions",
    "variants": "one row per problem x DSL: passed, failed_check, reason, median_ms, fraction_of_roofline, "
                "speedup_vs_eager (+ range), grading seconds; in compile mode: ok, seconds, error",
    "summary": "variants passed / total, wall seconds for the whole validation",
}


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(device: str) -> dict:
    env = {"python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
           "device": device, "device_name": device_name(device),
           "nvidia-cutlass-dsl": _version("nvidia-cutlass-dsl"), "apache-tvm-tirx": _version("apache-tvm-tirx")}
    if torch.device(device).type == "cuda":
        env["cuda_runtime"] = torch.version.cuda
        try:
            import subprocess
            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            env["driver"] = None
    if env["nvidia-cutlass-dsl"] is None or env["apache-tvm-tirx"] is None:
        for name, module in (("nvidia-cutlass-dsl", "cutlass"), ("apache-tvm-tirx", "tvm_tirx")):
            if env[name] is None:
                try:
                    env[name] = getattr(__import__(module), "__version__", "imported (version unknown)")
                except Exception:
                    env[name] = None
    return env


def validate(problems: list[Problem], dsls: list[str], device: str, arch: str = "sm_90a",
             compile_baseline: bool | None = None, progress=lambda row: None) -> dict:
    started = time.monotonic()
    on_gpu = torch.device(device).type == "cuda"
    rows = []
    if on_gpu:
        with Grader(GraderConfig(device=device, compile_baseline=compile_baseline, preload_dsls=tuple(dsls))) as grader:
            for problem in problems:
                for dsl in dsls:
                    path = problem.solution_path(dsl)
                    verdict = grader.grade(problem, dsl, path)
                    row = {"problem": problem.id, "dsl": dsl, "passed": verdict.passed,
                           "failed_check": verdict.failed_check, "reason": verdict.reason,
                           "median_ms": verdict.runtime.get("median_ms"),
                           "fraction_of_roofline": verdict.roofline.get("fraction"),
                           "speedup_vs_eager": verdict.speedup_vs_eager,
                           "speedup_vs_eager_range": verdict.speedup_vs_eager_range,
                           "speedup_vs_compile": verdict.speedup_vs_compile,
                           "seconds": verdict.timings_s.get("total"), "verdict": verdict.to_dict()}
                    rows.append(row)
                    progress(row)
    else:
        for problem in problems:
            for dsl in dsls:
                check = get_adapter(dsl).compile_check(problem.solution_path(dsl), arch)
                row = {"problem": problem.id, "dsl": dsl, "passed": check.ok, "arch": arch,
                       "seconds": check.seconds, "error": check.error}
                rows.append(row)
                progress(row)
    return {
        "legend": RECORD_LEGEND,
        "mode": "grade" if on_gpu else "compile",
        "arch": None if on_gpu else arch,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "environment": environment(device),
        "variants": rows,
        "summary": {"passed": sum(r["passed"] for r in rows), "total": len(rows),
                    "seconds": time.monotonic() - started},
    }
