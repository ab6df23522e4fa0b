"""Task statements: the exact text an agent gets for one variant (a problem posed in one DSL).

Variants of a problem differ only in the DSL section, so any difference between arms comes from the DSL or the
skill, never from the wording of the problem.
"""
from __future__ import annotations

import inspect

from metakernelbench.dsl import get_adapter, other_kernel_languages
from metakernelbench.suite import Problem

GRADING = """\
## How you are graded
- Your file is imported in a fresh process. Each call to `solve` gets fresh inputs made from seeds you cannot see
  (new values and new storage every call); outputs are compared with the reference above computed elsewhere.
- Correctness: at least 5 draws at the main size plus draws at other sizes ({sizes}); floating outputs must be
  within a few times the bf16/fp32 reference's own rounding error of an fp64 reference; integer outputs must match
  exactly; NaN/Inf fail. Inputs that are not in-place outputs must be left bit-identical.
- Every call must launch at least one kernel written in {dsl_title}, and that kernel must compute data the outputs
  depend on: the grader re-runs `solve` with your DSL launches neutralised and the outputs must change.
- Eager PyTorch in `solve` may allocate, fill, take views and read scalars: some calls run under a log of torch's
  operators, and arithmetic, reductions, copies, casts or gathers outside your DSL launches fail the file once they
  read more than 1/64 of the inputs' elements (summing a few lengths to size an output is fine).
- Speed: after warm-up, {timed} calls with fresh inputs, L2 flushed before each, timed end to end (device
  synchronised before the end event); each of the 35 calls is verified like the draws, or, where the outputs are
  so large that a check is costly, at least 10 of them chosen at random.
  Reported: median runtime, the kernels' own device time (from separate calls), speedup over PyTorch eager (and
  torch.compile) timed the same way, and fraction of the roofline.
- A runtime below the physical floor (bytes / peak bandwidth, flops / peak compute) fails. So do: patching the
  grader, timers or torch (assigning to attributes of imported modules or classes, torch modes, hooks); threads,
  native ones included, or streams that outlive a call; caching results between calls; reading files, starting
  programs, loading native code; other kernel languages ({forbidden}). Only a safe subset of Python is accepted:
  no dunder, private or frame attributes, only the listed parts of torch's namespaces.
"""


def task_statement(problem: Problem, dsl: str) -> str:
    adapter = get_adapter(dsl)
    reference_source = inspect.getsource(problem.module)
    sizes = ", ".join(problem.check_sizes("cuda"))
    signature = inspect.signature(problem.module.reference)
    origin = problem.family if problem.source_model == "unknown" else f"{problem.family}, from {problem.source_model}"
    return "\n".join([
        f"# Task: {problem.summary}",
        "",
        f"Problem {problem.number} ({origin}), to be written in {adapter.title}.",
        "",
        "## Reference (PyTorch): its docstring states the semantics; its code defines inputs and exact numerics",
        "```python",
        reference_source.rstrip(),
        "```",
        "",
        "## What to submit",
        f"One Python file defining `solve{signature}`: same arguments as `reference`, same output structure, "
        "dtypes, shapes and device. Eager PyTorch may do glue (allocation, views), but the work must be done by "
        f"kernels written in {adapter.title} in this file.",
        "",
        adapter.guide().rstrip(),
        "",
        GRADING.format(sizes=sizes, dsl_title=adapter.title, timed=30,
                       forbidden=", ".join(other_kernel_languages(dsl))),
    ])
