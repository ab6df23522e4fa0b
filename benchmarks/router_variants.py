"""Router (problem 76) kernel variants side by side, the way its redesigns were measured: exact ids on the
problem's inputs and on tie-heavy stress inputs, weights under the grader's fp64-anchored rule, and CUPTI kernel time
at the full size and, optionally, at smaller token counts (4224 tokens is one CTA of 32 per H200 SM: its time over a
load-only kernel's is the single-warp latency of the selection).

    python benchmarks/router_variants.py FILE[:ENV=VALUE,...] ... [--sweep 4224,8448] [--out FILE]   (trusted code)

Each FILE is a solution module (`solve(logits, top_k)`), such as the references under src/metakernelbench/suite/moe/
76_softmax_topk_router_renorm/ or a copy being tuned; ENV=VALUE pairs are set in its environment, so one file can hold
switches. Every variant runs in its own process: a crashing kernel cannot poison the next one's CUDA context. On a
machine without a GPU only the checks run, on the CPU sizes.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import reference_roofline  # a sibling: the script's own folder is on sys.path
import torch

from metakernelbench.grader.compare import check_float
from metakernelbench.suite import load_problem

CALLS = 23
STRESS_TOKENS = 4099



def stress_inputs(seed: int, device: str, experts: int):
    """Rows built to break tie handling: integer logits, all-equal rows, -0.0 against +0.0, tiny and huge scales, a
    tied block at the end of a row, half a row of +inf."""
    gen = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randint(-3, 4, (STRESS_TOKENS, experts), generator=gen, device=device).float()
    logits[::7] = 0.0
    logits[1::7] = -0.0
    logits[2::7, ::3] = -0.0
    logits[3::7] = torch.randn(logits[3::7].shape, generator=gen, device=device) * 1e-30
    logits[4::7] = torch.randn(logits[4::7].shape, generator=gen, device=device) * 1e30
    logits[5::7, experts - 28:] = 7.0
    logits[6::7, : experts // 2] = float("inf")
    return logits, 8


def check(problem, solve, inputs, weights: bool) -> dict:
    got_w, got_i = solve(*inputs)
    want_w, want_i = problem.reference(*[t.clone() if isinstance(t, torch.Tensor) else t for t in inputs])
    row = {"rows_with_wrong_ids": int((got_i.cpu() != want_i.cpu()).any(1).sum())}
    if weights:  # the stress rows' weights are NaN in the reference wherever +inf is selected
        exact_w, _ = problem.reference(inputs[0].double(), inputs[1])
        verdict = check_float("topk_weights", got_w.cpu(), want_w.cpu(), exact_w.cpu())
        row["weight_error_over_budget"] = verdict.error / verdict.budget if verdict.passed else None
    return row


def kernel_us(solve, draws: list, tokens: int, device: str) -> float:
    """Mean kernel time per call (CUPTI) over the draws cut to `tokens` rows, the L2 flushed before each call."""
    cut = [(logits[:tokens].contiguous(), k) for logits, k in draws]
    return reference_roofline.time_calls(solve, cut, device)[1] * 1e3


def measure(spec: str, sweep: list[int]) -> dict:
    """One variant, in this process."""
    path = spec.split(":", 1)[0]
    module_spec = importlib.util.spec_from_file_location("router_variant", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    problem = load_problem("76")
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    sizes = ("full", "odd") if gpu else ("cpu", "cpu_odd")
    row = {"variant": spec, "device": torch.cuda.get_device_name(0) if gpu else "cpu", "checks": []}
    for size in sizes:
        for seed in range(3):
            inputs = problem.make_inputs(seed, device, size)
            row["checks"].append({"inputs": f"{size} seed {seed}", **check(problem, module.solve, inputs, True)})
    experts = inputs[0].shape[1]
    for seed in range(3):
        inputs = stress_inputs(seed, device, experts)
        row["checks"].append({"inputs": f"stress seed {seed}", **check(problem, module.solve, inputs, False)})
    row["exact"] = all(c["rows_with_wrong_ids"] == 0 and c.get("weight_error_over_budget", 0) is not None
                       for c in row["checks"])
    if gpu:
        draws = [problem.make_inputs(seed, device, "full") for seed in range(CALLS)]
        moved = problem.bytes_moved(draws[0], None)
        bandwidth = reference_roofline.copy_bandwidth(device)
        full = kernel_us(module.solve, draws, draws[0][0].shape[0], device)
        row.update(kernel_us=full, fraction_of_copy_bandwidth=moved / (full / 1e6) / bandwidth,
                   sweep_us={tokens: kernel_us(module.solve, draws, tokens, device) for tokens in sweep})
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("variants", nargs="*", help="FILE[:ENV=VALUE,...]")
    parser.add_argument("--sweep", default="", help="comma-separated token counts, timed besides the full size")
    parser.add_argument("--out")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: measure one variant, print its row
    args = parser.parse_args()
    sweep = [int(t) for t in args.sweep.split(",") if t]
    if args.one:
        print(json.dumps(measure(args.one, sweep)))
        return
    if not args.variants:
        parser.error("name at least one solution file")
    missing = [spec.partition(":")[0] for spec in args.variants if not Path(spec.partition(":")[0]).is_file()]
    if missing:
        sys.exit(f"router_variants: no such file: {', '.join(missing)}")
    rows = []
    for spec in args.variants:
        switches = spec.partition(":")[2]
        env = dict(os.environ, **dict(kv.split("=", 1) for kv in switches.split(",") if kv))
        child = subprocess.run([sys.executable, __file__, "--one", spec, "--sweep", args.sweep], env=env,
                               capture_output=True, text=True)
        lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
        row = json.loads(lines[-1]) if child.returncode == 0 and lines else {
            "variant": spec, "error": (child.stderr or child.stdout)[-2000:]}
        rows.append(row)
        timing = f"{row['kernel_us']:7.2f} us {row['fraction_of_copy_bandwidth']:6.1%}" if "kernel_us" in row else ""
        status = "error" if "error" in row else ("exact" if row["exact"] else "WRONG")
        print(f"{spec:60s} {status:6s} {timing} {row.get('sweep_us', '')}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
