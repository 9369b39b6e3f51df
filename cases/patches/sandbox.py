"""The sandbox for untrusted patch code: a static allow-list, a safe compile, and a fuzz run.

Reward-shaping code and safety predicates are written by people and by
language models, so they are treated as hostile until shown otherwise:

1. :func:`check_code` walks the AST against allow-lists (syntax, names,
   attributes, an allow-listed part of numpy and math) and refuses anything
   else with a :class:`PatchRejectedError` whose ``rule`` names what broke.
   Module-level code may only define functions and literal constants, so
   compiling a patch never runs its logic in the calling process.
2. :func:`compile_reward` / :func:`compile_predicate` execute the checked code
   in a namespace holding only read-only proxies of ``np`` and ``math`` and a
   handful of builtins; the callables they return pass read-only copies of
   arrays in and insist on a finite float (or a bool) coming out. They pickle
   as their source, so a worker process re-checks and re-compiles them.
3. :func:`fuzz_reward` / :func:`fuzz_predicate` (from :mod:`remedy.cases.patches.fuzz`,
   re-exported here) call the function on zeros, negatives, huge values,
   NaN/inf and random samples of the spaces inside a limited worker process,
   so an infinite loop or a memory bomb costs bounded time, never the caller.

Loops are allowed (bounded at run time by CPU timers and the worker's limits);
``while True`` is refused outright because it never is what a reward means, and
so are ``return``/``break``/``continue`` inside ``finally`` (they swallow the
timer's exception). A reward is a function of the transition, so code may not
keep state between calls: ``global``/``nonlocal``, mutable defaults,
module-level lists and sets, writes into module-level values and function
attributes are refused, and the module-level dicts and arrays that remain are
made read-only when the code is compiled.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable
from types import MappingProxyType, SimpleNamespace
from typing import Any

import numpy as np

from ..errors import PatchRejectedError, SandboxError
from .fuzz import FuzzReport, fuzz_predicate, fuzz_reward

__all__ = [
    "ALLOWED_NUMPY",
    "ALLOWED_MATH",
    "ALLOWED_ATTRIBUTES",
    "SAFE_BUILTINS",
    "FORBIDDEN_NAMES",
    "REWARD_PARAMS",
    "PREDICATE_PARAMS",
    "MAX_CODE_CHARS",
    "MAX_AST_NODES",
    "MAX_AST_DEPTH",
    "check_code",
    "compile_reward",
    "compile_predicate",
    "SandboxedReward",
    "SandboxedPredicate",
    "FuzzReport",
    "fuzz_reward",
    "fuzz_predicate",
]

REWARD_PARAMS: tuple[str, ...] = ("obs", "action", "reward", "next_obs", "terminated", "truncated", "info")
PREDICATE_PARAMS: tuple[str, ...] = ("obs", "action", "info")

#: patch code longer than this is refused before parsing (huge inputs can exhaust the parser).
MAX_CODE_CHARS = 20_000
#: and so is code with more AST nodes than this,
MAX_AST_NODES = 5_000
#: or nested deeper than this (the checker and ``compile`` recurse over the tree).
MAX_AST_DEPTH = 100

# --------------------------------------------------------------------------- allow-lists

#: numpy names patch code may use as ``np.<name>``: math, reductions, array building. No I/O, no
#: memmaps, no ctypes, no ``np.lib``/``np.random``/printing options, no classes that reach internals.
ALLOWED_NUMPY: frozenset[str] = frozenset(
    {
        # elementwise math
        "abs",
        "absolute",
        "fabs",
        "sign",
        "sqrt",
        "square",
        "cbrt",
        "exp",
        "exp2",
        "expm1",
        "log",
        "log2",
        "log10",
        "log1p",
        "sin",
        "cos",
        "tan",
        "arcsin",
        "arccos",
        "arctan",
        "arctan2",
        "sinh",
        "cosh",
        "tanh",
        "arcsinh",
        "arccosh",
        "arctanh",
        "hypot",
        "deg2rad",
        "rad2deg",
        "degrees",
        "radians",
        "floor",
        "ceil",
        "trunc",
        "rint",
        "round",
        "add",
        "subtract",
        "multiply",
        "divide",
        "true_divide",
        "floor_divide",
        "power",
        "mod",
        "fmod",
        "remainder",
        "negative",
        "positive",
        "reciprocal",
        "minimum",
        "maximum",
        "fmin",
        "fmax",
        "clip",
        "where",
        "copysign",
        "heaviside",
        "interp",
        "isnan",
        "isinf",
        "isfinite",
        "nan_to_num",
        "greater",
        "greater_equal",
        "less",
        "less_equal",
        "equal",
        "not_equal",
        "logical_and",
        "logical_or",
        "logical_not",
        "logical_xor",
        "isclose",
        "allclose",
        "array_equal",
        # reductions
        "sum",
        "mean",
        "median",
        "std",
        "var",
        "min",
        "max",
        "amin",
        "amax",
        "prod",
        "cumsum",
        "diff",
        "argmin",
        "argmax",
        "any",
        "all",
        "average",
        "count_nonzero",
        "nansum",
        "nanmean",
        "nanmax",
        "nanmin",
        "ptp",
        "sort",
        "argsort",
        # linear algebra (``np.linalg`` is a proxy with ``norm`` only)
        "dot",
        "inner",
        "outer",
        "cross",
        "vdot",
        "matmul",
        "linalg",
        # building arrays
        "asarray",
        "array",
        "zeros",
        "ones",
        "full",
        "zeros_like",
        "ones_like",
        "full_like",
        "arange",
        "linspace",
        "concatenate",
        "stack",
        "hstack",
        "vstack",
        "reshape",
        "ravel",
        "squeeze",
        "expand_dims",
        "atleast_1d",
        "flip",
        "shape",
        "size",
        "ndim",
        # constants and scalar types
        "pi",
        "e",
        "inf",
        "nan",
        "newaxis",
        "float32",
        "float64",
        "int32",
        "int64",
        "bool_",
    }
)
_ALLOWED_LINALG: frozenset[str] = frozenset({"norm"})

#: ``math.<name>`` patch code may use: every public function and constant (math does no I/O).
ALLOWED_MATH: frozenset[str] = frozenset(n for n in dir(math) if not n.startswith("_"))

#: attributes allowed on values other than ``np``/``math`` (arrays, dicts, lists, floats).
ALLOWED_ATTRIBUTES: frozenset[str] = frozenset(
    {
        "shape",
        "ndim",
        "size",
        "T",
        "real",
        "imag",
        "sum",
        "mean",
        "min",
        "max",
        "std",
        "var",
        "prod",
        "clip",
        "copy",
        "reshape",
        "flatten",
        "ravel",
        "item",
        "tolist",
        "any",
        "all",
        "argmax",
        "argmin",
        "dot",
        "round",
        "cumsum",
        "squeeze",
        "astype",
        "get",
        "keys",
        "values",
        "items",
        "append",
        "extend",
        "count",
        "index",
        "is_integer",
        "conjugate",
    }
)

_EXCEPTIONS = (
    Exception,
    ArithmeticError,
    ZeroDivisionError,
    OverflowError,
    FloatingPointError,
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    LookupError,
)
_BUILTIN_FUNCS = (
    abs,
    min,
    max,
    float,
    int,
    bool,
    len,
    range,
    sum,
    round,
    pow,
    enumerate,
    zip,
    list,
    tuple,
    dict,
    any,
    all,
    sorted,
    reversed,
    divmod,
    isinstance,
    map,
    filter,
)
#: the builtins patch code sees (everything else, ``open`` and ``__import__`` included, is absent).
SAFE_BUILTINS: dict[str, Any] = {f.__name__: f for f in (*_BUILTIN_FUNCS, *_EXCEPTIONS)}

#: names refused on sight, with their own rule (``forbidden-name:<name>``).
FORBIDDEN_NAMES: frozenset[str] = frozenset(
    {
        "open",
        "exec",
        "eval",
        "compile",
        "getattr",
        "setattr",
        "delattr",
        "hasattr",
        "globals",
        "locals",
        "vars",
        "dir",
        "breakpoint",
        "input",
        "help",
        "type",
        "object",
        "super",
        "memoryview",
        "classmethod",
        "staticmethod",
        "property",
        "exit",
        "quit",
        "print",
        "id",
        "hash",
        "callable",
        "format",
        "repr",
        "ascii",
        "chr",
        "ord",
        "bytes",
        "bytearray",
        "iter",
        "next",
        "BaseException",
        "SystemExit",
        "KeyboardInterrupt",
        "GeneratorExit",
        "os",
        "sys",
        "subprocess",
        "socket",
        "importlib",
        "builtins",
        "ctypes",
        "pickle",
        "shutil",
        "pathlib",
        "io",
        "signal",
        "threading",
        "multiprocessing",
        "inspect",
    }
)

_MODULE_NAMES = {"np": "numpy", "numpy": "numpy", "math": "math"}

_STMTS = (
    ast.FunctionDef,
    ast.Return,
    ast.Assign,
    ast.AugAssign,
    ast.For,
    ast.While,
    ast.If,
    ast.Raise,
    ast.Try,
    ast.Assert,
    ast.Expr,
    ast.Pass,
    ast.Break,
    ast.Continue,
)
_EXPRS = (
    ast.BoolOp,
    ast.NamedExpr,
    ast.BinOp,
    ast.UnaryOp,
    ast.Lambda,
    ast.IfExp,
    ast.Dict,
    ast.Set,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
    ast.Compare,
    ast.Call,
    ast.FormattedValue,
    ast.JoinedStr,
    ast.Constant,
    ast.Attribute,
    ast.Subscript,
    ast.Starred,
    ast.Name,
    ast.List,
    ast.Tuple,
    ast.Slice,
)
_OTHER = (
    ast.Module,
    ast.Load,
    ast.Store,
    ast.boolop,
    ast.operator,
    ast.unaryop,
    ast.cmpop,
    ast.comprehension,
    ast.ExceptHandler,
    ast.arguments,
    ast.arg,
    ast.keyword,
)
_ALLOWED_NODES = _STMTS + _EXPRS + _OTHER

#: rule names for node types that are refused, so the message says what to do.
_NODE_RULES: dict[type, str] = {
    ast.Import: "no-imports",
    ast.ImportFrom: "no-imports",
    ast.ClassDef: "no-classes",
    ast.Global: "no-global",
    ast.Nonlocal: "no-global",
    ast.With: "no-with",
    ast.AsyncWith: "no-async",
    ast.AsyncFunctionDef: "no-async",
    ast.AsyncFor: "no-async",
    ast.Await: "no-async",
    ast.Yield: "no-generators",
    ast.YieldFrom: "no-generators",
    ast.Delete: "no-delete",
    ast.Del: "no-delete",
}


def _reject(message: str, rule: str) -> PatchRejectedError:
    return PatchRejectedError(message, rule=rule)


# --------------------------------------------------------------------------- parsing and normalizing


def _parse(code: str) -> ast.Module:
    if not isinstance(code, str):
        raise _reject(f"patch code must be text, got {type(code).__name__}", "syntax")
    if len(code) > MAX_CODE_CHARS:
        raise _reject(f"patch code is {len(code):,} characters; keep it under {MAX_CODE_CHARS:,}", "too-long")
    try:
        tree = ast.parse(code, filename="<patch>", mode="exec")
    except SyntaxError as ex:
        raise _reject(f"syntax error on line {ex.lineno}: {ex.msg}; fix the code", "syntax") from None
    except (RecursionError, MemoryError, ValueError) as ex:  # deeply nested expressions, NUL bytes
        raise _reject(f"patch code cannot be parsed ({type(ex).__name__}); simplify it", "syntax") from None
    nodes = sum(1 for _ in ast.walk(tree))
    if nodes > MAX_AST_NODES:
        raise _reject(f"patch code has {nodes:,} syntax nodes; keep it under {MAX_AST_NODES:,}", "too-long")
    depth = _depth(tree)
    if depth > MAX_AST_DEPTH:
        raise _reject(f"patch code nests {depth} levels deep; keep it under {MAX_AST_DEPTH}", "too-deep")
    return tree


def _depth(tree: ast.AST) -> int:
    """Nesting depth, computed without recursion (the checker and compile() recurse; deep trees crash them)."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        stack.extend((child, d + 1) for child in ast.iter_child_nodes(node))
    return deepest


