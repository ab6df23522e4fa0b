"""The trusted side of grading: drives a fresh untrusted child per submission and computes the verdict.

The parent never imports submission code. For every call it draws a seed (`secrets`), makes the inputs itself
and hands them to the child (a shared file on the CPU, CUDA IPC on a GPU), so the submission's interpreter never
runs the input generator; it computes the references (low precision and fp64, numerics pinned) on its own copies
and compares what the child returns. Timing happens in the child with primitives bound before the submission
loaded; the child reports at every call whether torch's and the grader's namespaces, modes and native threads are
as they were; the parent checks event time against wall time and refuses runtimes below the roofline floor.
"""
from __future__ import annotations

import collections
import hashlib
import secrets
import shutil
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from metakernelbench.grader import channel, cuda_ipc, numerics
from metakernelbench.grader.compare import compare, needs_fp64
from metakernelbench.grader.forkserver import ForkServer
from metakernelbench.grader.sandbox import protect_this_process
from metakernelbench.grader.verdict import Verdict
from metakernelbench.suite.loader import Problem

OUTPUT_TAIL_BYTES = 8192
# Vendor peaks (bytes/s, dense bf16 FLOP/s) for the roofline floor; a measured time below the floor is impossible.
GPU_PEAKS = {"H200": (4.8e12, 989e12), "H100 PCIe": (2.0e12, 756e12), "H100": (3.35e12, 989e12),
             "H20": (4.0e12, 148e12), "GH200": (4.9e12, 989e12), "B200": (8.0e12, 2250e12),
             "B300": (8.0e12, 2500e12), "A100": (2.04e12, 312e12), "L40S": (0.864e12, 362e12),
             "RTX 4090": (1.01e12, 165e12), "RTX 5090": (1.79e12, 210e12)}


@dataclass(frozen=True)
class GraderConfig:
    device: str | None = None  # default: cuda when a GPU is visible (resolved in Grader, never at import)
    check_draws: int = 5  # at the timed size, as the task statement promises; extra_size_draws per held-out size
    extra_size_draws: int = 2
    warmup_calls: int = 5
    timed_calls: int = 30
    # Timed calls whose outputs are verified, drawn at random: every one where their checks fit reverify_budget_s
    # (a check's cost as this grading's draws at the timed size measured it), else as many as fit and never fewer
    # than min_reverified_calls. A full check costs a reference and a comparison each (a quarter second for 8 GB of
    # inputs on an H200), and the median is robust: to move it a submission must skip more than half of the 35
    # calls, which 10 random checks miss with probability below 1e-3. A number here fixes the count instead.
    reverified_calls: int | None = None
    min_reverified_calls: int = 10
    reverify_budget_s: float = 0.35
    share_calls: int = 3  # untimed calls measuring the time inside DSL launches, at random places among the timed
    logged_calls: int = 5  # untimed calls under the dispatch logger, at random places among the timed ones
    kernel_calls: int = 3  # separate profiled calls (never timed ones) for the kernel-only device time
    min_dsl_share: float = 0.10
    # Eager compute may read at most this many elements per input element in a call (sizes from lengths and such).
    max_eager_share: float = 1 / 64
    baseline_processes: int = 3
    compile_baseline: bool | None = None
    static_rules: bool = True
    preload_dsls: tuple[str, ...] = ()  # DSLs the fork server imports up front, so mixed runs never restart it
    import_timeout_s: float = 300.0
    first_call_timeout_s: float = 300.0
    call_timeout_s: float = 60.0
    total_timeout_s: float = 1800.0
    memory_limit_bytes: int | None = None
    peak_bandwidth: float | None = None
    peak_flops: float | None = None
    extra_env: dict = field(default_factory=dict)


# Failures that leave correctness unproven; the others (integrity, timer, roofline) fail a correct submission.
_CORRECTNESS_FAILURES = ("static_rules", "import", "runtime_error", "timeout", "crash", "correctness", "launch",
                         "ghost_replay", "dsl_share")


class _Failure(Exception):
    def __init__(self, check: str, reason: str) -> None:
        super().__init__(reason)
        self.check = check
        self.reason = reason


