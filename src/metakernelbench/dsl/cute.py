"""NVIDIA CuTe DSL (nvidia-cutlass-dsl 4.8.1): `@cute.jit` host functions launch `@cute.kernel`s, compiled by `cute.compile`."""
from __future__ import annotations

import importlib
import inspect

from metakernelbench.dsl.adapter import Adapter
from metakernelbench.dsl.gate import LaunchGate

# Modules whose JIT-function classes carry the entry points through which compiled CuTe code runs.
_EXECUTOR_MODULES = (
    "cutlass.base_dsl.jit_executor",
    "cutlass.cutlass_dsl.cuda_jit_executor",
    "cutlass.cutlass_dsl.cutlass_function",
    "cutlass.cutlass_dsl.tvm_ffi_provider",
)
_ENTRY_POINTS = ("__call__", "run_compiled_program")


class CuteAdapter(Adapter):
    name = "cute"
    title = "NVIDIA CuTe DSL"
    package = "cutlass.cute"
    allowed_roots = ("cutlass", "cuda.bindings.driver")
    exclusive_roots = ("cutlass",)
    distributions = ("nvidia-cutlass-dsl",)
    leak_identifiers = (r"cute\.\w+", r"cutlass\w*", r"from_dlpack", r"make_ptr", r"@cute")
    guide_file = "cute.md"
    # CUDA's driver bindings give the launch stream and nothing else (no module loads, launches, limits or copies).
    namespaces = {"cuda": frozenset({"bindings"}), "cuda.bindings": frozenset({"driver"}),
                  "cuda.bindings.driver": frozenset({"CUstream"})}
    launches_run_torch = False

    def install_gate(self, gate: LaunchGate) -> None:
        base = importlib.import_module("cutlass.base_dsl.jit_executor")
        roots = (base.JitCompiledFunction, base.JitExecutor)
        for module_name in _EXECUTOR_MODULES:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if issubclass(cls, roots):
                    for attr in _ENTRY_POINTS:
                        if attr in cls.__dict__:
                            gate.wrap(cls, attr, neutral_result=lambda: 0)