class _Normalizer(ast.NodeTransformer):
    """Drops annotations and the imports that are allowed (``import numpy as np``, ``from math import pi``).

    Annotations are dropped rather than checked because they would be evaluated
    at definition time; allowed imports become names bound in the namespace.
    """

    def __init__(self) -> None:
        self.bindings: dict[str, tuple[str, str | None]] = {}  # name -> (module, attribute or None)

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.returns = None
        self.generic_visit(node)
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        if node.value is None:
            return ast.copy_location(ast.Pass(), node)
        return ast.copy_location(ast.Assign(targets=[node.target], value=self.visit(node.value)), node)

    def visit_Import(self, node: ast.Import) -> ast.AST:
        for alias in node.names:
            if alias.name not in ("numpy", "math"):
                raise _reject(f"import of '{alias.name}' is not allowed; only numpy (as np) and math", "no-imports")
            self.bindings[alias.asname or alias.name] = (alias.name, None)
        return ast.copy_location(ast.Pass(), node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST:
        module = node.module or ""
        if node.level or module not in ("numpy", "math"):
            raise _reject(f"import from '{module or '.'}' is not allowed; only numpy (as np) and math", "no-imports")
        allowed = ALLOWED_NUMPY if module == "numpy" else ALLOWED_MATH
        for alias in node.names:
            if alias.name not in allowed:
                rule = f"{'numpy' if module == 'numpy' else 'math'}-not-allowed:{alias.name}"
                raise _reject(f"'{module}.{alias.name}' is not on the sandbox allow-list", rule)
            self.bindings[alias.asname or alias.name] = (module, alias.name)
        return ast.copy_location(ast.Pass(), node)


def _bound_names(tree: ast.AST) -> set[str]:
    """Every name the code binds anywhere (assignments, loop targets, parameters, functions, handlers)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.ExceptHandler)) and node.name:
            names.add(node.name)
    return names


# --------------------------------------------------------------------------- the checker


def _is_dunder(name: str) -> bool:
    return name.startswith("__") or name.endswith("__")


class _Checker(ast.NodeVisitor):
    """Refuses every node, name and attribute that is not on an allow-list."""

    def __init__(self, known: set[str]) -> None:
        self.known = known

    def generic_visit(self, node: ast.AST) -> None:
        if not isinstance(node, _ALLOWED_NODES):
            rule = _NODE_RULES.get(type(node), f"syntax-not-allowed:{type(node).__name__}")
            raise _reject(f"{type(node).__name__} is not allowed in patch code (line {_line(node)})", rule)
        super().generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        name = node.id
        if _is_dunder(name):
            raise _reject(f"dunder name '{name}' is not allowed (line {_line(node)})", "no-dunder")
        if name in FORBIDDEN_NAMES:
            raise _reject(f"'{name}' is not allowed in patch code (line {_line(node)})", f"forbidden-name:{name}")
        if isinstance(node.ctx, ast.Load) and name not in self.known:
            raise _reject(
                f"unknown name '{name}' (line {_line(node)}); patch code sees only its parameters, its own "
                "names, np, math and a few builtins",
                f"unknown-name:{name}",
            )
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        attr = node.attr
        if _is_dunder(attr) or attr.startswith("_"):
            rule = "no-dunder" if _is_dunder(attr) else "no-private"
            raise _reject(f"attribute '{attr}' is not allowed (line {_line(node)})", rule)
        self.generic_visit(node)  # inner first, so np.random.rand names np.random
        if not isinstance(node.ctx, ast.Load):
            raise _reject(
                f"assigning to attribute '{attr}' is not allowed (line {_line(node)}); a function attribute "
                f"would keep state: {_STATELESS}",
                "no-attribute-assignment",
            )
        _check_attribute(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, (str, bytes)) and ("__" in str(node.value)):
            raise _reject(f"strings containing '__' are not allowed (line {_line(node)})", "no-dunder")

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if node.decorator_list:
            raise _reject(f"decorators are not allowed (line {_line(node)})", "no-decorators")
        self._check_bound_name(node.name, node)
        _check_defaults(node.args)
        self.generic_visit(node)

    def visit_arg(self, node: ast.arg) -> None:
        self._check_bound_name(node.arg, node)

    def _check_bound_name(self, name: str, node: ast.AST) -> None:
        if _is_dunder(name):
            raise _reject(f"dunder name '{name}' is not allowed (line {_line(node)})", "no-dunder")
        if name in FORBIDDEN_NAMES:
            raise _reject(f"'{name}' is not allowed in patch code (line {_line(node)})", f"forbidden-name:{name}")

    def visit_keyword(self, node: ast.keyword) -> None:
        if node.arg is not None and _is_dunder(node.arg):
            raise _reject(f"keyword '{node.arg}' is not allowed (line {_line(node)})", "no-dunder")
        self.generic_visit(node)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.type is None:
            raise _reject(f"bare 'except:' is not allowed; name the exception (line {_line(node)})", "bare-except")
        if node.name:
            self._check_bound_name(node.name, node)
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global | ast.Nonlocal) -> None:
        raise _reject(f"'global'/'nonlocal' is not allowed (line {_line(node)}): {_STATELESS}", "no-global")

    visit_Nonlocal = visit_Global

    def visit_Try(self, node: ast.Try) -> None:
        for jump in _jumps_in(node.finalbody):
            raise _reject(
                f"'{type(jump).__name__.lower()}' inside 'finally' is not allowed (line {_line(jump)}): "
                "it swallows exceptions, the CPU timer's included",
                "no-finally-jump",
            )
        self.generic_visit(node)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        _check_defaults(node.args)
        self.generic_visit(node)

    def visit_While(self, node: ast.While) -> None:
        if isinstance(node.test, ast.Constant) and node.test.value:
            raise _reject(
                f"'while True' loops are not allowed; loop over a range (line {_line(node)})", "no-while-true"
            )
        self.generic_visit(node)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        if node.is_async:
            raise _reject("async comprehensions are not allowed", "no-async")
        self.generic_visit(node)


def _check_attribute(node: ast.Attribute) -> None:
    base, attr = node.value, node.attr
    if isinstance(base, ast.Name) and base.id in _MODULE_NAMES:
        module = _MODULE_NAMES[base.id]
        allowed = ALLOWED_NUMPY if module == "numpy" else ALLOWED_MATH
        if attr not in allowed:
            raise _reject(
                f"'{base.id}.{attr}' is not on the sandbox allow-list (line {_line(node)})",
                f"{module}-not-allowed:{attr}",
            )
        return
    if (
        isinstance(base, ast.Attribute)
        and base.attr == "linalg"
        and isinstance(base.value, ast.Name)
        and base.value.id in ("np", "numpy")
    ):
        if attr not in _ALLOWED_LINALG:
            raise _reject(
                f"'np.linalg.{attr}' is not allowed; only np.linalg.norm (line {_line(node)})",
                f"numpy-not-allowed:linalg.{attr}",
            )
        return
    if attr not in ALLOWED_ATTRIBUTES:
        raise _reject(
            f"attribute '.{attr}' is not on the sandbox allow-list (line {_line(node)})",
            f"attribute-not-allowed:{attr}",
        )


def _line(node: ast.AST) -> int:
    return getattr(node, "lineno", 0)


# --------------------------------------------------------------------------- no state between calls

#: why patch code may not keep state; every refusal of that kind says it.
_STATELESS = "a reward is a function of the transition, so it may not keep state between calls"
_MUTABLE_DISPLAYS = (ast.List, ast.Set, ast.Dict, ast.ListComp, ast.SetComp, ast.DictComp)
#: methods that change a value in place (on the attribute allow-list for local lists).
_MUTATING_METHODS = frozenset({"append", "extend"})


def _jumps_in(body: list[ast.stmt]) -> list[ast.AST]:
    """``return``/``break``/``continue`` anywhere in ``body``, nested functions aside."""
    found: list[ast.AST] = []
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Return, ast.Break, ast.Continue)):
            found.append(node)
        if not isinstance(node, (ast.FunctionDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))
    return found


def _holds_mutable(node: ast.AST, displays: tuple[type, ...] = _MUTABLE_DISPLAYS, arrays: bool = True) -> bool:
    """Whether the expression builds a mutable container (one of ``displays``) or, with ``arrays``, an array."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, displays):
            return True
        if isinstance(n, ast.Call) and _is_array_call(n.func) and not _is_scalar_call(n):
            if arrays:
                return True
            continue  # a module-level array literal: made read-only at compile time
        stack.extend(ast.iter_child_nodes(n))
    return False


def _is_scalar_call(node: ast.Call) -> bool:
    return isinstance(node.func, ast.Name) or (
        isinstance(node.func, ast.Attribute) and node.func.attr.startswith("float")
    )


def _check_defaults(args: ast.arguments) -> None:
    for default in [*args.defaults, *(d for d in args.kw_defaults if d is not None)]:
        if _holds_mutable(default):
            raise _reject(
                f"mutable default argument (line {_line(default)}); use a tuple or a number: {_STATELESS}",
                "mutable-state",
            )


def _check_no_state(tree: ast.Module) -> None:
    """Refuse module-level lists/sets and any write into a module-level value from a function."""
    module_names: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            if _holds_mutable(stmt.value, (ast.List, ast.Set, ast.ListComp, ast.SetComp), arrays=False):
                raise _reject(
                    f"module-level lists and sets are not allowed (line {_line(stmt)}); use a tuple: {_STATELESS}",
                    "mutable-state",
                )
            module_names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
    for fn in (s for s in tree.body if isinstance(s, ast.FunctionDef)):
        local = _bound_names(fn)
        for node in ast.walk(fn):
            root = _written_root(node)
            if root is not None and root in module_names and root not in local:
                raise _reject(
                    f"'{root}' is a module-level value and may not be changed (line {_line(node)}): {_STATELESS}",
                    "mutable-state",
                )


def _written_root(node: ast.AST) -> str | None:
    """The name whose value ``node`` changes in place (``X[i] = ...``, ``X[i] += ...``, ``X.append(...)``)."""
    target: ast.AST | None = None
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)):
        target = node.value
    elif isinstance(node, ast.AugAssign) and not isinstance(node.target, ast.Name):
        target = node.target
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATING_METHODS:
        target = node.func.value
    while isinstance(target, (ast.Subscript, ast.Attribute)):
        target = target.value
    return target.id if isinstance(target, ast.Name) else None


