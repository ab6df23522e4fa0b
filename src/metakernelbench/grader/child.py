"""The untrusted side of grading: imports one submission and runs it on inputs it makes from seeds the parent sends.

Nothing here decides a verdict. It reports timings, launch counts and outputs; the parent compares outputs with a
reference that never exists in this process. Functions the timing and reporting depend on are bound before the
submission is imported and checked by identity at the end.
"""
from __future__ import annotations

import builtins
import collections
import gc
import importlib.util
import json
import os
import socket
import sys
import threading
import time
import traceback

import torch

from metakernelbench.grader import channel, cuda_ipc

KEEP_ALIVE_BYTES = {"cuda": 8 << 30, "cpu": 256 << 20}
L2_FLUSH_BYTES = {"cuda": 256 << 20, "cpu": 32 << 20}
POISON_CAP_BYTES = {"cuda": 4 << 30, "cpu": 512 << 20}


def _watched(device_type: str) -> list[tuple[object, str]]:
    """Objects a cheating submission would patch to fake timing, synchronisation, comparison or reporting."""
    watched = [(time, "perf_counter"), (torch, "equal"), (torch.Tensor, "clone"), (torch.Tensor, "cpu"),
               (torch.Tensor, "contiguous"), (torch.Tensor, "view"), (torch.Tensor, "numpy"), (torch.Tensor, "zero_"),
               (torch.Tensor, "fill_"), (socket.socket, "sendall"), (socket.socket, "recv"), (json, "dumps"),
               (json, "loads"), (threading, "active_count"), (builtins, "isinstance"), (builtins, "type")]
    watched += [(channel, name) for name in ("send", "recv", "write_to_file")]
    watched += [(cuda_ipc, name) for name in ("export", "reset_persisting_l2")]
    if device_type == "cuda":
        watched += [(torch.cuda, "synchronize"), (torch.cuda, "Event"), (torch.cuda.Event, "record"),
                    (torch.cuda.Event, "elapsed_time"), (torch.cuda.Event, "synchronize")]
    return watched


class _ImportGuard:
    """Blocks the submission's own imports outside its DSL's allow-list, even of modules already loaded."""

    def __init__(self, module_name: str, allowed_roots: tuple[str, ...]) -> None:
        self.module_name = module_name
        self.allowed_roots = allowed_roots
        self.original = builtins.__import__

    def __call__(self, name, globals=None, locals=None, fromlist=(), level=0):
        importer = (globals or {}).get("__name__")
        if importer == self.module_name:
            root_ok = any(name == r or name.startswith(r + ".") for r in self.allowed_roots)
            if level or not root_ok:
                raise ImportError(f"import of '{name}' is not allowed in a submission")
        return self.original(name, globals, locals, fromlist, level)


class _BlockedImports:
    """A meta-path finder that refuses the benchmark's own modules (its reference solutions, threat 21) and every
    kernel library other than the variant's DSL (`dsl.foreign_roots`), whatever route (import statement, importlib,
    __import__) asks for them."""

    def __init__(self, roots: tuple[str, ...]) -> None:
        self.roots = ("metakernelbench", *roots)

    def find_spec(self, name, path=None, target=None):
        if any(name == p or name.startswith(p + ".") for p in self.roots):
            raise ImportError(f"import of '{name}' is not allowed in a submission")
        return None


class _ThreadStarts:
    """Counts Python threads started while a call runs: work finished behind the timer's back (threat 8)."""

    def __init__(self) -> None:
        import _thread

        self.count = 0
        self.targets = []
        for owner, attr in ((threading, "_start_new_thread"), (threading, "_start_joinable_thread"),
                            (_thread, "start_new_thread"), (_thread, "start_joinable_thread"), (_thread, "start_new")):
            original = getattr(owner, attr, None)
            if original is not None:
                setattr(owner, attr, self._counting(original))
                self.targets.append((owner, attr, getattr(owner, attr)))

    def _counting(self, original):
        def start(*args, **kwargs):
            self.count += 1
            return original(*args, **kwargs)

        return start