def _require_integrity(reply: dict) -> None:
    """Every reply carries what the child found changed at that call (namespaces, modes, native threads)."""
    if reply.get("integrity_problems"):
        raise _Failure("integrity", "; ".join(reply["integrity_problems"][:4]))


def reverified_count(config: GraderConfig, check_s: float, total_calls: int) -> tuple[int, str]:
    """How many of the timed calls to verify, given what one check costs at the timed size, and why."""
    if config.reverified_calls is not None:
        return min(config.reverified_calls, total_calls), "a fixed number (configured)"
    if check_s * total_calls <= config.reverify_budget_s:
        return total_calls, f"every call (a check costs {check_s * 1e3:.3g} ms)"
    affordable = int(config.reverify_budget_s / check_s)  # check_s > 0 here: free checks fit any budget
    count = min(total_calls, max(config.min_reverified_calls, affordable))
    return count, (f"a check costs {check_s * 1e3:.3g} ms at this size, so {config.reverify_budget_s:g} s pays for "
                   f"{affordable}; never fewer than {config.min_reverified_calls}")


def device_name(device: str) -> str:
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu"


def _summary(values: list[float]) -> dict:
    ordered = sorted(values)
    median = statistics.median(ordered)

    def pct(p):
        return ordered[min(len(ordered) - 1, int(round(p * (len(ordered) - 1))))]

    return {"n": len(ordered), "median_ms": median, "mean_ms": statistics.fmean(ordered), "min_ms": ordered[0],
            "max_ms": ordered[-1], "p10_ms": pct(0.1), "p90_ms": pct(0.9),
            "spread": (pct(0.9) - pct(0.1)) / median if median > 0 else 0.0,
            "max_over_median": ordered[-1] / median if median > 0 else 0.0}


def file_hand_over(records: list[dict], tensors: list[torch.Tensor], path: Path) -> dict:
    """The request fields that carry a call's inputs through a file written for this call alone."""
    with open(path, "wb") as f:
        f.truncate(max(1, sum(t.numel() * t.element_size() for t in tensors)))
    layouts = channel.write_to_file([t.cpu() for t in tensors], str(path))
    return {"inputs": records, "tensors": layouts, "transport": "file", "path": str(path)}


class _Session:
    """One child process and the request/reply discipline with it."""

    def __init__(self, server: ForkServer, job: dict, deadline: float) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="mkb-child-"))
        self.job = {**job, "workdir": str(self.workdir), "nonce": secrets.token_hex(16)}
        self.server = server
        self.deadline = deadline
        self.handle = server.spawn(self.job)
        self.exit_code: int | None = None
        self.ipc = torch.device(job["device"]).type == "cuda"
        self.verify_s = 0.0
        self.inputs_path = self.workdir / "inputs.bin"
        self.buffer = cuda_ipc.DeviceBuffer(job["device"]) if self.ipc else None
        self.input_transport = ""

    def hand_over(self, inputs: tuple) -> dict:
        """The request fields that carry one call's inputs: their records, and their bytes in the shared buffer (a
        dedicated device allocation) or a file the parent writes for this call alone."""
        try:
            records, tensors = channel.input_records(inputs)
        except TypeError as exc:
            raise _Failure("runtime_error", f"the problem's inputs cannot be handed over: {exc}")
        if self.buffer is not None and all(t.is_cuda for t in tensors):
            self.input_transport = "ipc"
            return {"inputs": records, "tensors": self.buffer.records(tensors), "transport": "ipc"}
        self.input_transport = "file"
        return file_hand_over(records, tensors, self.inputs_path)

    def request(self, msg: dict, timeout_s: float, expect_nonce: str | None = None) -> dict:
        nonce = expect_nonce or secrets.token_hex(16)
        if expect_nonce is None:
            channel.send(self.handle.sock, {**msg, "nonce": nonce})
        budget = min(timeout_s, self.deadline - time.monotonic())
        if budget <= 0:
            raise _Failure("timeout", "the submission exceeded the total grading time limit")
        self.handle.sock.settimeout(budget)
        try:
            header = channel.recv(self.handle.sock)
        except socket.timeout:
            raise _Failure("timeout", f"no answer within {budget:.0f} s (hang or endless loop); process killed")
        except (channel.ChannelClosed, ConnectionError, ValueError) as exc:
            raise _Failure("crash", f"the submission's process died or closed the channel ({exc})")
        if header.get("nonce") != nonce:
            raise _Failure("integrity", "a reply did not carry its request's nonce: the result channel was forged")
        return header

    def prepare_next(self) -> None:
        """Let the fork server start the next child's CUDA now, while this one imports."""
        try:
            self.server.prepare(self.job["device"])
        except OSError:  # the server is gone: the next grading starts a new one
            pass

    def await_spare(self) -> None:
        """Before timed calls: the spare's CUDA start, if still under way, must not share the machine with them."""
        try:
            self.server.await_spare(self.job["device"])
        except OSError:
            pass

    def close(self) -> tuple[str, str]:
        self.exit_code = self.server.reap(self.handle)
        if self.buffer is not None:
            self.buffer.close()
        tails = []
        for name in ("stdout.txt", "stderr.txt"):
            path = self.workdir / name
            data = path.read_bytes()[-OUTPUT_TAIL_BYTES:] if path.exists() else b""
            tails.append(data.decode(errors="replace"))
        shutil.rmtree(self.workdir, ignore_errors=True)
        return tails[0], tails[1]


