"""DSL adapters: what a variant's task says about its DSL, which code is legal, how launches are proved and compiled.

The registry here is the only place a DSL is named. Each row maps a DSL's name to its adapter class; a DSL shipped
as its own package adds a row through the `metakernelbench.dsls` entry-point group (`name = "module:Class"`), and
nothing else in the benchmark needs editing. Adapters import their DSL lazily, so the suite, CLI and tests work where
a DSL is not installed.
"""
from __future__ import annotations

import functools
import importlib
import importlib.metadata

from metakernelbench.dsl.adapter import Adapter, CompileCheck

ENTRY_POINT_GROUP = "metakernelbench.dsls"
BUILTIN = {
    "cute": "metakernelbench.dsl.cute:CuteAdapter",
    "tirx": "metakernelbench.dsl.tirx:TirxAdapter",
}
# Kernel libraries that are no registered DSL: no variant may import them (threat 21), whatever its DSL, unless a
# registered DSL claims the root as its own. Root -> the name a task statement gives it.
KERNEL_LIBRARIES = {
    "triton": "Triton", "quack": "quack", "flash_attn": "FlashAttention", "flashinfer": "FlashInfer",
    "vllm": "vLLM", "sgl_kernel": "sgl-kernel", "deep_gemm": "DeepGEMM", "cupy": "CuPy", "pycuda": "PyCUDA",
    "numba": "Numba", "tilelang": "TileLang", "thunderkittens": "ThunderKittens",
}


class UnknownDSL(Exception):
    pass


@functools.cache
def registry() -> dict[str, str]:
    """name -> "module:Class", the built-in rows first, then installed plugins' (which may not shadow a built-in)."""
    rows = dict(BUILTIN)
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        rows.setdefault(entry.name, entry.value)
    return rows


def dsl_names() -> tuple[str, ...]:
    return tuple(registry())


@functools.cache
def get_adapter(name: str) -> Adapter:
    rows = registry()
    if name not in rows:
        raise UnknownDSL(f"unknown DSL '{name}'; choose one of: {', '.join(rows)}")
    module_name, _, class_name = rows[name].partition(":")
    adapter = getattr(importlib.import_module(module_name), class_name)()
    if adapter.name != name:
        raise UnknownDSL(f"the registry row '{name}' names {rows[name]}, whose adapter calls itself "
                         f"'{adapter.name}': make the two agree")
    return adapter


def foreign_roots(dsl: str | None) -> tuple[str, ...]:
    """Package roots a variant in `dsl` must not import: every other registered DSL's own roots and every kernel
    library that is no registered DSL. `None` (an eager or compile baseline) gets none blocked."""
    if dsl is None:
        return ()
    own = set(get_adapter(dsl).exclusive_roots)
    others = {root for name in dsl_names() if name != dsl for root in get_adapter(name).exclusive_roots}
    return tuple(sorted((others | set(KERNEL_LIBRARIES)) - own))


def other_kernel_languages(dsl: str) -> list[str]:
    """What a variant's task statement names as forbidden kernel languages."""
    titles = [get_adapter(name).title for name in dsl_names() if name != dsl]
    registered = {root for name in dsl_names() for root in get_adapter(name).exclusive_roots}
    unregistered = ["Triton"] if "triton" not in registered else []
    return ["torch.compile", *titles, *unregistered, "CUDA C++", "CUDA graphs"]


def leak_pattern() -> str:
    """One regex alternation of every registered DSL's code identifiers: a skill that contains them carries code."""
    return "|".join(part for name in dsl_names() for part in get_adapter(name).leak_identifiers)


__all__ = ["Adapter", "CompileCheck", "UnknownDSL", "dsl_names", "get_adapter", "foreign_roots",
           "other_kernel_languages", "leak_pattern", "registry", "KERNEL_LIBRARIES"]
