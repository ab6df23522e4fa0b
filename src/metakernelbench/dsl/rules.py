"""Static legality rules for submissions: the safe subset of Python a kernel file may use in a DSL variant.

The rules allow a subset rather than deny a list (GRADER-THREATS rows 1, 12, 21-25): imports only from allowed
roots; inside restricted namespaces (torch, and what an adapter declares, such as CUDA's driver bindings) only the
members named; no dunder, private or frame-family attribute; no attribute assignment except to `self` in a method;
a module is only ever the base of an attribute, never a value that could be aliased past these checks; DSL
externs only for literal math names. Runtime checks in the child back every rule up.
"""
from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass, field

COMMON_IMPORTS = ("torch", "math", "functools", "typing", "operator", "itertools", "dataclasses", "__future__")

FORBIDDEN_NAMES = {
    "open": "reading or writing files", "exec": "dynamic code", "eval": "dynamic code", "compile": "dynamic code",
    "globals": "grader introspection", "locals": "grader introspection", "vars": "grader introspection",
    "dir": "introspection", "breakpoint": "debugger", "input": "interactive input",
    "memoryview": "raw memory access", "setattr": "monkeypatching", "delattr": "monkeypatching",
    "getattr": "dynamic attribute access (write the attribute name)", "hasattr": "dynamic attribute access",
    "type": "class introspection and creation (use isinstance)", "id": "keying results on object identity",
}
# Dunder names a file may read, define as methods, or bind in a class body.
SAFE_DUNDER_NAMES = frozenset({"__name__", "__doc__", "__file__"})
SAFE_DUNDER_METHODS = frozenset({
    "__init__", "__call__", "__repr__", "__str__", "__len__", "__getitem__", "__iter__", "__next__", "__contains__",
    "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__bool__", "__enter__", "__exit__",
    "__post_init__"})
SAFE_DUNDER_BINDINGS = frozenset({"__slots__", "__all__"})
FRAME_FAMILY = re.compile(r"^(f|tb|gi|cr|ag|co)_")

# Attribute names refused on any object: the routes exploits took through objects the namespaces cannot see.
FORBIDDEN_ATTRIBUTES = {
    "cuModuleLoad": "raw driver launches", "cuModuleLoadData": "raw driver launches",
    "cuModuleLoadDataEx": "raw driver launches", "cuModuleLoadFatBinary": "raw driver launches",
    "cuLibraryLoadData": "raw driver launches", "cuLibraryLoadFromFile": "raw driver launches",
    "cuLaunchKernel": "raw driver launches", "cuLaunchKernelEx": "raw driver launches",
    "cuLaunchCooperativeKernel": "raw driver launches", "cuCtxResetPersistingL2Cache": "L2 persistence",
    "cuStreamSetAttribute": "L2 persistence", "cuCtxSetLimit": "L2 persistence", "cuGraphLaunch": "CUDA graphs",
    "cuStreamBeginCapture": "CUDA graphs", "load_module": "loading foreign binaries",
    "export_library": "writing binaries", "Thread": "background threads", "Process": "subprocesses",
    "untyped_storage": "keying results on storage", "storage": "keying results on storage",
    "from_file": "reading files", "share_memory_": "shared memory", "register_hook": "autograd hooks",
    "os": "modules re-exported by allowed ones", "sys": "modules re-exported by allowed ones",
    "importlib": "modules re-exported by allowed ones", "builtins": "modules re-exported by allowed ones",
    "ctypes": "modules re-exported by allowed ones", "inspect": "modules re-exported by allowed ones",
    "subprocess": "modules re-exported by allowed ones", "gc": "modules re-exported by allowed ones",
    "multiprocessing": "modules re-exported by allowed ones", "threading": "modules re-exported by allowed ones",
    "socket": "modules re-exported by allowed ones", "shutil": "modules re-exported by allowed ones",
    "pathlib": "modules re-exported by allowed ones", "pickle": "modules re-exported by allowed ones",
    "traceback": "modules re-exported by allowed ones", "weakref": "modules re-exported by allowed ones",
    "tempfile": "modules re-exported by allowed ones", "signal": "modules re-exported by allowed ones",
    "attrgetter": "dynamic attribute access", "methodcaller": "dynamic attribute access",
    "mro": "class introspection",
}

