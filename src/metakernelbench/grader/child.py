"""The untrusted side of grading: imports one submission and runs it on inputs the trusted parent made and handed over.

Nothing here decides a verdict, and none of the grader's trusted steps runs the submission's Python: inputs come
from the parent (a shared file on the CPU, CUDA IPC on a GPU), the flush and the timer are primitives bound before
the import and held in a closure, and before and after every call the child checks that torch's and the grader's
namespaces still hold what they held before the import, that no torch mode is active, and that no native thread
gains CPU time between `solve` returning and the output report. The parent compares outputs with a reference that
never exists in this process.
"""
from __future__ import annotations

import _thread
import builtins
import collections
import gc
import importlib.util
import inspect
import json
import os
import re
import signal
import socket
import sys
import threading
import time
import traceback

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from metakernelbench.grader import channel, cuda_ipc, numerics

KEEP_ALIVE_BYTES = {"cuda": 8 << 30, "cpu": 256 << 20}
L2_FLUSH_BYTES = {"cuda": 256 << 20, "cpu": 32 << 20}
POISON_CAP_BYTES = {"cuda": 4 << 30, "cpu": 512 << 20}
# Between `solve` returning and the output report, a thread born after the import may run this much at most (an
# idle pool thread going back to sleep), and the window lasts at least this long.
THREAD_IDLE_NS = 500_000
REPORT_WINDOW_S = 0.002
# ATen operators eager PyTorch may run in a submission's call: allocation, fills, views and scalar reads. Anything
# else (arithmetic, reductions, matmuls, copies, casts, gathers) is work, and the work belongs in the DSL.
GLUE_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "ones",
    "ones_like", "full", "full_like", "fill_", "zero_", "new_zeros", "new_ones", "new_full", "scalar_tensor",
    "lift_fresh", "view", "_unsafe_view", "_reshape_alias", "reshape", "as_strided", "expand", "permute",
    "transpose", "t", "squeeze", "unsqueeze", "select", "slice", "narrow", "split", "split_with_sizes", "chunk",
    "unbind", "alias", "detach", "unflatten", "view_as", "_local_scalar_dense", "is_nonzero", "sym_size",
    "sym_stride", "sym_numel", "sym_storage_offset", "set_"})


def _namespaces(device_type: str) -> list[tuple[str, object]]:
    """Objects whose attributes the grader's trusted steps call: the submission must leave every callable as it was."""
    from metakernelbench.grader import child

    spaces = [("torch", torch), ("torch.Tensor", torch.Tensor), ("torch._C.TensorBase", torch._C.TensorBase),
              ("torch._C", torch._C), ("torch._C._VariableFunctionsClass", type(torch._C._VariableFunctions)),
              ("torch.nn.functional", torch.nn.functional), ("torch.overrides", torch.overrides),
              ("torch.utils._python_dispatch", sys.modules["torch.utils._python_dispatch"]),
              ("torch.cuda", torch.cuda), ("numpy", np), ("numpy.ndarray", np.ndarray), ("builtins", builtins),
              ("time", time), ("json", json), ("socket.socket", socket.socket), ("threading", threading),
              ("_thread", _thread), ("os", os), ("gc", gc), ("channel", channel), ("cuda_ipc", cuda_ipc),
              ("child", child), ("Runner", Runner)]
    if device_type == "cuda":
        spaces += [("torch.cuda.Event", torch.cuda.Event), ("torch.profiler", torch.profiler)]
    return spaces


class _Snapshot:
    """Identities of every callable in some namespaces, judged cheaply: the ids of all values first, and only when
    they differ, callable by callable (a module's plain data may change; its functions and classes may not)."""

    def __init__(self, spaces: list[tuple[str, object]]) -> None:
        self.spaces = [(name, vars(obj)) for name, obj in spaces]
        self.saved = [dict(space) for _, space in self.spaces]
        self.ids = [list(map(id, space.values())) for _, space in self.spaces]

    def changed(self) -> list[str]:
        found = []
        for index, (name, space) in enumerate(self.spaces):
            if list(map(id, space.values())) == self.ids[index]:
                continue
            saved = self.saved[index]
            found += [f"{name}.{key}" for key, value in saved.items()
                      if callable(value) and space.get(key, _MISSING) is not value]
            if not found:  # only data changed: remember it, so the next check takes the fast path again
                self.ids[index] = list(map(id, space.values()))
                self.saved[index] = dict(space)
        return found