class Runner:
    def __init__(self, sock: socket.socket, job: dict) -> None:
        from metakernelbench.suite.loader import problem_from_file

        self.sock = sock
        self.job = job
        self.device = job["device"]
        self.device_type = torch.device(self.device).type
        self.problem = problem_from_file(job["problem_path"])
        self.watched = [(owner, attr, getattr(owner, attr)) for owner, attr in _watched(self.device_type)]
        self.perf_counter = time.perf_counter
        self.keep_alive: collections.deque = collections.deque()
        self.keep_alive_bytes = 0
        self.last: dict | None = None
        self.gate = None
        self.solve = None
        if self.device_type == "cuda":
            torch.cuda.set_device(torch.device(self.device).index or 0)
            self.sync = torch.cuda.synchronize
            self.reset_l2 = cuda_ipc.reset_persisting_l2
            self.Event = torch.cuda.Event
        self.flush_buffer = torch.zeros(L2_FLUSH_BYTES[self.device_type], dtype=torch.uint8, device=self.device)
        self.thread_starts = _ThreadStarts()
        self.watched += self.thread_starts.targets
        self.watched += [(self, attr, getattr(self, attr)) for attr in ("perf_counter", "sync", "Event", "reset_l2")
                         if hasattr(self, attr)]
        self.watched += [(Runner, name, Runner.__dict__[name]) for name in ("call", "report_outputs", "finish",
                                                                            "_poison", "_remember")]

    # -- set-up -----------------------------------------------------------------------------------------------
    def load(self) -> dict:
        mode = self.job["mode"]
        if mode == "eager":
            self.solve = self.problem.module.reference
            return {}
        if mode == "compiled":
            self.solve = torch.compile(self.problem.module.reference)
            return {}
        from metakernelbench.dsl import foreign_roots, get_adapter
        from metakernelbench.dsl.gate import LaunchGate
        from metakernelbench.dsl.rules import COMMON_IMPORTS

        adapter = get_adapter(self.job["dsl"])
        self.gate = LaunchGate()
        adapter.install_gate(self.gate)
        module_name = "submission"
        builtins.__import__ = _ImportGuard(module_name, adapter.allowed_roots + COMMON_IMPORTS)
        self.watched.append((builtins, "__import__", builtins.__import__))
        for name in [m for m in sys.modules if m == "metakernelbench" or m.startswith("metakernelbench.suite.")]:
            if not name.startswith("metakernelbench.suite.loader"):
                sys.modules.pop(name)
        sys.meta_path.insert(0, _BlockedImports(foreign_roots(self.job["dsl"])))
        started = self.perf_counter()
        channel.send(self.sock, {"op": "armed", "nonce": self.job["nonce"], "fingerprint": self.fingerprint()})
        spec = importlib.util.spec_from_file_location(module_name, self.job["candidate_path"])
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        solve = getattr(module, "solve", None)
        if not callable(solve):
            raise AttributeError("the submission defines no callable `solve`")
        self.solve = solve
        return {"import_s": self.perf_counter() - started, "gate_entry_points": len(self.gate.wrapped)}

    # -- one call ---------------------------------------------------------------------------------------------
    def _poison(self, inputs: tuple) -> None:
        """Fill memory the allocator will hand out next with NaN bytes, so unwritten outputs cannot pass. Freed just
        before the timed region, the block also serves the outputs' allocations there: a validation run that skipped
        the fill for timed calls measured problem 26 (134 MB of state out) at twice the time."""
        total = sum(t.numel() * t.element_size() for t in inputs if isinstance(t, torch.Tensor))
        size = min(max(2 * total, 1 << 20), POISON_CAP_BYTES[self.device_type])
        block = torch.empty(size, dtype=torch.uint8, device=self.device)
        block.fill_(0xFF)
        del block

    def _remember(self, inputs: tuple) -> None:
        size = sum(t.numel() * t.element_size() for t in inputs if isinstance(t, torch.Tensor))
        self.keep_alive.append((inputs, size))
        self.keep_alive_bytes += size
        while self.keep_alive_bytes > KEEP_ALIVE_BYTES[self.device_type] and len(self.keep_alive) > 1:
            self.keep_alive_bytes -= self.keep_alive.popleft()[1]

    def call(self, msg: dict) -> dict:
        self.last = None
        inputs = self.problem.make_inputs(int(msg["seed"]), self.device, msg["size"])
        pristine = [t.clone() if isinstance(t, torch.Tensor) else None for t in inputs]
        self._poison(inputs)
        # The flush reads: a written buffer would leave the cache full of dirty lines, and the timed call would pay
        # for their write-back (on the H200 that added 1.1 us to a kernel that only reads 16 MB).
        self.flush_buffer.max()
        l2_reset = self.reset_l2(torch.device(self.device)) if self.device_type == "cuda" else None
        if self.gate is not None:
            self.gate.take()
            self.gate.neutralise = bool(msg.get("ghost"))
            self.gate.readings = []
            self.gate.clock = self._launch_clock if msg.get("measure_dsl") else None
        threads_started = self.thread_starts.count
        collecting = gc.isenabled()
        gc.disable()  # a collection inside the timed region would be charged to the submission
        try:
            if self.device_type == "cuda":
                self.sync()
                start, end = self.Event(enable_timing=True), self.Event(enable_timing=True)
                start.record()
                host_start = self.perf_counter()
                outputs = self.solve(*inputs)
                self.sync()
                end.record()
                end.synchronize()
                host_ms = (self.perf_counter() - host_start) * 1e3
                ms = start.elapsed_time(end)
            else:
                host_start = self.perf_counter()
                outputs = self.solve(*inputs)
                host_ms = ms = (self.perf_counter() - host_start) * 1e3
        finally:
            if collecting:
                gc.enable()
            if self.gate is not None:
                self.gate.neutralise = False
                self.gate.clock = None
        launches = self.gate.take() if self.gate is not None else None
        dsl_ms = self._dsl_ms() if msg.get("measure_dsl") and self.gate is not None else None
        threads = self.thread_starts.count - threads_started
        self.last = {"inputs": inputs, "pristine": pristine, "outputs": outputs}
        self._remember(inputs)
        return {"ms": ms, "host_ms": host_ms, "dsl_ms": dsl_ms, "launches": launches, "threads_started": threads,
                "threads_alive": threading.active_count(), "l2_reset": l2_reset}

    def _launch_clock(self):
        """A timestamp on the device's current stream (GPU) or the host clock (CPU, where launches are synchronous)."""
        if self.device_type == "cuda":
            event = self.Event(enable_timing=True)
            event.record()
            return event
        return self.perf_counter()

    def _dsl_ms(self) -> float:
        if self.device_type == "cuda":
            return sum(begin.elapsed_time(end) for begin, end in self.gate.readings)
        return sum(end - begin for begin, end in self.gate.readings) * 1e3

    def report_outputs(self, path: str, ipc: bool = False) -> dict:
        """Outputs stay referenced until the next call or drop: the parent may ask again by file if IPC fails."""
        if self.last is None:
            return {"error": "no outputs to send"}
        inputs, pristine, outputs = self.last["inputs"], self.last["pristine"], self.last["outputs"]
        single = not isinstance(outputs, (tuple, list))
        items = [outputs] if single else list(outputs)
        problems = [f"output {i} is {type(out).__module__}.{type(out).__qualname__}, not torch.Tensor"
                    for i, out in enumerate(items) if type(out) is not torch.Tensor]
        inplace = {int(v): k for k, v in self.problem.inplace.items()}
        problems += [f"input {i} was modified but the problem does not declare it an in-place output"
                     for i, (now, before) in enumerate(zip(inputs, pristine))
                     if before is not None and i not in inplace and not torch.equal(now, before)]
        for index, name in inplace.items():
            pos = self.problem.outputs.index(name) if name in self.problem.outputs else None
            if pos is None or pos >= len(items) or items[pos] is not inputs[index]:
                problems.append(f"output '{name}' must be input {index} itself, modified in place")
        if problems:  # nothing to compare: spare the copy of the outputs
            return {"integrity_problems": problems}
        if ipc and all(out.is_cuda for out in items):
            contiguous = [out.detach().contiguous() for out in items]
            try:
                records = cuda_ipc.export(contiguous)
                self.last["handed_over"] = contiguous
                return {"single": single, "outputs": records, "transport": "ipc", "integrity_problems": []}
            except cuda_ipc.TransferError:
                pass
        metas = channel.write_to_file(items, path)
        for meta, out in zip(metas, items):
            meta["device"] = str(out.device)
        return {"single": single, "outputs": metas, "transport": "file", "integrity_problems": []}

    def fingerprint(self) -> dict[str, int]:
        """Identities of the watched objects, looked up afresh; the parent holds the copy taken before the import."""
        return {f"{getattr(o, '__name__', type(o).__name__)}.{a}": id(getattr(o, a)) for o, a, _ in self.watched}

    def finish(self) -> dict:
        tampered = [f"{getattr(o, '__name__', type(o).__name__)}.{a}" for o, a, orig in self.watched
                    if getattr(o, a) is not orig]
        tampered += [f"Runner.{name} (shadowed)" for name in vars(self) if callable(Runner.__dict__.get(name))]
        return {"tampered": tampered, "fingerprint": self.fingerprint(), "python_threads": threading.active_count(),
                "native_threads": len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None}