# C math names (and their float forms) and CUDA's math intrinsics: what a DSL extern may call.
_LIBM = ("sin cos tan asin acos atan atan2 sinh cosh tanh asinh acosh atanh exp exp2 exp10 expm1 log log2 log10 "
         "log1p pow sqrt cbrt rsqrt hypot fabs fmod remainder floor ceil trunc round rint nearbyint fmin fmax fma "
         "erf erfc erfinv tgamma lgamma ldexp copysign nextafter fdim").split()
_INTRINSICS = ("expf exp10f logf log2f log10f sinf cosf tanf powf fdividef saturatef frcp_rn frsqrt_rn fsqrt_rn "
               "fdiv_rn fadd_rn fsub_rn fmul_rn fmaf_rn fadd_rz fmul_rz fmaf_rz").split()
EXTERN_MATH = frozenset([*_LIBM, *(n + "f" for n in _LIBM), *("__" + n for n in _INTRINSICS)])

# torch's namespaces a submission may touch, each with its members. `None`: every public non-module member.
TORCH_CUDA = frozenset({"current_stream", "current_device", "device_count", "get_device_capability",
                        "get_device_name", "get_device_properties", "is_available", "device"})
TORCH_HELPERS = frozenset({"Tensor", "Size", "device", "dtype", "finfo", "iinfo", "no_grad", "inference_mode",
                           "is_tensor", "promote_types", "result_type", "get_default_dtype", "broadcast_shapes",
                           "can_cast", "cuda", "nn", "utils", "linalg", "special", "fft"})
TORCH_OPS_REFUSED = frozenset({"from_file"})  # ATen ops that touch files


@functools.cache
def torch_namespaces() -> dict[str, frozenset[str]]:
    """torch's top level allows its dtypes, its ATen operators (every call is dispatched, so the DSL-share calls'
    dispatch logger sees any compute) and a few helpers; below it, a short list of namespaces."""
    import inspect

    import torch

    def public(module) -> frozenset[str]:
        return frozenset(n for n in dir(module) if not n.startswith("_") and not inspect.ismodule(getattr(module, n)))

    ops = {n for n in dir(torch._C._VariableFunctions) if not n.startswith("_") and hasattr(torch, n)}
    dtypes = {n for n in dir(torch) if isinstance(getattr(torch, n, None), torch.dtype)}
    top = frozenset((ops - TORCH_OPS_REFUSED) | dtypes | TORCH_HELPERS)
    return {"torch": top, "torch.cuda": TORCH_CUDA, "torch.nn": frozenset({"functional"}),
            "torch.nn.functional": public(torch.nn.functional), "torch.utils": frozenset({"dlpack"}),
            "torch.utils.dlpack": frozenset({"from_dlpack", "to_dlpack"}), "torch.linalg": public(torch.linalg),
            "torch.special": public(torch.special), "torch.fft": public(torch.fft)}


@dataclass(frozen=True)
class DslRules:
    """What one adapter adds to the common rules: its import roots, its restricted namespaces, the attribute names
    it refuses, and its extern-call functions (whose callee must be a literal name from EXTERN_MATH)."""

    allowed_roots: tuple[str, ...] = ()
    namespaces: dict[str, frozenset[str]] = field(default_factory=dict)
    forbidden_attributes: dict[str, str] = field(default_factory=dict)
    extern_calls: frozenset[str] = frozenset()


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__") and len(name) > 4


