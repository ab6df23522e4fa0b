"""Device time of each reference solution against the roofline, as a kernel engineer measures it: fresh inputs per
call (made beforehand), L2 flushed before each call, calls queued back to back so host launch overhead overlaps the
GPU's work, CUDA events around each call. The grader's end-to-end time (host overhead of an isolated call included)
is the benchmark's official runtime; this script answers "how good are the kernels themselves".

    python benchmarks/reference_roofline.py [--dsl cute,tirx] [--problems ID,...] [--out FILE]   (trusted code; GPU)

The flush reads a 256 MiB uint8 buffer (a written buffer would leave dirty lines whose write-back the next kernel
pays); its kernel is the only one on unsigned chars, which is how the profiler tells it from the solutions'. The
flush also clears its reduction's semaphores with a memset (about 0.9 µs on the H200) that carries no such name, so
the device time of the flush alone, over as many calls, is measured and taken off.
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

from metakernelbench.suite import ProblemError, load_problem, load_suite

CALLS = 20
VENDOR_BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "B200": 8.0e12, "A100": 2.04e12}


def copy_bandwidth(device: str) -> float:
    """Measured device-to-device copy bandwidth (bytes read + written per second) on 1 GiB."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    end.synchronize()
    return 2 * src.numel() * 10 / (start.elapsed_time(end) / 1e3)


def device_ms(fn, problem, device: str, size: str) -> tuple[float, float]:
    """(median event time per call, mean kernel time per call from the profiler, the L2 flush excluded). Fresh
    inputs per call where a quarter of the free memory holds them all, else as many as fit, taken in turn (the flush
    still empties L2 between calls)."""
    first = problem.make_inputs(0, device, size)
    draw_bytes = sum(t.numel() * t.element_size() for t in first if isinstance(t, torch.Tensor))
    distinct = max(2, min(CALLS + 3, int(torch.cuda.mem_get_info()[0] / 4 // max(draw_bytes, 1))))
    made = [first] + [problem.make_inputs(seed, device, size) for seed in range(1, distinct)]
    return time_calls(fn, [made[i % distinct] for i in range(CALLS + 3)], device)


def time_calls(fn, draws: list, device: str) -> tuple[float, float]:
    """device_ms for given draws: the first 3 calls are left out of the median, not of the kernel mean."""
    flush = torch.zeros(256 << 20, dtype=torch.uint8, device=device)
    events = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for inputs in draws:
            flush.max()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*inputs)
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as flush_only:
        for _ in draws:
            flush.max()
        torch.cuda.synchronize()
    kernel_us = _unnamed_device_us(prof) - _unnamed_device_us(flush_only)
    return statistics.median(s.elapsed_time(e) for s, e in events[3:]), kernel_us / 1e3 / len(draws)


def _unnamed_device_us(prof) -> float:
    """Device time the profiler saw outside the flush's kernel: the solution's and the flush's memset."""
    return sum(getattr(e, "device_time_total", 0.0) for e in prof.key_averages() if "unsigned char" not in e.key)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsl", default="cute,tirx")
    parser.add_argument("--problems", help="comma-separated problems, as `mkb` takes them: 76, softmax_topk_router_renorm "
                                           "or moe/76_softmax_topk_router_renorm (default: the whole suite)")
    parser.add_argument("--out")
    args = parser.parse_args()
    try:
        wanted = {load_problem(spec).id for spec in args.problems.split(",")} if args.problems else None
    except ProblemError as exc:
        raise SystemExit(f"reference_roofline: {exc}") from None
    if not torch.cuda.is_available():
        raise SystemExit("reference_roofline: needs a CUDA GPU; on a CPU-only machine `mkb validate` compile-checks "
                         "the references instead")
    device = "cuda:0"
    name = torch.cuda.get_device_name(0)
    measured_bw = copy_bandwidth(device)
    vendor_bw = next((v for k, v in VENDOR_BANDWIDTH.items() if k in name), None)
    rows = []
    for problem in load_suite():
        if wanted is not None and problem.id not in wanted:
            continue
        size = problem.timed_size("cuda")
        inputs = problem.make_inputs(0, device, size)
        outputs = problem.reference(*[t.clone() if isinstance(t, torch.Tensor) else t for t in inputs])
        moved = problem.bytes_moved(inputs, outputs)
        del inputs, outputs
        candidates = [("eager", problem.module.reference)]
        for dsl in args.dsl.split(","):
            candidates.append((dsl, problem.load_solution(dsl).solve))
        for label, fn in candidates:
            ms, kernel_ms = device_ms(fn, problem, device, size)
            row = {"problem": problem.id, "solution": label, "size": size, "device_ms": ms, "kernel_ms": kernel_ms,
                   "bytes": moved, "fraction_of_copy_bandwidth": moved / (ms / 1e3) / measured_bw,
                   "kernel_fraction_of_copy_bandwidth": moved / (kernel_ms / 1e3) / measured_bw if kernel_ms else None,
                   "fraction_of_vendor_bandwidth": moved / (ms / 1e3) / vendor_bw if vendor_bw else None}
            rows.append(row)
            print(f"{problem.id:42s} {label:6s} call {ms * 1e3:8.1f} us {row['fraction_of_copy_bandwidth']:6.1%}   "
                  f"kernels {kernel_ms * 1e3:8.1f} us {row['kernel_fraction_of_copy_bandwidth'] or 0:6.1%} "
                  "of measured copy bandwidth", flush=True)
            if args.out:
                _write(args.out, name, measured_bw, vendor_bw, rows)
        torch.cuda.empty_cache()


def _write(path: str, name: str, measured_bw: float, vendor_bw: float | None, rows: list) -> None:
    """The record so far: rewritten after every row, so a run cut short keeps what it timed."""
    record = {"legend": {"device_ms": "median CUDA-event time of one call, calls queued back to back with fresh "
                                       "inputs and an L2 flush before each (host overhead overlapped where the "
                                       "GPU work outlasts it)",
                         "kernel_ms": "mean GPU kernel time per call from the profiler (CUPTI), flush excluded",
                         "kernel_fraction_of_copy_bandwidth": "bytes_moved / kernel time / measured copy bandwidth",
                         "fraction_of_copy_bandwidth": "bytes_moved / device time / measured D2D copy bandwidth",
                         "fraction_of_vendor_bandwidth": "the same against the vendor's peak"},
              "gpu": name, "measured_copy_bandwidth": measured_bw, "vendor_bandwidth": vendor_bw, "rows": rows}
    with open(path, "w") as f:
        json.dump(record, f, indent=2)


if __name__ == "__main__":
    main()