_MISSING = object()


def _hooks() -> tuple:
    """Every way code can be made to run inside the grader's own steps without replacing a function: trace and
    profile hooks, collector callbacks, signal handlers and interval timers."""
    handlers = tuple(signal.getsignal(s) for s in sorted(signal.valid_signals()) if s not in (signal.SIGKILL,
                                                                                                 signal.SIGSTOP))
    timers = tuple(signal.getitimer(t) for t in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF))
    return (sys.gettrace(), sys.getprofile(), threading._trace_hook, threading._profile_hook, tuple(gc.callbacks),
            handlers, timers)


_SYSTEM_DIRS = ("/usr/", "/lib/", "/lib64/", "/opt/", "/etc/")
_EXECUTABLE_FILE = re.compile(r"^\S+ ..x. \S+ \S+ \S+ +(/.*)$", re.MULTILINE)


def _executable_files() -> set[str]:
    """Files mapped executable into this process (its native code)."""
    with open("/proc/self/maps") as maps:
        return set(_EXECUTABLE_FILE.findall(maps.read()))


def _foreign(paths: set[str], trusted_dirs: tuple[str, ...]) -> list[str]:
    """Those from outside the installed libraries and the system's: native code the submission built or brought
    (an inline C++ extension, a shared object loaded through ctypes)."""
    return sorted(p for p in paths if not p.startswith(trusted_dirs + _SYSTEM_DIRS))