class _Checker:
    def __init__(self, rules: DslRules, namespaces: dict[str, frozenset[str]]) -> None:
        self.rules = rules
        self.namespaces = namespaces
        self.allowed = set(COMMON_IMPORTS) | set(rules.allowed_roots)
        self.forbidden = {**FORBIDDEN_ATTRIBUTES, **rules.forbidden_attributes}
        self.problems: list[str] = []
        self.aliases: dict[str, str] = {}  # local name -> dotted path it was imported as
        self.modules: set[str] = set()  # local names bound to modules (by `import`, or a restricted namespace)
        self.parents: dict[ast.AST, ast.AST] = {}
        self.method_self: dict[ast.AST, str] = {}  # method -> its first parameter, where it may store attributes
        self.class_methods: dict[str, set[str]] = {}

    def fail(self, node: ast.AST, why: str) -> None:
        self.problems.append(f"line {getattr(node, 'lineno', '?')}: {why}")

    # -- resolution -------------------------------------------------------------------------------------------
    def dotted(self, node: ast.AST) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in self.aliases:
            return None
        return ".".join([self.aliases[node.id], *reversed(parts)])

    def namespace_problem(self, path: str) -> str | None:
        """Why `path` leaves its restricted namespaces' members, or None."""
        parts = path.split(".")
        current = parts[0]
        for part in parts[1:]:
            members = self.namespaces.get(current)
            if members is None:
                return None
            if part not in members:
                return f"'{current}.{part}' is not allowed (from {current} a submission may use only its listed " \
                       f"members)"
            current = f"{current}.{part}"
        return None

    def allowed_module(self, name: str) -> bool:
        return any(name == root or name.startswith(root + ".") for root in self.allowed)

    # -- imports ----------------------------------------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if not self.allowed_module(alias.name):
                self.fail(node, f"import of '{alias.name}' is not allowed (allowed: {sorted(self.allowed)})")
            elif why := self.namespace_problem(alias.name):
                self.fail(node, why)
            local = alias.asname or alias.name.split(".")[0]
            self.aliases[local] = alias.name if alias.asname else alias.name.split(".")[0]
            self.modules.add(local)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level:
            self.fail(node, "relative imports are not allowed; kernels must be defined in this file")
        elif not self.allowed_module(module):
            self.fail(node, f"import from '{module}' is not allowed (allowed: {sorted(self.allowed)})")
        for alias in node.names:
            if alias.name == "*":
                self.fail(node, "star imports are not allowed (name what you import)")
                continue
            path = f"{module}.{alias.name}"
            why = self.attribute_name_problem(alias.name) or self.namespace_problem(path)
            if why:
                self.fail(node, why)
            local = alias.asname or alias.name
            self.aliases[local] = path
            if path in self.namespaces:
                self.modules.add(local)

    # -- names and attributes ---------------------------------------------------------------------------------
    def attribute_name_problem(self, name: str) -> str | None:
        if _is_dunder(name):
            return f"'.{name}' is forbidden (dunder attributes reach the interpreter's internals)"
        if FRAME_FAMILY.match(name):
            return f"'.{name}' is forbidden (frame, traceback, generator and code objects reach the grader)"
        if name in self.forbidden:
            return f"'.{name}' is forbidden ({self.forbidden[name]})"
        return None

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in FORBIDDEN_NAMES:
            self.fail(node, f"'{node.id}' is forbidden ({FORBIDDEN_NAMES[node.id]})")
        elif _is_dunder(node.id) and node.id not in SAFE_DUNDER_NAMES | SAFE_DUNDER_BINDINGS:
            self.fail(node, f"'{node.id}' is forbidden (interpreter internals)")
        elif isinstance(node.ctx, ast.Store) and _is_dunder(node.id) and node.id not in SAFE_DUNDER_BINDINGS:
            self.fail(node, f"binding '{node.id}' is forbidden")
        if node.id in self.modules and isinstance(node.ctx, ast.Load) and not self.is_attribute_base(node):
            self.fail(node, f"the module '{node.id}' may only be used as `{node.id}.name` (never as a value)")

    def is_attribute_base(self, node: ast.AST) -> bool:
        parent = self.parents.get(node)
        return isinstance(parent, ast.Attribute) and parent.value is node

    def visit_Attribute(self, node: ast.Attribute) -> None:
        base = node.value
        if why := self.attribute_name_problem(node.attr):
            self.fail(node, why)
        elif node.attr.startswith("_") and not (isinstance(base, ast.Name) and base.id in ("self", "cls")):
            self.fail(node, f"'.{node.attr}' is forbidden (private attributes are only your own: self._name)")
        path = self.dotted(node)
        if path is not None:
            if why := self.namespace_problem(path):
                self.fail(node, why)
            elif path in self.namespaces and isinstance(node.ctx, ast.Load) and not self.is_attribute_base(node):
                self.fail(node, f"the namespace '{path}' may only be used as `{path}.name` (never as a value)")
        if isinstance(base, ast.Name) and base.id in self.class_methods and node.attr in self.class_methods[base.id]:
            self.fail(node, f"'{base.id}.{node.attr}': call methods on instances, not through the class")
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self.check_attribute_store(node)

    def check_attribute_store(self, node: ast.Attribute) -> None:
        function = self.enclosing_function(node)
        owner = self.method_self.get(function)
        if not (owner and isinstance(node.value, ast.Name) and node.value.id == owner):
            self.fail(node, f"assigning or deleting '.{node.attr}' is forbidden: only a method's own `self.name` "
                            "may be set (no patching of modules, classes or other objects)")

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            root = node.value
            while isinstance(root, (ast.Attribute, ast.Subscript)):
                root = root.value
            if isinstance(root, ast.Name) and root.id in self.aliases:
                self.fail(node, f"assigning into '{root.id}' (an imported object) is forbidden")

    def enclosing_function(self, node: ast.AST) -> ast.AST | None:
        while node is not None and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            node = self.parents.get(node)
        return node

    # -- definitions and calls --------------------------------------------------------------------------------
    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for keyword in node.keywords:
            self.fail(node, f"class keyword '{keyword.arg}' is forbidden (metaclasses run code on definition)")

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if _is_dunder(node.name) and node.name not in SAFE_DUNDER_METHODS:
            self.fail(node, f"defining '{node.name}' is forbidden (it hooks torch or the interpreter)")

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if name in self.rules.extern_calls:
            self.check_extern(node, name)

    def check_extern(self, node: ast.Call, name: str) -> None:
        literal = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        first = node.args[0] if node.args else None
        callee = next((s for s in literal if s in EXTERN_MATH), None)
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)) or callee is None or \
                any(isinstance(a, ast.Starred) for a in node.args):
            shown = literal[0] if literal else ast.unparse(first) if first is not None else ""
            self.fail(node, f"{name}({shown!r}, ...) is forbidden: externs may call only C math functions and CUDA "
                            f"math intrinsics, named by a string literal")

    # -- driver ------------------------------------------------------------------------------------------------
    def prepare(self, tree: ast.Module) -> None:
        for parent in ast.walk(tree):
            for child in ast.iter_child_nodes(parent):
                self.parents[child] = parent
        for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
            methods = set()
            for item in cls.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    methods.add(item.name)
                    decorators = {ast.unparse(d) for d in item.decorator_list}
                    args = item.args.posonlyargs + item.args.args
                    if args and not decorators & {"staticmethod", "classmethod"}:
                        first = args[0].arg
                        rebound = any(isinstance(n, ast.Name) and n.id == first and isinstance(n.ctx, ast.Store)
                                      for n in ast.walk(item))
                        if not rebound:
                            self.method_self[item] = first
            self.class_methods[cls.name] = methods

    def check(self, tree: ast.Module) -> list[str]:
        """Imports first (anywhere in the file: they bind the aliases the other rules resolve), then every node."""
        self.prepare(tree)
        nodes = list(ast.walk(tree))
        imports = [n for n in nodes if isinstance(n, (ast.Import, ast.ImportFrom))]
        for node in imports + [n for n in nodes if not isinstance(n, (ast.Import, ast.ImportFrom))]:
            method = getattr(self, f"visit_{type(node).__name__}", None)
            if method is not None:
                method(node)
        return self.problems


def check_source(source: str, rules: DslRules | tuple[str, ...] = DslRules(), filename: str = "submission.py") -> list[str]:
    """Return human-readable violations (empty when the file is legal). Raises SyntaxError on unparsable code."""
    if isinstance(rules, tuple):
        rules = DslRules(allowed_roots=rules)
    tree = ast.parse(source, filename=filename)
    problems = _Checker(rules, {**torch_namespaces(), **rules.namespaces}).check(tree)
    if not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "solve" for n in tree.body):
        problems.append("the file defines no top-level function `solve(*inputs)`")
    return list(dict.fromkeys(problems))
