"""Where one honest grading's overhead goes: grade a reference once to warm the grader, then again under cProfile,
and print the verdict's timings, the wall time of each kind of request to the child, the child's set-up phases up to
its ready report, and the parent's hot spots.
GPU or CPU; trusted code (it wraps the grader's request method to time it).

    python benchmarks/overhead_profile.py cute mlp_norm/28_fused_add_rmsnorm_h4096_llama31_8b
"""
from __future__ import annotations

import collections
import cProfile
import pstats
import sys
import time

from metakernelbench.grader import Grader, GraderConfig, parent
from metakernelbench.suite import load_problem


def main() -> None:
    dsls, problem = sys.argv[1].split(","), load_problem(sys.argv[2])
    per_request = collections.defaultdict(lambda: [0, 0.0])
    request = parent._Session.request

    ready = {}

    def timed(session, message, *args, **kwargs):
        started = time.monotonic()
        try:
            reply = request(session, message, *args, **kwargs)
            if not message:
                ready.update(reply.get("setup_s", {}), import_submission=reply.get("import_s"))
            return reply
        finally:
            kind = message.get("op", "ready") + "".join(f"+{f}" for f in ("ghost", "profile") if message.get(f))
            per_request[kind][0] += 1
            per_request[kind][1] += time.monotonic() - started

    parent._Session.request = timed
    with Grader(GraderConfig(compile_baseline=False, baseline_processes=1, preload_dsls=tuple(dsls))) as grader:
        for dsl in dsls:
            grader.grade(problem, dsl, problem.graded_solution(dsl))
            per_request.clear()
            profile = cProfile.Profile()
            profile.enable()
            verdict = grader.grade(problem, dsl, problem.graded_solution(dsl))
            profile.disable()
            print(dsl, verdict.passed, {k: round(v, 3) for k, v in verdict.timings_s.items()})
            print({k: (n, round(s, 3)) for k, (n, s) in sorted(per_request.items(), key=lambda kv: -kv[1][1])})
            print("child set-up", {k: round(v, 3) for k, v in ready.items() if v is not None})
            stats = pstats.Stats(profile)
            stats.sort_stats("cumulative").print_stats(35)
            stats.sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