def _thread_times() -> dict[int, int]:
    """Nanoseconds each of this process's native threads has run (schedstat), by thread id."""
    times = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as stat:
                times[int(tid)] = int(stat.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
    return times


class _EagerLog(TorchDispatchMode):
    """Logs the ATen operators a call runs outside the glue allow-list, and how many tensor elements they read.
    Operators inside a gated DSL launch are the DSL's own where its adapter says its kernels compute with torch (a
    Python DSL); otherwise they count too."""

    def __init__(self, gate, launches_run_torch: bool) -> None:
        super().__init__()
        self.gate = gate
        self.launches_run_torch = launches_run_torch
        self.compute: collections.Counter = collections.Counter()
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        inside = self.gate is not None and self.gate.inside
        if not (inside and self.launches_run_torch):
            if not (func.namespace == "aten" and func.overloadpacket.__name__ in GLUE_OPS):
                self.compute[func.name()] += 1
                self.elements += sum(a.numel() for a in _tensors((args, kwargs)))
        return func(*args, **(kwargs or {}))


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def prime() -> None:
    """Run the dispatch logger once in the fork server: the imports its first use triggers (torch._dynamo, which
    rewraps torch.manual_seed) then happen before any child takes its snapshot."""
    with _EagerLog(None, False):
        torch.zeros(1).add_(1)


def _logged(solve, log: _EagerLog):
    """`solve` under the dispatch logger, which sees nothing of the grader's own steps around it."""
    def logged(*inputs):
        with log:
            return solve(*inputs)

    return logged


class _ImportGuard:
    """Blocks imports outside the DSL's allow-list made by the submission's own code, judged from the real calling
    frame: code whose globals are the submission's, or code that lives in no file of the installed libraries (exec'd
    or generated)."""

    def __init__(self, module_globals: dict, allowed_roots: tuple[str, ...], trusted_dirs: tuple[str, ...]) -> None:
        self.module_globals = module_globals
        self.allowed_roots = allowed_roots
        self.trusted_dirs = trusted_dirs
        self.original = builtins.__import__

    def untrusted(self, frame) -> bool:
        if frame is None or frame.f_globals is self.module_globals:
            return True
        filename = frame.f_code.co_filename
        if filename.startswith("<frozen "):  # the interpreter's own frozen modules (importlib, io, ...)
            return False
        return not (os.path.isabs(filename) and os.path.realpath(filename).startswith(self.trusted_dirs))

    def __call__(self, name, globals=None, locals=None, fromlist=(), level=0):
        if self.untrusted(sys._getframe(1)):
            root_ok = any(name == r or name.startswith(r + ".") for r in self.allowed_roots)
            if level or not root_ok:
                raise ImportError(f"import of '{name}' is not allowed in a submission")
        return self.original(name, globals, locals, fromlist, level)


def _trusted_dirs() -> tuple[str, ...]:
    """Where the interpreter's, the installed libraries' and the grader's own code lives."""
    import sysconfig

    import metakernelbench

    paths = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths.add(os.path.dirname(os.path.dirname(metakernelbench.__file__)))
    return tuple(os.path.realpath(p) + os.sep for p in paths)


def _install_dirs(roots: tuple[str, ...]) -> tuple[str, ...]:
    """The import-path entries the allowed packages are installed under: a DSL unpacked outside site-packages and put
    on PYTHONPATH (a GPU machine without a package registry) is library code, and so are its dependencies and native
    libraries beside it (every entry above the package counts: CuTe DSL's runtime sits beside its Python packages,
    not below them). An entry holding the child's working folder, where the submission's files are, is never one."""
    entries = [os.path.realpath(e) + os.sep for e in sys.path if e and os.path.isabs(e) and os.path.isdir(e)]
    work = os.path.realpath(os.getcwd()) + os.sep
    found = set()
    for root in {r.split(".")[0] for r in roots}:
        try:
            spec = importlib.util.find_spec(root)
        except (ImportError, ValueError):
            continue
        locations = list(spec.submodule_search_locations or []) if spec else []
        origin = spec and (spec.origin if spec.has_location else next(iter(locations), None))
        if not origin:
            continue
        origin = os.path.realpath(origin)
        found.update(e for e in entries if origin.startswith(e) and not work.startswith(e))
    return tuple(sorted(found))


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
        self.count = 0
        for owner, attr in ((threading, "_start_new_thread"), (threading, "_start_joinable_thread"),
                            (_thread, "start_new_thread"), (_thread, "start_joinable_thread"), (_thread, "start_new")):
            original = getattr(owner, attr, None)
            if original is not None:
                setattr(owner, attr, self._counting(original))

    def _counting(self, original):
        def start(*args, **kwargs):
            self.count += 1
            return original(*args, **kwargs)

        return start


# torch's doors to other kernel languages whose kernels no dispatch logger sees: shut in every submission's child.
_OTHER_LANGUAGES = (("torch", "compile"), ("torch.cuda.jiterator", "_create_jit_fn"),
                    ("torch.cuda.jiterator", "_create_multi_output_jit_fn"),
                    ("torch._C", "_cuda_jiterator_compile_and_launch_kernel"))
# Modules of other kernel languages a submission's child never loads, by any route.
_OTHER_LANGUAGE_MODULES = ("torch.utils.cpp_extension", "torch._inductor", "torch.cuda.jiterator")


def _shut_other_languages() -> None:
    for module_name, attr in _OTHER_LANGUAGES:
        owner = sys.modules.get(module_name)
        if owner is not None and hasattr(owner, attr):
            setattr(owner, attr, _refused(f"{module_name}.{attr}"))


def _refused(name: str):
    def refused(*args, **kwargs):
        raise RuntimeError(f"{name} is another kernel language: not available in a submission")

    return refused


def _timing(device_type: str, flush_buffer: torch.Tensor):
    """The flush and the timed call, with every primitive bound now (before the import) and held in this closure."""
    perf_counter, gc_disable, gc_enable, gc_isenabled = time.perf_counter, gc.disable, gc.enable, gc.isenabled
    flush = torch._C.TensorBase.max
    if device_type == "cuda":
        sync, Event, record = torch.cuda.synchronize, torch.cuda.Event, torch.cuda.Event.record
        elapsed, wait = torch.cuda.Event.elapsed_time, torch.cuda.Event.synchronize

    def timed(solve, inputs: tuple) -> tuple[object, float, float]:
        # The flush reads: a written buffer would leave the cache full of dirty lines, and the timed call would pay
        # for their write-back (on the H200 that added 1.1 us to a kernel that only reads 16 MB).
        flush(flush_buffer)
        collecting = gc_isenabled()
        gc_disable()  # a collection inside the timed region would be charged to the submission
        try:
            if device_type == "cuda":
                sync()
                start, end = Event(enable_timing=True), Event(enable_timing=True)
                record(start)
                host_start = perf_counter()
                outputs = solve(*inputs)
                sync()
                record(end)
                wait(end)
                host_ms = (perf_counter() - host_start) * 1e3
                return outputs, elapsed(start, end), host_ms
            host_start = perf_counter()
            outputs = solve(*inputs)
            host_ms = (perf_counter() - host_start) * 1e3
            return outputs, host_ms, host_ms
        finally:
            if collecting:
                gc_enable()

    return timed


class Runner:
    def __init__(self, sock: socket.socket, job: dict) -> None:
        self.sock = sock
        self.job = job
        self.device = job["device"]
        self.device_type = torch.device(self.device).type
        self.inplace = {int(v): k for k, v in job.get("inplace", {}).items()}
        self.outputs = list(job.get("outputs", ()))
        self.keep_alive: collections.deque = collections.deque()
        self.keep_alive_bytes = 0
        self.last: dict | None = None
        self.gate = None
        self.adapter = None
        self.solve = None
        self.window: tuple[float, dict[int, int]] | None = None
        self.input_maps = cuda_ipc.Mappings()  # the parent's input buffer, mapped once per grading
        if self.device_type == "cuda":
            torch.cuda.set_device(torch.device(self.device).index or 0)
        self.perf_counter = time.perf_counter
        self.timed = _timing(self.device_type, torch.zeros(L2_FLUSH_BYTES[self.device_type], dtype=torch.uint8,
                                                           device=self.device))
        self.thread_starts = _ThreadStarts()
        self.import_hooks: list[tuple[object, str, object]] = []
        self.snapshot: _Snapshot | None = None
        self.main_tid = threading.get_native_id()
        self.old_threads: set[int] = set()
        self.dispatch_keys = self._dispatch_keys()
        self.trusted = _trusted_dirs()

    # -- set-up -----------------------------------------------------------------------------------------------
    def load(self) -> dict:
        mode = self.job["mode"]
        if mode in ("eager", "compiled"):
            from metakernelbench.suite.loader import problem_from_file

            reference = problem_from_file(self.job["problem_path"]).module.reference
            self.solve = torch.compile(reference) if mode == "compiled" else reference
            pinned = numerics.pin()
            self.arm()
            return {"numerics": pinned}
        from metakernelbench.dsl import foreign_roots, get_adapter
        from metakernelbench.dsl.gate import LaunchGate
        from metakernelbench.dsl.rules import COMMON_IMPORTS

        self.adapter = get_adapter(self.job["dsl"])
        self.gate = LaunchGate()
        self.adapter.install_gate(self.gate)
        module_name = "submission"
        spec = importlib.util.spec_from_file_location(module_name, self.job["candidate_path"])
        module = importlib.util.module_from_spec(spec)
        allowed = self.adapter.allowed_roots + COMMON_IMPORTS
        self.trusted += _install_dirs(allowed)
        guard = _ImportGuard(vars(module), allowed, self.trusted)
        builtins.__import__ = guard
        for name in [m for m in sys.modules if m == "metakernelbench" or m.startswith("metakernelbench.suite.")]:
            sys.modules.pop(name)
        _shut_other_languages()
        blocked = _BlockedImports(foreign_roots(self.job["dsl"]) + _OTHER_LANGUAGE_MODULES)
        sys.meta_path.insert(0, blocked)
        self.import_hooks = [(builtins, "__import__", guard), (sys.meta_path, 0, blocked)]
        self.arm()
        started = self.perf_counter()
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        solve = getattr(module, "solve", None)
        if not callable(solve):
            raise AttributeError("the submission defines no callable `solve`")
        self.solve = solve
        return {"import_s": self.perf_counter() - started, "gate_entry_points": len(self.gate.wrapped)}

    def arm(self) -> None:
        """The snapshot every later check compares with, taken just before the submission's code first runs."""
        spaces = _namespaces(self.device_type) + [("runner", self)]
        if self.gate is not None:
            spaces += [(f"gated {owner}", owner) for owner in self.gate.owners]
        self.snapshot = _Snapshot(spaces)
        self.old_threads = set(_thread_times())
        self.hooks = _hooks()
        self.native_code = _executable_files()

    # -- integrity --------------------------------------------------------------------------------------------
    @staticmethod
    def _dispatch_keys() -> tuple[str, str]:
        return (str(torch._C._dispatch_tls_local_include_set()), str(torch._C._dispatch_tls_local_exclude_set()))

    def integrity(self, native: bool = False) -> list[str]:
        """What the submission changed that the grader's own steps depend on (empty when nothing; a baseline runs no
        submission). Native code is looked for (`native`, a read of the whole memory map) after the import, at every
        output report and at the end: code it could run stays mapped until then."""
        if self.adapter is None:
            return []
        problems = [f"{name} was replaced" for name in self.snapshot.changed()]
        for owner, key, hook in self.import_hooks:
            current = owner[key] if isinstance(owner, list) else getattr(owner, key)
            if current is not hook:
                problems.append(f"the grader's import guard ({key}) was removed")
        if torch._C._len_torch_function_stack() or torch._C._len_torch_dispatch_stack():
            problems.append("a torch function or dispatch mode is active outside solve")
        if self._dispatch_keys() != self.dispatch_keys:
            problems.append("torch's thread-local dispatch keys were changed")
        if _hooks() != self.hooks:
            problems.append("a trace or profile hook, collector callback, signal handler or timer was installed")
        foreign = _foreign(_executable_files() - self.native_code, self.trusted) if native else []
        if foreign:
            problems.append(f"native code was loaded from outside the installed libraries ({foreign[0]})")
        return problems

    def close_window(self) -> list[str]:
        """Judge the native threads between `solve` returning and now (the output report or the next request)."""
        if self.window is None:
            return []
        opened, before = self.window
        self.window = None
        remaining = REPORT_WINDOW_S - (self.perf_counter() - opened)
        if remaining > 0:
            time.sleep(remaining)
        after = _thread_times()
        problems = []
        born = sorted(set(after) - set(before))
        if born:
            problems.append(f"{len(born)} native thread(s) started after solve returned")
        for tid, ns in after.items():
            if tid != self.main_tid and tid not in self.old_threads and ns - before.get(tid, ns) > THREAD_IDLE_NS:
                problems.append(f"native thread {tid} ran {(ns - before[tid]) / 1e6:.2f} ms after solve returned "
                                "(work escaping the timer)")
        return problems

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

    def _inputs(self, msg: dict) -> tuple:
        """The parent's inputs, copied into storage this process owns: tensors from the hand-over, scalars as sent."""
        layouts = msg["tensors"]
        if msg.get("transport") == "ipc":
            copies = cuda_ipc.import_copies(layouts, self.device, self.input_maps)
        else:
            copies = channel.read_from_file(layouts, msg["path"], self.device)
        return channel.input_values(msg["inputs"], copies)

    def call(self, msg: dict) -> dict:
        self.last = None
        problems = self.close_window() + self.integrity()
        if problems:
            return {"integrity_problems": problems}
        inputs = self._inputs(msg)
        pristine = [t.clone() if isinstance(t, torch.Tensor) else None for t in inputs]
        self._poison(inputs)
        l2_reset = cuda_ipc.reset_persisting_l2(torch.device(self.device)) if self.device_type == "cuda" else None
        log = None
        if self.gate is not None:
            self.gate.take()
            self.gate.neutralise = bool(msg.get("ghost"))
            self.gate.readings = []
            self.gate.clock = self._launch_clock if msg.get("measure_dsl") or msg.get("profile") else None
            if msg.get("log_eager"):
                log = _EagerLog(self.gate, self.adapter.launches_run_torch)
        threads_started = self.thread_starts.count
        solve = self.solve
        try:
            if log is not None:
                outputs, ms, host_ms = self.timed(_logged(solve, log), inputs)
            elif msg.get("profile") and self.device_type == "cuda":
                outputs, ms, host_ms, kernel_ms = self._profiled(solve, inputs)
            else:
                outputs, ms, host_ms = self.timed(solve, inputs)
        finally:
            if self.gate is not None:
                self.gate.neutralise = False
                self.gate.clock = None
        problems = self.integrity()
        profiled_or_baseline = msg.get("profile") or self.adapter is None  # profiler threads; trusted code
        self.window = None if profiled_or_baseline else (self.perf_counter(), _thread_times())
        launches = self.gate.take() if self.gate is not None else None
        reply = {"ms": ms, "host_ms": host_ms, "launches": launches, "l2_reset": l2_reset,
                 "threads_started": self.thread_starts.count - threads_started,
                 "threads_alive": threading.active_count(), "native_threads": len(self.window[1]) if self.window else
                 None, "integrity_problems": problems}
        if msg.get("measure_dsl") and self.gate is not None:
            reply["dsl_ms"] = self._dsl_ms()
        if log is not None:
            reply["eager_ops"] = dict(log.compute.most_common(8))
            reply["eager_elements"] = log.elements
            reply["input_elements"] = sum(t.numel() for t in inputs if isinstance(t, torch.Tensor))
        if msg.get("profile"):
            reply["kernel_ms"] = kernel_ms if self.device_type == "cuda" else self._dsl_ms()
        self.last = {"inputs": inputs, "pristine": pristine, "outputs": outputs}
        self._remember(inputs)
        return reply

    def _profiled(self, solve, inputs: tuple) -> tuple[object, float, float, float]:
        """One call under the profiler, for the kernel-only device time (never a timed call)."""
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            outputs, ms, host_ms = self.timed(solve, inputs)
        device_us = sum(getattr(e, "device_time_total", 0.0) for e in prof.key_averages()
                        if "unsigned char" not in e.key)  # the flush's own reduction kernel is the grader's
        return outputs, ms, host_ms, device_us / 1e3

    def _launch_clock(self):
        """A timestamp on the device's current stream (GPU) or the host clock (CPU, where launches are synchronous)."""
        if self.device_type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return self.perf_counter()

    def _dsl_ms(self) -> float:
        if self.device_type == "cuda":
            return sum(begin.elapsed_time(end) for begin, end in self.gate.readings)
        return sum(end - begin for begin, end in self.gate.readings) * 1e3

    def drop(self) -> dict:
        """Outputs never read: only the threads are judged now (the next call's own check covers the rest)."""
        self.last = None
        return {"integrity_problems": self.close_window()}

    def report_outputs(self, path: str, ipc: bool = False) -> dict:
        """Outputs stay referenced until the next call or drop: the parent may ask again by file if IPC fails."""
        problems = self.close_window() + self.integrity(native=True)
        if problems:
            return {"integrity_problems": problems}
        if self.last is None:
            return {"error": "no outputs to send"}
        inputs, pristine, outputs = self.last["inputs"], self.last["pristine"], self.last["outputs"]
        single = type(outputs) not in (tuple, list)  # exact types: a subclass's __iter__ would run here
        items = [outputs] if single else list(outputs)
        problems = [f"output {i} is {type(out).__module__}.{type(out).__qualname__}, not torch.Tensor"
                    for i, out in enumerate(items) if type(out) is not torch.Tensor]
        problems += [f"input {i} was modified but the problem does not declare it an in-place output"
                     for i, (now, before) in enumerate(zip(inputs, pristine))
                     if before is not None and i not in self.inplace and not torch.equal(now, before)]
        for index, name in self.inplace.items():
            pos = self.outputs.index(name) if name in self.outputs else None
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

    def finish(self) -> dict:
        problems = self.close_window() + self.integrity(native=True)
        return {"integrity_problems": problems, "python_threads": threading.active_count(),
                "native_threads": len(os.listdir("/proc/self/task"))}


def _error_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-6000:]


