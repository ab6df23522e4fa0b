"""Static legality rules for submissions: which imports and names a kernel file may use in a DSL variant.

These rules are the first line against reward hacking (GRADER-THREATS rows 1, 12, 21): no other kernel language,
no file or process access, no introspection of the grader, no dynamic imports. Runtime checks in the child back
them up.
"""
from __future__ import annotations

import ast

COMMON_IMPORTS = ("torch", "math", "functools", "typing", "operator", "itertools", "dataclasses", "__future__")

FORBIDDEN_NAMES = {
    "open": "reading or writing files", "exec": "dynamic code", "eval": "dynamic code", "compile": "dynamic code",
    "__import__": "dynamic imports", "globals": "grader introspection", "locals": "grader introspection",
    "vars": "grader introspection", "breakpoint": "debugger", "input": "interactive input",
    "memoryview": "raw memory access", "__builtins__": "builtins tampering", "setattr": "monkeypatching",
    "delattr": "monkeypatching", "getattr": "dynamic attribute access (write the attribute name)",
}

FORBIDDEN_CALL_PATHS = {
    "torch.compile": "torch.compile is another kernel language", "torch._dynamo": "torch.compile",
    "torch._inductor": "torch.compile", "torch.cuda.graph": "CUDA graphs", "torch.cuda.graphs": "CUDA graphs",
    "torch.cuda.CUDAGraph": "CUDA graphs", "torch.cuda.make_graphed_callables": "CUDA graphs",
    "torch.utils.cpp_extension": "raw CUDA/C++", "torch.library": "custom torch ops",
    "torch.ops": "torch.ops reaches other libraries' kernels", "torch.manual_seed": "seeds are the grader's",
    "torch.seed": "seeds are the grader's", "torch.initial_seed": "seeds are the grader's",
    "torch.random": "seeds are the grader's", "torch.get_rng_state": "seeds are the grader's",
    "torch.cuda.manual_seed": "seeds are the grader's", "torch.cuda.get_rng_state": "seeds are the grader's",
    "torch.cuda.synchronize": "synchronisation is the grader's", "torch.cuda.Event": "timing is the grader's",
    "torch.cuda.Stream": "side streams hide work from the timer", "torch.cuda.stream": "side streams",
    "torch.cuda.set_stream": "side streams", "torch.cuda.memory": "allocator tampering",
    "torch.from_file": "reading files",
    "torch.load": "reading files", "torch.save": "writing files", "torch.hub": "downloads",
}

FORBIDDEN_ATTRIBUTES = {
    "__subclasses__": "introspection", "__globals__": "introspection", "__code__": "introspection",
    "__dict__": "introspection", "__class__": "introspection", "__bases__": "introspection", "__mro__": "introspection",
    "__closure__": "introspection", "__builtins__": "introspection", "__loader__": "introspection",
    "__spec__": "introspection", "f_back": "frame introspection", "f_globals": "frame introspection",
    "f_locals": "frame introspection", "gi_frame": "frame introspection", "tb_frame": "frame introspection",
    "cuModuleLoad": "raw driver launches", "cuModuleLoadData": "raw driver launches",
    "cuModuleLoadDataEx": "raw driver launches", "cuModuleLoadFatBinary": "raw driver launches",
    "cuLibraryLoadData": "raw driver launches", "cuLibraryLoadFromFile": "raw driver launches",
    "cuLaunchKernel": "raw driver launches", "cuLaunchKernelEx": "raw driver launches",
    "cuLaunchCooperativeKernel": "raw driver launches", "cuCtxResetPersistingL2Cache": "L2 persistence",
    "cuStreamSetAttribute": "L2 persistence", "cuCtxSetLimit": "L2 persistence", "cuGraphLaunch": "CUDA graphs",
    "cuStreamBeginCapture": "CUDA graphs", "load_module": "loading foreign binaries",
    "export_library": "writing binaries", "Thread": "background threads", "Process": "subprocesses",
    "_cdata": "keying results on storage addresses",
    "_version": "keying results on tensor versions", "untyped_storage": "keying results on storage",
    "os": "modules re-exported by allowed ones", "sys": "modules re-exported by allowed ones",
    "importlib": "modules re-exported by allowed ones", "builtins": "modules re-exported by allowed ones",
    "ctypes": "modules re-exported by allowed ones", "inspect": "modules re-exported by allowed ones",
    "subprocess": "modules re-exported by allowed ones", "gc": "modules re-exported by allowed ones",
    "attrgetter": "dynamic attribute access", "methodcaller": "dynamic attribute access",
}


def check_source(source: str, allowed_roots: tuple[str, ...], filename: str = "submission.py") -> list[str]:
    """Return human-readable violations (empty when the file is legal). Raises SyntaxError on unparsable code."""
    tree = ast.parse(source, filename=filename)
    allowed = set(COMMON_IMPORTS) | set(allowed_roots)
    problems: list[str] = []

    def allowed_module(name: str) -> bool:
        return any(name == root or name.startswith(root + ".") for root in allowed)

    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[(alias.asname or alias.name).split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def dotted(node: ast.AST) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        return ".".join([aliases.get(node.id, node.id), *reversed(parts)])

    def forbidden_path(path: str) -> str | None:
        for prefix, why in FORBIDDEN_CALL_PATHS.items():
            if path == prefix or path.startswith(prefix + "."):
                return f"'{prefix}' is forbidden ({why})"
        return None

    for node in ast.walk(tree):
        where = f"line {getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not allowed_module(alias.name):
                    problems.append(f"{where}: import of '{alias.name}' is not allowed (allowed: {sorted(allowed)})")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                problems.append(f"{where}: relative imports are not allowed; kernels must be defined in this file")
            elif not allowed_module(module):
                problems.append(f"{where}: import from '{module}' is not allowed (allowed: {sorted(allowed)})")
            for alias in node.names:
                why = forbidden_path(f"{module}.{alias.name}")
                if alias.name in FORBIDDEN_ATTRIBUTES:
                    why = f"'{alias.name}' is forbidden ({FORBIDDEN_ATTRIBUTES[alias.name]})"
                if why:
                    problems.append(f"{where}: {why}")
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            problems.append(f"{where}: '{node.id}' is forbidden ({FORBIDDEN_NAMES[node.id]})")
        elif isinstance(node, ast.Attribute):
            if node.attr in FORBIDDEN_ATTRIBUTES:
                problems.append(f"{where}: '.{node.attr}' is forbidden ({FORBIDDEN_ATTRIBUTES[node.attr]})")
            elif (path := dotted(node)) and (why := forbidden_path(path)):
                problems.append(f"{where}: {why}")
        elif isinstance(node, ast.Name) and node.id in aliases and (why := forbidden_path(aliases[node.id])):
            problems.append(f"{where}: {why}")
    if not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "solve" for n in tree.body):
        problems.append("the file defines no top-level function `solve(*inputs)`")
    return problems
