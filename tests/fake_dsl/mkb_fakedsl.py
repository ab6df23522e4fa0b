"""The fake DSL's adapter: the one file a third DSL adds (its registry row is the entry point beside it)."""
from metakernelbench.dsl.adapter import Adapter
from metakernelbench.dsl.gate import LaunchGate


class FakeAdapter(Adapter):
    name = "fake"
    title = "Fake DSL"
    package = "fakedsl"
    allowed_roots = ("fakedsl",)
    exclusive_roots = ("fakedsl",)
    distributions = ("fakedsl",)
    leak_identifiers = (r"fakedsl\.\w+",)

    def guide(self) -> str:
        return "## Fake DSL\nDecorate a function with `@fakedsl.kernel`; calling it launches the kernel.\n"

    def install_gate(self, gate: LaunchGate) -> None:
        import fakedsl

        gate.wrap(fakedsl.Kernel, "__call__")