def steady_host(device: str) -> dict:
    """Pin this process to one CPU (lane i takes the i-th from the end of the allowed set, so lanes do not share) and
    make CUDA synchronisation spin (before CUDA starts here). The official time of a call includes its host path;
    without these, the same reference's median moved 1.9-2.4x between fresh processes on the H200, with them (and
    the collector off while timed) 1.05-1.2x (benchmarks/timing_noise.py). Returns what was set, for the verdict."""
    if torch.device(device).type != "cuda":
        return {}
    return {**_pin(device), "cuda_schedule": cuda_ipc.spin_when_synchronising(torch.device(device).index or 0)}


def _pin(device: str) -> dict:
    """Every thread of this process (CUDA's own included, where it started already) onto the lane's CPU."""
    index = torch.device(device).index or 0
    allowed = sorted(os.sched_getaffinity(0))
    cpu = allowed[-1 - index % len(allowed)]
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError:
        return {"cpu": None}
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), {cpu})
        except OSError:
            pass  # the thread ended meanwhile
    return {"cpu": cpu}


def prepare(device: str) -> dict:
    """What a child needs before any job is known, done ahead in a spare child (while another child imports and
    compiles): the spinning synchronisation and the device's context, about 0.18 s of CUDA start on the H200. Not
    the pinning: a spare pinned to the lane's CPU would take it from the child being graded (`serve` pins)."""
    if torch.device(device).type != "cuda":
        return {}
    schedule = cuda_ipc.spin_when_synchronising(torch.device(device).index or 0)
    torch.cuda.set_device(torch.device(device).index or 0)
    torch.zeros(1, device=device)
    return {"cuda_schedule": schedule}


