"""Apache TVM TIRx (0.1.0a4): kernels are `@T.function`s compiled by `tvm_tirx.tirx.compile` into an Executable."""
from __future__ import annotations

import os

from metakernelbench.dsl.adapter import Adapter
from metakernelbench.dsl.gate import LaunchGate


class _GatedFunction:
    """A compiled function fetched from a jitted module; its __call__ goes through the gate."""

    __slots__ = ("fn",)

    def __init__(self, fn) -> None:
        self.fn = fn

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


class _GatedModule:
    """Stands in for a jitted module so functions fetched from it launch through the gate (wrappers cached: the
    gate must cost nothing measurable per launch)."""

    def __init__(self, module) -> None:
        self.module = module
        self._functions: dict[str, _GatedFunction] = {}

    def function(self, name: str) -> _GatedFunction:
        if name not in self._functions:
            self._functions[name] = _GatedFunction(self.module.get_function(name, query_imports=True))
        return self._functions[name]

    def get_function(self, name: str, *args, **kwargs) -> _GatedFunction:
        return self.function(name)

    def __getitem__(self, name: str) -> _GatedFunction:
        return self.function(name)

    def __getattr__(self, name: str):
        value = getattr(self.module, name)
        return self.function(name) if callable(value) and not name.startswith("_") else value


class TirxAdapter(Adapter):
    name = "tirx"
    title = "Apache TVM TIRx"
    package = "tvm_tirx"
    allowed_roots = ("tvm_tirx", "tvm_ffi")
    exclusive_roots = ("tvm_tirx",)
    distributions = ("apache-tvm-tirx", "apache-tvm-ffi")
    leak_identifiers = (r"tvm_tirx", r"tvm_ffi", r"T\.\w+", r"@T")
    guide_file = "tirx.md"
    # tvm_ffi is the DLPack bridge: its tensors, devices and dtypes, never its function registry or loaders.
    namespaces = {"tvm_ffi": frozenset({
        "Tensor", "Device", "DLDeviceType", "Shape", "Array", "List", "Map", "Dict", "from_dlpack", "device", "dtype",
        "use_torch_stream", "use_raw_stream", "get_raw_stream", "bool", "bfloat16", "float16", "float32", "float64",
        "float8_e4m3fn", "float8_e5m2", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})}
    forbidden_attributes = {
        name: "calls back into the host or loads foreign code" for name in (
            "call_packed", "call_packed_lowered", "call_cpacked", "call_cpacked_lowered", "tvm_call_packed",
            "call_intrin", "call_llvm_intrin", "call_llvm_pure_intrin", "call_ffi_kernel", "call_kernel",
            "external_kernel", "pyfunc", "call_global_var_", "get_global_func", "register_global_func",
            "remove_global_func", "register_func", "get_global_func_metadata", "init_ffi_api", "system_lib",
            "load_inline", "build_inline", "cpp", "libinfo", "ptx_legacy", "module_set_attr")}
    extern_calls = frozenset({"call_extern", "call_pure_extern"})
    spawns_programs = False  # host kernels JIT in process (LLVM ORC), CUDA ones through NVRTC
    launches_run_torch = False

    def preload(self) -> None:
        """Also resolve the CUDA toolkit the NVRTC build reads its headers from, here in the fork server: left
        unset, TIRx asks `which nvcc` from inside the child, which may not start programs."""
        super().preload()
        if "CUDA_PATH" not in os.environ:
            from tvm_tirx.support.nvcc import find_cuda_path

            try:
                os.environ["CUDA_PATH"] = find_cuda_path()
            except RuntimeError:
                pass  # no toolkit: CUDA builds fail in the child with TIRx's own message

    def install_gate(self, gate: LaunchGate) -> None:
        from tvm_tirx.codegen.executable import Executable

        original_jit = Executable.jit

        def jit(self, *args, **kwargs):
            module = original_jit(self, *args, **kwargs)
            gated = self.__dict__.get("_mkb_gated")
            if gated is None or gated.module is not module:
                gated = self.__dict__["_mkb_gated"] = _GatedModule(module)
            return gated

        Executable.jit = jit
        Executable.__getitem__ = lambda self, name: self.jit()[name]
        Executable.__call__ = lambda self, *args, **kwargs: self.jit().main(*args, **kwargs)
        gate.wrap(_GatedFunction, "__call__")
        gate.watch(Executable)
