"""Validation: grade reference solutions on a GPU into the ledger, or compile-check them where there is no GPU.

The ledger is GPU truth kept per variant: one record per graded reference, keyed by (problem, DSL, sha256 of the
graded file, GPU, versions). A record vouches for its variant as long as the bundled file is unchanged, so the suite
is re-validated variant by variant (`--changed`), not all at once. Each validation run appends one JSON-lines file
to the ledger folder; the ledger is the union of its files.
"""
from __future__ import annotations

import datetime
import json
import platform
import re
import subprocess
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from metakernelbench.dsl import get_adapter
from metakernelbench.dsl.adapter import CompileJob
from metakernelbench.grader.parent import Grader, GraderConfig, device_name
from metakernelbench.grader.verdict import Verdict
from metakernelbench.suite import Problem

LEDGER_LEGEND = {
    "problem": "problem id (family/nn_name)",
    "dsl": "the variant's DSL",
    "sha256": "sha256 of the graded file: the reference with its kit inlined (`Problem.graded_solution`)",
    "gpu": "the GPU's name as CUDA reports it",
    "versions": "torch, CUDA runtime, driver and the DSL's distributions when graded",
    "date": "UTC time of the grading",
    "passed, failed_check, reason": "the verdict's outcome",
    "median_ms, fraction_of_roofline, speedup_vs_eager, speedup_vs_eager_range, speedup_vs_compile": "its figures",
    "seconds": "wall time of the grading (the first variant of a problem also times the eager baselines)",
    "verdict": "the full verdict (`mkb legend` explains its fields)",
}


@dataclass(frozen=True)
class LedgerRecord:
    problem: str
    dsl: str
    sha256: str
    gpu: str
    versions: dict
    date: str
    passed: bool
    failed_check: str | None
    reason: str
    median_ms: float | None
    fraction_of_roofline: float | None
    speedup_vs_eager: float | None
    speedup_vs_eager_range: list | None
    speedup_vs_compile: float | None
    seconds: float | None
    verdict: dict

    def vouches_for(self, problem_id: str, dsl: str, sha256: str, gpu: str, versions: dict | None = None) -> bool:
        """A passing record of this graded file on `gpu` (and these versions, when given)."""
        return (self.passed and self.problem == problem_id and self.dsl == dsl and self.sha256 == sha256
                and gpu in self.gpu and (versions is None or self.versions == versions))


AWAITING_LEGEND = {
    "variants": "references committed without a GPU record yet, each at the graded-file sha256 it was listed with",
    "why": "what kept them from the GPU",
}


def read_awaiting(path: Path) -> dict[tuple[str, str], dict]:
    """(problem, DSL) -> entry of the committed list of references still awaiting their GPU record."""
    if not Path(path).is_file():
        return {}
    return {(e["problem"], e["dsl"]): e for e in json.loads(Path(path).read_text())["variants"]}


def write_awaiting(path: Path, entries: list[dict]) -> None:
    Path(path).write_text(json.dumps({"legend": AWAITING_LEGEND, "variants": entries}, indent=1) + "\n")


def versions(device: str, dsl: str) -> dict:
    """What a record's GPU truth depends on besides the file: torch, the CUDA runtime, the driver, the DSL."""
    found = {"torch": torch.__version__, "cuda_runtime": torch.version.cuda, "driver": _driver(device)}
    found.update(get_adapter(dsl).versions())
    return found


def environment(device: str) -> dict:
    """Where a run grades: machine, GPU, driver, Python, torch and every registered DSL's versions."""
    from metakernelbench.dsl import dsl_names

    env = {"python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
           "device": device, "device_name": device_name(device), "cuda_runtime": torch.version.cuda,
           "driver": _driver(device)}
    for name in dsl_names():
        env.update(get_adapter(name).versions())
    return env


def _driver(device: str) -> str | None:
    if torch.device(device).type != "cuda":
        return None
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def read_ledger(folder: Path) -> list[LedgerRecord]:
    records = []
    for path in sorted(Path(folder).glob("*.jsonl")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    records.append(LedgerRecord(**json.loads(line)))
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"{path}:{number}: not a ledger record ({exc})") from exc
    return records


def record_name(gpu: str) -> str:
    """A new ledger file's name: the GPU and the UTC time, e.g. h200-2026-12-02T101500.jsonl."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower().removeprefix("nvidia ")).strip("-") or "gpu"
    return f"{slug}-{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H%M%S}.jsonl"


def grade_references(variants: list[tuple[Problem, str]], device: str, record: Path,
                     compile_baseline: bool | None = None, progress=lambda r: None) -> list[LedgerRecord]:
    """Grade each variant's graded reference in one grader (one fork server: the DSL imports are paid once),
    appending each record to `record` as soon as it exists, so an interrupted run keeps what it graded."""
    record.parent.mkdir(parents=True, exist_ok=True)
    gpu = device_name(device)
    dsls = tuple(sorted({dsl for _, dsl in variants}))
    records = []
    with Grader(GraderConfig(device=device, compile_baseline=compile_baseline, preload_dsls=dsls)) as grader:
        for problem, dsl in variants:
            try:
                verdict = grader.grade(problem, dsl, problem.graded_solution(dsl))
            except Exception:  # a fault of the grader's own: recorded as this variant's failure, the others go on
                verdict = Verdict(problem=problem.id, dsl=dsl, device=device, file_sha256=problem.solution_sha256(dsl),
                                  compiled=False, correct=False, passed=False, failed_check="grader",
                                  reason=f"the grader itself failed: {traceback.format_exc(limit=-3)}")
            row = LedgerRecord(
                problem=problem.id, dsl=dsl, sha256=verdict.file_sha256, gpu=gpu, versions=versions(device, dsl),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                passed=verdict.passed, failed_check=verdict.failed_check, reason=verdict.reason,
                median_ms=verdict.runtime.get("median_ms"), fraction_of_roofline=verdict.roofline.get("fraction"),
                speedup_vs_eager=verdict.speedup_vs_eager, speedup_vs_eager_range=verdict.speedup_vs_eager_range,
                speedup_vs_compile=verdict.speedup_vs_compile, seconds=verdict.timings_s.get("total"),
                verdict=verdict.to_dict())
            with open(record, "a") as f:
                f.write(json.dumps(asdict(row), default=str) + "\n")
            records.append(row)
            progress(row)
    return records


def compile_references(variants: list[tuple[Problem, str]], arch: str, progress=lambda c: None) -> list:
    """Compile every graded reference for `arch` without a GPU: one process per DSL, the DSLs side by side."""
    from concurrent.futures import ThreadPoolExecutor

    by_dsl: dict[str, list[CompileJob]] = {}
    for problem, dsl in variants:
        by_dsl.setdefault(dsl, []).append(CompileJob(problem.id, str(problem.graded_solution(dsl)),
                                                     tuple(problem.gpu_size_dims())))
    with ThreadPoolExecutor(max_workers=max(1, len(by_dsl))) as pool:
        futures = {dsl: pool.submit(get_adapter(dsl).compile_checks, jobs, arch) for dsl, jobs in by_dsl.items()}
        results = {dsl: dict(zip((j.key for j in by_dsl[dsl]), f.result())) for dsl, f in futures.items()}
    checks = []
    for problem, dsl in variants:
        check = results[dsl][problem.id]
        checks.append((problem, check))
        progress((problem, check))
    return checks