class Grader:
    """Grades submissions for problems; keeps one fork server and caches eager baselines per problem and size."""

    def __init__(self, config: GraderConfig | None = None) -> None:
        self.config = config or GraderConfig()
        self.device = self.config.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
        self.device_type = torch.device(self.device).type
        self._server: ForkServer | None = None
        self._server_dsls: tuple[str, ...] = ()
        self._baselines: dict[tuple[str, str], dict] = {}
        self._work: dict[tuple[str, str], tuple[int, int]] = {}
        self._anchors: dict[str, numerics.Anchor] = {}
        self.numerics = numerics.pin()
        protect_this_process()

    def __enter__(self) -> "Grader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._server:
            self._server.close()
            self._server = None

    def _fork_server(self, dsl: str | None) -> ForkServer:
        wanted = tuple(sorted(set(self._server_dsls) | set(self.config.preload_dsls) | ({dsl} if dsl else set())))
        if self._server is None or wanted != self._server_dsls or not self._server.alive():
            self.close()
            self._server = ForkServer(list(wanted), env=self.config.extra_env)
            self._server_dsls = wanted
            # The first grading's child then starts as prepared as every later one (which takes a spare).
            self._server.prepare(self.device)
            self._server.await_spare(self.device)
        return self._server

    def _set_up_problem(self, problem: Problem) -> None:
        """Once per problem, on throwaway inputs at every checked size: the references, compared with themselves, and
        the roofline's bytes and flops. The parent's first reference and comparison at a shape load kernels and prove
        the anchor's row separability (up to a second); paid here once, like the baseline, they are not charged to
        whichever submission happens to be graded first."""
        timed = problem.timed_size(self.device_type)
        if (problem.id, timed) in self._work:
            return
        work = None
        for size in dict.fromkeys([timed, *problem.check_sizes(self.device_type)]):
            inputs = problem.make_inputs(0, self.device, size)
            lp, wide = self._anchor(problem).references(inputs, size, needs_fp64(problem))
            compare(problem, lp, lp, wide)
            if size == timed:
                work = (problem.bytes_moved(inputs, lp), problem.flops(inputs))
        self._work[(problem.id, timed)] = work  # last: a set-up that raised is tried again

    # -- reference side ---------------------------------------------------------------------------------------
    def _anchor(self, problem: Problem) -> numerics.Anchor:
        if problem.id not in self._anchors:
            self._anchors[problem.id] = numerics.Anchor(problem)
        return self._anchors[problem.id]

    def _fetch_outputs(self, session: _Session, max_bytes: int) -> tuple[tuple, str]:
        """Outputs come device to device through CUDA IPC where the driver allows it, else through a file sized to
        the expected outputs (a flood cannot grow it). Returns the outputs and the transport used."""
        path = session.workdir / "outputs.bin"
        with open(path, "wb") as f:
            f.truncate(max_bytes)
        try:
            while True:
                header = session.request({"op": "send", "path": str(path), "ipc": session.ipc},
                                         self.config.call_timeout_s)
                if header.get("error"):
                    message = header["error"].strip().splitlines()[-1]
                    check = "integrity" if "exceed" in message else "runtime_error"
                    raise _Failure(check, message)
                _require_integrity(header)
                for meta in header["outputs"]:
                    if torch.device(meta["device"]).type != self.device_type:
                        raise _Failure("correctness", f"an output is on {meta['device']}, inputs were on "
                                                      f"{self.device}")
                transport = header.get("transport", "file")
                try:
                    if transport == "ipc" and session.ipc:
                        if sum(int(m["nbytes"]) for m in header["outputs"]) > max_bytes:
                            raise ValueError(f"outputs exceed the {max_bytes} bytes the expected outputs need")
                        return tuple(cuda_ipc.import_copies(header["outputs"], self.device)), transport
                    return tuple(channel.read_from_file(header["outputs"], str(path), self.device)), "file"
                except cuda_ipc.TransferError:
                    session.ipc = False  # the driver or sandbox refused IPC: ask again, by file, from now on
                except (ValueError, KeyError, TypeError) as exc:
                    raise _Failure("integrity", f"malformed output report: {exc}")
        finally:
            path.unlink(missing_ok=True)

    def _call(self, problem: Problem, session: _Session, size: str, timeout_s: float, **flags) -> tuple[dict, tuple]:
        """One call on fresh inputs the parent makes from a fresh seed; returns the reply and those inputs."""
        inputs = problem.make_inputs(secrets.randbits(62), self.device, size)
        reply = session.request({"op": "call", **session.hand_over(inputs), **flags}, timeout_s)
        if reply.get("error"):
            last = reply["error"].strip().splitlines()[-1] if reply["error"].strip() else "error"
            raise _Failure("runtime_error", f"solve raised: {last}")
        _require_integrity(reply)
        return reply, inputs

    def _drop(self, session: _Session) -> None:
        _require_integrity(session.request({"op": "drop"}, self.config.call_timeout_s))

    def _verify(self, problem: Problem, session: _Session, inputs: tuple, size: str) -> dict:
        started = time.monotonic()
        try:
            lp, wide = self._anchor(problem).references(inputs, size, needs_fp64(problem))
            expected = sum(t.numel() * t.element_size() for t in lp if isinstance(t, torch.Tensor))
            got, transport = self._fetch_outputs(session, max_bytes=2 * expected + (1 << 20))
            checks = compare(problem, got, lp, wide)
            return {"size": size, "outputs": [c.__dict__ for c in checks], "passed": all(c.passed for c in checks),
                    "transport": transport, "inputs_transport": session.input_transport,
                    "fp64_slices": self._anchor(problem).slices_used, "seconds": time.monotonic() - started}
        finally:
            session.verify_s += time.monotonic() - started

    # -- grading ------------------------------------------------------------------------------------------------
    def grade(self, problem: Problem, dsl: str, path: Path) -> Verdict:
        from metakernelbench.dsl import get_adapter

        started = time.monotonic()
        path = Path(path)
        base = dict(problem=problem.id, dsl=dsl, device=f"{self.device} ({device_name(self.device)})")
        try:
            source = path.read_text()
        except OSError as exc:
            return Verdict(**base, file_sha256="", compiled=False, correct=False, passed=False,
                           failed_check="static_rules", reason=f"cannot read {path}: {exc.strerror}")
        base["file_sha256"] = hashlib.sha256(source.encode()).hexdigest()
        adapter = get_adapter(dsl)
        state = {"draws": [], "checks": {}, "timings": {}, "compiled": False}
        session = None
        stdout = stderr = ""
        failure: _Failure | None = None
        runtime: dict = {}
        try:
            server_started = time.monotonic()
            server = self._fork_server(dsl)
            state["timings"]["server_start"] = time.monotonic() - server_started
            setup_started = time.monotonic()
            self._set_up_problem(problem)
            state["timings"]["problem_setup"] = time.monotonic() - setup_started
            session = _Session(server, {
                "mode": "candidate", "dsl": dsl, "device": self.device, "candidate_path": str(path.resolve()),
                "inplace": dict(problem.inplace), "outputs": list(problem.outputs),
                "memory_limit_bytes": self.config.memory_limit_bytes, "no_exec": not adapter.spawns_programs,
                "static_rules": self.config.static_rules,
            }, started + self.config.total_timeout_s)
            runtime = self._run_candidate(problem, session, state)
        except _Failure as exc:
            failure = exc
            runtime = state.get("runtime", {})
        finally:
            if session is not None:
                stdout, stderr = session.close()
                if failure is not None and failure.check == "crash":
                    failure = _Failure("crash", f"{failure.reason}; exit code {session.exit_code}")
        if failure is None:
            failure = self._judge(problem, state, runtime)
        baseline_started = time.monotonic()
        baseline = self._baseline(problem) if failure is None or state["compiled"] else {}
        state["timings"]["baseline"] = time.monotonic() - baseline_started
        median = runtime.get("median_ms")
        eager = baseline.get("eager", {})
        speedup = speedup_range = speedup_compile = None
        if median and eager.get("median_ms"):
            speedup = eager["median_ms"] / median
            speedup_range = [eager["min_process_ms"] / median, eager["max_process_ms"] / median]
        if median and baseline.get("compiled", {}).get("median_ms"):
            speedup_compile = baseline["compiled"]["median_ms"] / median
        total = time.monotonic() - started
        timings = {**state["timings"], "total": total}
        timings["overhead"] = total - sum(timings.get(k, 0.0) for k in ("server_start", "problem_setup",
                                                                        "import_submission", "first_call",
                                                                        "timed_calls", "baseline"))
        correct = (state["compiled"] and bool(state["draws"]) and all(d["passed"] for d in state["draws"])
                   and (failure is None or failure.check not in _CORRECTNESS_FAILURES))
        return Verdict(**base, compiled=state["compiled"], correct=correct,
                       passed=failure is None, failed_check=failure.check if failure else None,
                       reason=failure.reason if failure else "", draws=state["draws"], runtime=runtime,
                       baseline=baseline, speedup_vs_eager=speedup, speedup_vs_eager_range=speedup_range,
                       speedup_vs_compile=speedup_compile, roofline=state.get("roofline", {}),
                       checks=state["checks"], timings_s=timings, numerics=self.numerics, stdout_tail=stdout,
                       stderr_tail=stderr)

    def _run_candidate(self, problem: Problem, session: _Session, state: dict) -> dict:
        cfg = self.config
        t0 = time.monotonic()
        session.prepare_next()  # the next grading's child starts CUDA while this one imports and compiles
        ready = session.request({}, cfg.import_timeout_s, expect_nonce=session.job["nonce"])
        state["timings"]["import"] = time.monotonic() - t0
        state["timings"]["import_submission"] = float(ready.get("import_s", 0.0))
        if ready.get("violations"):
            state["checks"]["static_rules"] = {"passed": False, "detail": ready["violations"]}
            raise _Failure("static_rules", "; ".join(ready["violations"][:5]))
        if cfg.static_rules:
            state["checks"]["static_rules"] = {"passed": True, "detail": []}
        if ready.get("error"):
            raise _Failure("import", "importing the submission failed: " + ready["error"].strip().splitlines()[-1])
        isolation = ready.get("isolation", {})
        state["host"] = ready.get("host", {})
        state["checks"]["isolation"] = {"passed": True, "detail": {k: "on" if v else "refused by the platform (not "
                                                                   "fatal)" for k, v in isolation.items()}}
        if ready.get("python_threads", 1) != 1:
            raise _Failure("integrity", f"the submission started {ready['python_threads'] - 1} thread(s) at import")
        _require_integrity(ready)

        sizes = problem.check_sizes(self.device_type)
        timed_size = problem.timed_size(self.device_type)
        plan = [(timed_size, cfg.check_draws)] + [(s, cfg.extra_size_draws) for s in sizes if s != timed_size]
        state["timings"]["first_call"] = 0.0
        for size, draws in plan:
            for draw_index in range(draws):
                t1 = time.monotonic()
                first = draw_index == 0  # a submission may compile per shape: the first call at a size compiles
                reply, inputs = self._call(problem, session, size,
                                           cfg.first_call_timeout_s if first else cfg.call_timeout_s)
                if first:
                    state["timings"]["first_call"] += time.monotonic() - t1
                state["compiled"] = True
                self._require_launch(reply)
                draw = self._verify(problem, session, inputs, size)
                state["draws"].append(draw)
                if not draw["passed"]:
                    bad = next(o for o in draw["outputs"] if not o["passed"])
                    raise _Failure("correctness", f"size '{size}', output '{bad['name']}': {bad['reason']}")

        ghost = self._ghost_call(problem, session, timed_size)
        state["checks"]["ghost_replay"] = {"passed": ghost is None or not ghost["passed"],
                                           "detail": "outputs with the DSL launches neutralised must be wrong"}
        if ghost is not None and ghost["passed"]:
            raise _Failure("ghost_replay", "with its DSL kernel launches neutralised the submission still returns "
                                           "correct outputs: the DSL kernel does not compute them")

        session.await_spare()
        total_calls = cfg.warmup_calls + cfg.timed_calls
        rng = secrets.SystemRandom()
        check_s = statistics.median(d["seconds"] for d in state["draws"] if d["size"] == timed_size)
        checked, why = reverified_count(cfg, check_s, total_calls)
        reverify = set(rng.sample(range(total_calls), checked))
        # The DSL-share calls sit at random places after the warm-up, indistinguishable from timed calls to the
        # submission, so eager work kept for "timed" calls meets the dispatch logger too.
        extra = ["measure_dsl"] * cfg.share_calls + ["log_eager"] * cfg.logged_calls
        extra_at = collections.defaultdict(list)
        for flag in extra:
            extra_at[rng.randrange(cfg.warmup_calls, total_calls + 1)].append(flag)
        times, host_times, l2_resets, shares = [], [], [], []
        verify_before_timing = session.verify_s
        share_s = 0.0
        t2 = time.monotonic()
        for i in range(total_calls + 1):
            for flag in extra_at[i]:
                t3 = time.monotonic()
                shares.append(self._share_call(problem, session, timed_size, flag))
                share_s += time.monotonic() - t3
            if i == total_calls:
                break
            reply, inputs = self._call(problem, session, timed_size, cfg.call_timeout_s)
            self._require_launch(reply)
            if i in reverify:
                draw = self._verify(problem, session, inputs, timed_size)
                draw["reverified_timed_call"] = i
                state["draws"].append(draw)
                if not draw["passed"]:
                    bad = next(o for o in draw["outputs"] if not o["passed"])
                    raise _Failure("correctness", f"timed call {i} was wrong (output '{bad['name']}': "
                                                  f"{bad['reason']}): honest only while checked?")
            else:
                self._drop(session)
            l2_resets.append(reply.get("l2_reset"))
            if i >= cfg.warmup_calls:
                times.append(float(reply["ms"]))
                host_times.append(float(reply["host_ms"]))
        state["timings"]["timed_calls"] = (time.monotonic() - t2 - share_s
                                           - (session.verify_s - verify_before_timing))
        state["checks"]["reverified"] = {"passed": True, "detail": f"{checked} of {total_calls} timed calls "
                                                                   f"verified, chosen at random: {why}"}
        state["runtime"] = _summary(times)
        state["runtime"]["host_median_ms"] = statistics.median(host_times)
        state["runtime"]["host"] = state["host"]
        if self.device_type == "cuda":
            state["checks"]["isolation"]["detail"]["persisting_l2_reset"] = (
                "on" if all(l2_resets) else "refused by the platform (not fatal)")
        self._judge_dsl_share(shares, state)
        kernel = []
        for _ in range(cfg.kernel_calls):
            reply, _ = self._call(problem, session, timed_size, cfg.call_timeout_s, profile=True)
            self._drop(session)
            kernel.append(float(reply["kernel_ms"]))
        if kernel:
            state["runtime"]["kernel_ms"] = statistics.median(kernel)
        final = session.request({"op": "finish"}, cfg.call_timeout_s)
        problems = final.get("integrity_problems", [])
        state["checks"]["unpatched"] = {"passed": not problems, "detail": problems or
                                        "torch's and the grader's namespaces, modes and threads unchanged at every "
                                        "call"}
        _require_integrity(final)
        state["checks"]["threads"] = {"passed": final["python_threads"] == 1,
                                      "detail": f"{final['python_threads']} Python thread(s) after the calls"}
        if final["python_threads"] != 1:
            raise _Failure("integrity", "the submission left background threads running")
        state["timings"]["verify"] = session.verify_s
        runtime = state["runtime"]
        state["roofline"] = self._roofline(problem, timed_size, runtime["median_ms"])
        return runtime

    def _ghost_call(self, problem: Problem, session: _Session, size: str) -> dict | None:
        """The outputs of a call with the DSL launches neutralised; None when it raised or returned malformed
        outputs (which also proves the DSL work mattered)."""
        try:
            _, inputs = self._call(problem, session, size, self.config.call_timeout_s, ghost=True)
            return self._verify(problem, session, inputs, size)
        except _Failure as exc:
            if exc.check not in ("integrity", "correctness", "runtime_error"):
                raise
            return None

    def _share_call(self, problem: Problem, session: _Session, size: str, flag: str) -> dict:
        """One untimed call that either brackets the DSL launches with clock readings or logs eager operators (the
        logger's own cost would distort the share, so never both)."""
        reply, _ = self._call(problem, session, size, self.config.call_timeout_s, **{flag: True})
        self._require_launch(reply)
        self._drop(session)
        if flag == "log_eager":
            return {"eager_ops": reply.get("eager_ops") or {},
                    "eager_share": float(reply.get("eager_elements", 0)) / max(1, int(reply.get("input_elements", 1)))}
        return {"share": min(1.0, float(reply["dsl_ms"]) / float(reply["ms"])) if reply["ms"] > 0 else 0.0,
                "eager_ops": {}}

    def _judge_dsl_share(self, shares: list[dict], state: dict) -> None:
        """The DSL kernels must carry the work (threats 1, 24): the logged calls ran under a dispatch logger, and
        compute operators of eager PyTorch outside the glue allow-list fail, whatever their timing, once they read
        more than a sliver of the call's input elements (sizing an output from a few lengths is glue, not work); the
        time inside DSL launches, bracketed by device events, must also be a real share of the call."""
        eager: collections.Counter = collections.Counter()
        for reading in shares:
            eager.update(reading["eager_ops"])
        eager_share = max((r["eager_share"] for r in shares if "eager_share" in r), default=0.0)
        timed = [r["share"] for r in shares if "share" in r]
        share = statistics.median(timed) if timed else 1.0
        too_eager = eager_share > self.config.max_eager_share
        passed = share >= self.config.min_dsl_share and not too_eager
        state["checks"]["dsl_share"] = {"passed": passed, "share": share, "eager_ops": dict(eager),
                                        "eager_share": eager_share,
                                        "detail": f"{share:.0%} of a call's time is inside DSL launches (minimum "
                                                  f"{self.config.min_dsl_share:.0%}); eager compute operators: "
                                                  f"{', '.join(eager) or 'none'}, reading {eager_share:.2%} of the "
                                                  f"inputs' elements (at most {self.config.max_eager_share:.2%})"}
        if too_eager:
            raise _Failure("dsl_share", f"solve computed with eager PyTorch outside its DSL kernels "
                                        f"({', '.join(sorted(eager)[:5])}): only allocation, views and fills may "
                                        f"run outside the DSL")
        if not passed:
            raise _Failure("dsl_share", f"only {share:.0%} of a call's time is inside its DSL kernels (minimum "
                                        f"{self.config.min_dsl_share:.0%}): the work is done outside the DSL")

    @staticmethod
    def _require_launch(reply: dict) -> None:
        if reply.get("launches") is not None and reply["launches"] < 1:
            raise _Failure("launch", "a call to solve launched no kernel written in the variant's DSL")
        if reply.get("threads_started") or reply.get("threads_alive", 1) != 1:
            raise _Failure("integrity", "solve started a thread: work would escape the timer (threads are not "
                                        "allowed in submissions)")

    def _judge(self, problem: Problem, state: dict, runtime: dict) -> _Failure | None:
        median, host = runtime["median_ms"], runtime["host_median_ms"]
        timer_ok = median >= 0.5 * host - 0.05
        state["checks"]["timer"] = {"passed": timer_ok,
                                    "detail": f"device-timer median {median:.4g} ms vs wall clock {host:.4g} ms"}
        if not timer_ok:
            return _Failure("timer", "the device timer reports far less time than the wall clock: work escaped "
                                     "the timer")
        floor = state["roofline"].get("floor_ms")
        plausible = floor is None or median >= 0.95 * floor
        state["checks"]["roofline"] = {"passed": plausible,
                                       "detail": f"median {median:.4g} ms vs physical floor {floor} ms"}
        if not plausible:
            return _Failure("roofline", f"median runtime {median:.4g} ms is below the physical floor {floor:.4g} ms")
        return None

    def _peaks(self) -> tuple[float | None, float | None]:
        if self.config.peak_bandwidth or self.config.peak_flops:
            return self.config.peak_bandwidth, self.config.peak_flops
        name = device_name(self.device)
        for key, peaks in GPU_PEAKS.items():
            if key in name:
                return peaks
        return None, None

    def _roofline(self, problem: Problem, size: str, median_ms: float) -> dict:
        moved, flops = self._work[(problem.id, size)]
        bandwidth, peak_flops = self._peaks()
        if moved is None:
            return {"bytes": None, "flops": flops, "floor_ms": None, "fraction": None,
                    "note": "the problem declares no bytes_moved: no roofline floor"}
        if not bandwidth:
            return {"bytes": moved, "flops": flops, "floor_ms": None, "fraction": None,
                    "note": f"no peak figures for {device_name(self.device)}"}
        floor_s = max(moved / bandwidth, flops / peak_flops if peak_flops else 0.0)
        return {"bytes": moved, "flops": flops, "peak_bandwidth": bandwidth, "peak_flops": peak_flops,
                "floor_ms": floor_s * 1e3, "fraction": floor_s * 1e3 / median_ms if median_ms else None}

    # -- baselines ----------------------------------------------------------------------------------------------
    def _baseline(self, problem: Problem) -> dict:
        size = problem.timed_size(self.device_type)
        key = (problem.id, size)
        if key not in self._baselines:
            modes = ["eager"]
            use_compile = self.config.compile_baseline
            if use_compile is None:
                use_compile = self.device_type == "cuda"
            if use_compile:
                modes.append("compiled")
            result = {"size": size}
            started = time.monotonic()
            for mode in modes:
                result[mode] = self._time_baseline(problem, mode, size)
            result["seconds"] = time.monotonic() - started
            self._baselines[key] = result
        return self._baselines[key]

    def _time_baseline(self, problem: Problem, mode: str, size: str) -> dict:
        cfg = self.config
        medians, errors, pinned = [], [], {}
        for _ in range(cfg.baseline_processes if mode == "eager" else 1):
            session = _Session(self._fork_server(None), {
                "mode": mode, "dsl": None, "device": self.device, "problem_path": str(problem.path),
                "candidate_path": None, "inplace": dict(problem.inplace), "outputs": list(problem.outputs),
                "memory_limit_bytes": cfg.memory_limit_bytes,
            }, time.monotonic() + cfg.total_timeout_s)
            try:
                session.prepare_next()
                ready = session.request({}, cfg.import_timeout_s, expect_nonce=session.job["nonce"])
                if ready.get("error"):
                    raise _Failure("import", ready["error"].strip().splitlines()[-1])
                pinned = ready.get("numerics", {})
                session.await_spare()
                times = []
                for i in range(cfg.warmup_calls + cfg.timed_calls):
                    reply, _ = self._call(problem, session, size, cfg.first_call_timeout_s)
                    self._drop(session)
                    if i >= cfg.warmup_calls:
                        times.append(float(reply["ms"]))
                medians.append(statistics.median(times))
                session.request({"op": "finish"}, cfg.call_timeout_s)
            except _Failure as exc:
                errors.append(exc.reason)
            finally:
                session.close()
        if not medians:
            return {"error": errors[0] if errors else "no measurement"}
        median = statistics.median(medians)
        return {"median_ms": median, "numerics": pinned, "process_medians_ms": medians, "min_process_ms": min(medians),
                "max_process_ms": max(medians), "spread": (max(medians) - min(medians)) / median}