def _read_only(value: Any) -> Any:
    """A module-level constant made read-only: dicts as mapping proxies, arrays with ``write=False``."""
    if isinstance(value, np.ndarray):
        value.setflags(write=False)
        return value
    if isinstance(value, dict):
        return MappingProxyType({k: _read_only(v) for k, v in value.items()})
    if isinstance(value, tuple):
        return tuple(_read_only(v) for v in value)
    return value


# --------------------------------------------------------------------------- module level: definitions only


def _check_top_level(tree: ast.Module) -> None:
    """Module-level code may only define functions and literal constants (it runs in the caller)."""
    numeric: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef):
            for default in [*stmt.args.defaults, *(d for d in stmt.args.kw_defaults if d is not None)]:
                if not _is_literal(default, numeric):
                    raise _reject(f"default values must be literals (line {_line(default)})", "non-literal-default")
        elif isinstance(stmt, ast.Assign):
            if not all(isinstance(t, ast.Name) for t in stmt.targets) or not _is_literal(stmt.value, numeric):
                raise _reject(
                    f"module-level assignments must be literal constants (line {_line(stmt)}); compute inside the function",
                    "top-level-code",
                )
            if _is_number(stmt.value, numeric):
                numeric.update(t.id for t in stmt.targets)  # type: ignore[attr-defined]
        elif isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            continue
        elif not isinstance(stmt, (ast.Import, ast.ImportFrom)):
            raise _reject(
                f"only function definitions, numpy/math imports and constants may appear at module level (line {_line(stmt)})",
                "top-level-code",
            )