def static_violations(job: dict) -> list[str]:
    """The static rules, judged here, before anything of the submission runs: a fresh single-threaded process, where
    CPython 3.11's parser cannot be raced (in the grader's own process, lanes are threads, and concurrent parses
    corrupt the AST constructor's shared recursion counter)."""
    from metakernelbench.dsl import get_adapter

    path = job["candidate_path"]
    with open(path) as f:
        source = f.read()
    try:
        return get_adapter(job["dsl"]).check_source(source, path)
    except SyntaxError as exc:
        return [f"syntax error at line {exc.lineno}: {exc.msg}"]


def serve(sock: socket.socket, job: dict, host: dict | None = None) -> None:
    """Answer the parent's requests until it says finish; every reply echoes its request's nonce. `host` is what
    `prepare` returned where a spare child did it ahead."""
    clock = time.perf_counter
    setup_s = {"isolate": job.get("isolate_s", 0.0)}
    started = clock()
    if job.get("static_rules") and job.get("mode") == "candidate":
        violations = static_violations(job)
        if violations:
            channel.send(sock, {"op": "ready", "nonce": job["nonce"], "violations": violations})
            return
    setup_s["static_rules"] = clock() - started
    try:
        started = clock()
        prepared = prepare(job["device"]) if host is None else host
        host = {**_pin(job["device"]), **prepared} if prepared else {}
        runner = Runner(sock, job)
        setup_s["device"] = clock() - started
        started = clock()
        info = runner.load()
        setup_s["load"] = clock() - started
    except BaseException as exc:  # the submission failed to import: report, never raise
        channel.send(sock, {"op": "ready", "nonce": job["nonce"], "error": _error_text(exc)})
        return
    started = clock()
    problems = runner.integrity(native=True)
    setup_s["integrity"] = clock() - started
    channel.send(sock, {"op": "ready", "nonce": job["nonce"], "python_threads": threading.active_count(),
                        "isolation": job.get("isolation", {}), "host": host, "integrity_problems": problems,
                        "setup_s": setup_s, **info})
    while True:
        msg = channel.recv(sock)
        op, nonce = msg.get("op"), msg.get("nonce")
        try:
            if op == "call":
                channel.send(sock, {"nonce": nonce, **runner.call(msg)})
            elif op == "send":
                channel.send(sock, {"nonce": nonce, **runner.report_outputs(msg["path"], bool(msg.get("ipc")))})
            elif op == "drop":
                channel.send(sock, {"nonce": nonce, **runner.drop()})
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
