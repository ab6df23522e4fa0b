"""Apache TVM TIRx (0.1.0a4): kernels are `@T.function`s compiled by `tvm_tirx.tirx.compile` into an Executable."""
from __future__ import annotations

from metakernelbench.dsl.adapter import Adapter
from metakernelbench.dsl.gate import LaunchGate


class _GatedModule:
    """Stands in for a jitted module so functions fetched from it launch through the gate."""

    def __init__(self, module, gate: LaunchGate) -> None:
        self._module = module
        self._gate = gate

    def _gated(self, fn):
        holder = type("GatedFunction", (), {"__call__": lambda self, *a, **k: fn(*a, **k)})
        self._gate.wrap(holder, "__call__")
        return holder()

    def __getattr__(self, name):
        value = getattr(self._module, name)
        if name in ("get_function", "__getitem__"):
            return lambda *a, **k: self._gated(value(*a, **k))
        return self._gated(value) if callable(value) else value

    def __getitem__(self, name):
        return self._gated(self._module[name])


class TirxAdapter(Adapter):
    name = "tirx"
    title = "Apache TVM TIRx"
    package = "tvm_tirx"
    allowed_roots = ("tvm_tirx", "tvm_ffi")
    guide_file = "tirx.md"

    def install_gate(self, gate: LaunchGate) -> None:
        from tvm_tirx.codegen.executable import Executable

        original_jit = Executable.jit
        original_getitem = Executable.__getitem__

        def jit(self, *args, **kwargs):
            return _GatedModule(original_jit(self, *args, **kwargs), gate)

        def getitem(self, name):
            return _GatedModule(original_jit(self), gate)._gated(original_getitem(self, name))

        Executable.jit = jit
        Executable.__getitem__ = getitem
        gate.wrap(Executable, "__call__")
