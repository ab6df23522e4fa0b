"""The verdict: the grader's complete, JSON-serialisable judgement of one submission."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

VERDICT_LEGEND = {
    "problem": "problem id (family/nn_name)",
    "dsl": "the variant's DSL",
    "file_sha256": "hash of the graded file",
    "device": "device the submission ran on, with its name",
    "compiled": "the file passed the static rules, imported, and its first call ran without raising",
    "correct": "every correctness draw, re-verified timed call and the ghost replay passed",
    "passed": "compiled and correct and every integrity check passed and the runtime is physically plausible",
    "failed_check": "the first check that failed: static_rules, import, runtime_error, timeout, crash, correctness, "
                    "launch, ghost_replay, dsl_share, integrity, timer, roofline (null when passed)",
    "reason": "one line saying why it failed",
    "draws": "per correctness draw: size, per-output rule, error, budget, pass, seconds (its check: references, "
             "hand-over, comparison), and how the outputs came back (transport: ipc = device to device through "
             "CUDA IPC, file = through a parent-sized file), how the "
             "parent's inputs reached the child (inputs_transport, the same two ways) and the row slices the fp64 "
             "anchor ran in (fp64_slices, 1 when whole)",
    "runtime": "timed calls in ms: median, mean, min, max, p10, p90, spread=(p90-p10)/median, "
               "max_over_median (super-batching shows here), n, host_median_ms (wall clock of the same calls), host (how "
               "the timing process was steadied on a GPU: the one CPU it was pinned to, CUDA's synchronisation "
               "schedule; the garbage collector is off inside every timed call), kernel_ms (the kernel-only time of "
               "one call, median of separate profiled calls that are never timed: device time of the kernels on a "
               "GPU, time inside the DSL's launches on the CPU)",
    "baseline": "PyTorch eager (and torch.compile where it compiles) timed by the same procedure, one median per "
                "fresh process; spread=(max-min)/median across processes",
    "speedup_vs_eager": "eager median / submission median; speedup_vs_eager_range uses the slowest and fastest "
                        "eager process, so a range that straddles 1 means the difference is noise",
    "speedup_vs_compile": "torch.compile median / submission median (null when torch.compile was not graded)",
    "roofline": "bytes and flops of the problem, the floor time at the device's peak bandwidth/compute, and "
                "fraction = floor / median runtime",
    "checks": "integrity checks, each {passed, detail}",
    "timings_s": "grading phases in seconds: server_start (starting the fork server that imports torch and the "
                 "DSLs and prepares the first child: once per grader and DSL set, else 0), problem_setup (the "
                 "references at every checked size on throwaway inputs, compared with themselves: once per problem, "
                 "else 0), import (a fresh child up to its ready report), import_submission (the part of it "
                 "running the submission's module), first_call (the first call at each checked size, which "
                 "includes the submission's compile for that shape), timed_calls (the timed loop, without its "
                 "re-verifications), verify (references, output hand-over and comparison over all checked draws), "
                 "baseline (0 when cached for the problem), total, overhead (total minus server start, problem "
                 "setup, the submission's import, first calls, timed calls and baseline: what the grader itself "
                 "costs per submission)",
    "numerics": "the numerics the references and the eager/compile baselines ran under (TF32 and reduced-precision "
                "reductions off)",
    "stdout_tail": "last bytes the submission printed (capped)",
    "stderr_tail": "last bytes of the submission's stderr (capped)",
}


@dataclass(frozen=True)
class Verdict:
    problem: str
    dsl: str
    file_sha256: str
    device: str
    compiled: bool
    correct: bool
    passed: bool
    failed_check: str | None
    reason: str
    draws: list[dict] = field(default_factory=list)
    runtime: dict[str, Any] = field(default_factory=dict)
    baseline: dict[str, Any] = field(default_factory=dict)
    speedup_vs_eager: float | None = None
    speedup_vs_eager_range: list[float] | None = None
    speedup_vs_compile: float | None = None
    roofline: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, dict] = field(default_factory=dict)
    timings_s: dict[str, float] = field(default_factory=dict)
    numerics: dict[str, Any] = field(default_factory=dict)
    stdout_tail: str = ""
    stderr_tail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)
