"""DSL adapters: what a variant's task says about its DSL, which code is legal, how launches are proved and compiled.

Each adapter is small and imports its DSL lazily, so the suite, CLI and tests work where a DSL is not installed.
"""
from metakernelbench.dsl.adapter import Adapter, CompileCheck, UnknownDSL, get_adapter, DSL_NAMES

__all__ = ["Adapter", "CompileCheck", "UnknownDSL", "get_adapter", "DSL_NAMES"]