def _is_number(node: ast.AST, numeric: set[str]) -> bool:
    """A small numeric expression: numbers, known numeric constants, + - * / // % and tiny powers."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float, complex)) and not isinstance(node.value, bool)
    if isinstance(node, ast.Name):
        return node.id in numeric
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _is_number(node.operand, numeric)
    if isinstance(node, ast.BinOp) and isinstance(
        node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod)
    ):
        return _is_number(node.left, numeric) and _is_number(node.right, numeric)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        # only constant ** small constant: nested powers are how 10**10**10 hangs the caller
        left, right = node.left, node.right
        return (
            isinstance(left, ast.Constant)
            and _is_number(left, set())
            and isinstance(right, ast.Constant)
            and isinstance(right.value, int)
            and abs(right.value) <= 64
        )
    return False


def _is_literal(node: ast.AST, numeric: set[str]) -> bool:
    """A literal the caller can evaluate safely: numbers, strings, containers of literals, np.array([...])."""
    if _is_number(node, numeric):
        return True
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(_is_literal(e, numeric) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is not None and _is_literal(k, numeric) for k in node.keys) and all(
            _is_literal(v, numeric) for v in node.values
        )
    if isinstance(node, ast.Call) and not node.keywords and _is_array_call(node.func):
        return all(_is_literal(a, numeric) for a in node.args) and len(node.args) == 1
    return False


def _is_array_call(func: ast.AST) -> bool:
    if isinstance(func, ast.Name):
        return func.id == "float"
    return (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id in ("np", "numpy")
        and func.attr in ("array", "asarray", "float64", "float32")
    )


def _check_entry(tree: ast.Module, entry: str, params: tuple[str, ...]) -> None:
    defs = [s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == entry]
    if not defs:
        raise _reject(f"the code must define '{entry}({', '.join(params)})' at module level", "missing-entry")
    args = defs[-1].args
    positional = [*args.posonlyargs, *args.args]
    required = len(positional) - len(args.defaults)
    fits = (len(positional) >= len(params) or args.vararg is not None) and required <= len(params)
    kw_required = any(d is None for d in args.kw_defaults)
    if not fits or kw_required:
        have = ", ".join(a.arg for a in positional)
        raise _reject(f"'{entry}' takes ({have}); it must take ({', '.join(params)})", "bad-signature")


def _checked_tree(code: str, entry: str, params: tuple[str, ...]) -> tuple[ast.Module, dict]:
    tree = _parse(code)
    normalizer = _Normalizer()
    tree = normalizer.visit(tree)
    known = _bound_names(tree) | set(normalizer.bindings) | set(SAFE_BUILTINS) | {"np", "numpy", "math"}
    _Checker(known).visit(tree)  # first, so a forbidden name is reported as such wherever it sits
    _check_top_level(tree)
    _check_no_state(tree)
    _check_entry(tree, entry, params)
    return ast.fix_missing_locations(tree), normalizer.bindings


def check_code(code: str, entry: str = "shaped_reward", params: tuple[str, ...] = REWARD_PARAMS) -> None:
    """Statically check patch ``code``: raise :class:`PatchRejectedError` (with ``rule``) unless it is allowed.

    Rules: ``too-long``, ``too-deep``, ``syntax``, ``no-imports``, ``no-dunder``, ``no-private``,
    ``forbidden-name:<name>``, ``unknown-name:<name>``, ``numpy-not-allowed:<name>``,
    ``math-not-allowed:<name>``, ``attribute-not-allowed:<name>``, ``no-attribute-assignment``,
    ``no-classes``, ``no-global``, ``no-with``, ``no-async``, ``no-generators``, ``no-delete``,
    ``no-decorators``, ``bare-except``, ``no-while-true``, ``top-level-code``, ``non-literal-default``,
    ``missing-entry``, ``bad-signature``, ``mutable-state``, ``no-finally-jump``.
    """
    _checked_tree(code, entry, tuple(params))


# --------------------------------------------------------------------------- the namespace


def _norm(x: Any, ord: Any = None, axis: Any = None, keepdims: bool = False) -> Any:
    """``np.linalg.norm`` without the rest of ``np.linalg``."""
    return np.linalg.norm(x, ord=ord, axis=axis, keepdims=keepdims)


def _numpy_proxy() -> SimpleNamespace:
    names = {n: getattr(np, n) for n in ALLOWED_NUMPY if n != "linalg" and hasattr(np, n)}
    return SimpleNamespace(linalg=SimpleNamespace(norm=_norm), **names)


_NP = _numpy_proxy()
_MATH = SimpleNamespace(**{n: getattr(math, n) for n in ALLOWED_MATH})


def _namespace(bindings: dict[str, tuple[str, str | None]]) -> dict[str, Any]:
    ns: dict[str, Any] = {"__builtins__": dict(SAFE_BUILTINS), "np": _NP, "numpy": _NP, "math": _MATH}
    for name, (module, attr) in bindings.items():
        proxy = _NP if module == "numpy" else _MATH
        ns[name] = proxy if attr is None else getattr(proxy, attr)
    return ns


def _load(code: str, entry: str, params: tuple[str, ...]) -> Callable[..., Any]:
    tree, bindings = _checked_tree(code, entry, params)
    ns = _namespace(bindings)
    try:
        exec(compile(tree, "<patch>", "exec", dont_inherit=True), ns)
    except Exception as ex:
        raise _reject(f"patch code failed while being defined: {type(ex).__name__}: {ex}", "exec") from None
    for stmt in tree.body:  # aliases (``w = WEIGHTS; w["a"] = 1``) escape the static check; this does not
        for target in stmt.targets if isinstance(stmt, ast.Assign) else ():
            if isinstance(target, ast.Name):
                ns[target.id] = _read_only(ns[target.id])
    return ns[entry]


# --------------------------------------------------------------------------- the callables


def _frozen(x: Any, depth: int = 0) -> Any:
    """A read-only copy: arrays copied with ``write=False``, containers copied, scalars as they are."""
    if isinstance(x, np.ndarray):
        out = np.array(x, copy=True)
        out.setflags(write=False)
        return out
    if depth > 4:
        return None
    if isinstance(x, dict):
        return {k: _frozen(v, depth + 1) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return tuple(_frozen(v, depth + 1) for v in x)
    return x


def _code_error(entry: str, ex: BaseException, reason: str = "exception") -> SandboxError:
    text = " ".join(str(ex).split())
    text = text if len(text) <= 300 else text[:300] + "..."  # the code chooses the message; keep it one short line
    err = SandboxError(f"{entry} raised {type(ex).__name__}: {text}")
    err.reason = reason  # type: ignore[attr-defined]
    return err


def _value_error(message: str, reason: str) -> SandboxError:
    err = SandboxError(message)
    err.reason = reason  # type: ignore[attr-defined]
    return err


def _to_float(value: Any, entry: str) -> float:
    numeric = isinstance(value, (bool, int, float, np.bool_, np.number)) or (
        isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "biuf"
    )
    if not numeric:
        shape = f" of shape {value.shape}" if isinstance(value, np.ndarray) else ""
        raise _value_error(f"{entry} returned {type(value).__name__}{shape}; it must return one float", "non-numeric")
    try:
        out = float(value)
    except (OverflowError, ValueError, TypeError) as ex:
        raise _value_error(f"{entry} returned a number that is not a float ({ex})", "non-numeric") from None
    if not math.isfinite(out):
        raise _value_error(f"{entry} returned {out}; clip its inputs and guard divisions with an epsilon", "non-finite")
    return out


class SandboxedReward:
    """A checked ``shaped_reward``; call it like the contract says, get a finite float or a SandboxError.

    Pickles as its source code, so another process re-checks and re-compiles it.
    """

    def __init__(self, code: str, entry: str = "shaped_reward") -> None:
        self.code, self.entry = code, entry
        self._fn = _load(code, entry, REWARD_PARAMS)

    def __reduce__(self) -> tuple:
        return (SandboxedReward, (self.code, self.entry))

    def __call__(
        self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any, info: Any
    ) -> float:
        args = (
            _frozen(obs),
            _frozen(action),
            float(reward),
            _frozen(next_obs),
            bool(terminated),
            bool(truncated),
            _frozen(info) if isinstance(info, dict) else {},
        )
        with np.errstate(all="ignore"):
            try:
                value = self._fn(*args)
            except MemoryError:
                raise  # the worker reports it as a memory-limit breach
            except Exception as ex:
                raise _code_error(self.entry, ex) from None
        return _to_float(value, self.entry)


class SandboxedPredicate:
    """A checked safety predicate over ``(obs, action, info)``; returns a bool or raises SandboxError."""

    def __init__(self, expr: str, names: tuple[str, ...] = PREDICATE_PARAMS) -> None:
        self.expr, self.names = expr, tuple(names)
        self._fn = _load(_predicate_source(expr, self.names), "safety_predicate", self.names)

    def __reduce__(self) -> tuple:
        return (SandboxedPredicate, (self.expr, self.names))

    def __call__(self, *args: Any) -> bool:
        frozen = tuple(_frozen(a) for a in args)
        with np.errstate(all="ignore"):
            try:
                value = self._fn(*frozen)
                if isinstance(value, np.ndarray) and value.size != 1:
                    raise ValueError(f"predicate gave an array of shape {value.shape}, not one truth value")
                return bool(value)
            except MemoryError:
                raise
            except Exception as ex:
                raise _code_error("safety predicate", ex) from None


def _predicate_source(expr: str, names: tuple[str, ...]) -> str:
    if not isinstance(expr, str) or len(expr) > MAX_CODE_CHARS:
        raise _reject("a safety predicate must be one expression of reasonable length", "too-long")
    try:
        parsed = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as ex:
        raise _reject(f"safety predicate is not one Python expression: {ex.msg}", "syntax") from None
    except (RecursionError, MemoryError, ValueError) as ex:
        raise _reject(f"safety predicate cannot be parsed ({type(ex).__name__})", "syntax") from None
    if _depth(parsed) > MAX_AST_DEPTH:
        raise _reject(f"safety predicate nests deeper than {MAX_AST_DEPTH} levels; simplify it", "too-deep")
    # re-emitted from the AST, so nothing in the text can escape the one return statement
    return f"def safety_predicate({', '.join(names)}):\n    return ({ast.unparse(parsed.body)})\n"


def compile_reward(code: str, entry: str = "shaped_reward") -> SandboxedReward:
    """Check ``code`` and compile its ``entry`` into a :class:`SandboxedReward` (PatchRejectedError if refused)."""
    return SandboxedReward(code, entry)


def compile_predicate(expr: str, names: tuple[str, ...] = PREDICATE_PARAMS) -> SandboxedPredicate:
    """Check a one-expression safety predicate over ``names`` and compile it (PatchRejectedError if refused)."""
    return SandboxedPredicate(expr, tuple(names))