def _error_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-6000:]


def steady_host(device: str) -> dict:
    """Before CUDA starts in this process: pin it to one CPU (lane i takes the i-th from the end of the allowed set,
    so lanes do not share) and make CUDA synchronisation spin. The official time of a call includes its host path;
    without these, the same reference's median moved 1.9-2.4x between fresh processes on the H200, with them (and
    the collector off while timed) 1.05-1.2x (benchmarks/timing_noise.py). Returns what was set, for the verdict."""
    target = torch.device(device)
    if target.type != "cuda":
        return {}
    index = target.index or 0
    allowed = sorted(os.sched_getaffinity(0))
    cpu = allowed[-1 - index % len(allowed)]
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError:
        cpu = None
    return {"cpu": cpu, "cuda_schedule": cuda_ipc.spin_when_synchronising(index)}


def serve(sock: socket.socket, job: dict) -> None:
    """Answer the parent's requests until it says finish; every reply echoes its request's nonce."""
    try:
        host = steady_host(job["device"])
        runner = Runner(sock, job)
        info = runner.load()
    except BaseException as exc:  # the submission failed to import: report, never raise
        channel.send(sock, {"op": "ready", "nonce": job["nonce"], "error": _error_text(exc)})
        return
    channel.send(sock, {"op": "ready", "nonce": job["nonce"], "python_threads": threading.active_count(),
                        "isolation": job.get("isolation", {}), "host": host, **info})
    while True:
        msg = channel.recv(sock)
        op, nonce = msg.get("op"), msg.get("nonce")
        try:
            if op == "call":
                channel.send(sock, {"nonce": nonce, **runner.call(msg)})
            elif op == "send":
                channel.send(sock, {"nonce": nonce, **runner.report_outputs(msg["path"], bool(msg.get("ipc")))})
            elif op == "drop":
                runner.last = None
                channel.send(sock, {"nonce": nonce})
            elif op == "finish":
                channel.send(sock, {"nonce": nonce, **runner.finish()})
                return
            else:
                channel.send(sock, {"nonce": nonce, "error": f"unknown op {op!r}"})
        except BaseException as exc:
            fatal = isinstance(exc, (KeyboardInterrupt, SystemExit)) or "CUDA" in str(exc) or "cuda" in str(exc)
            channel.send(sock, {"nonce": nonce, "error": _error_text(exc), "fatal": fatal})
            if fatal:
                return
