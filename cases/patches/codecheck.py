"""The sandbox's static check: patch code walked against the allow-lists before anything runs.

:func:`check_code` parses the code, normalizes ``import``-free aliases of numpy and math, and refuses
anything outside :mod:`remedy.cases.patches.allowlist` with a :class:`PatchRejectedError` whose ``rule``
names what broke: module-level code may only define functions and literal constants, and a reward
may not keep state between calls. :mod:`remedy.cases.patches.sandbox` compiles what passes.
"""

from __future__ import annotations

import ast
from types import MappingProxyType
from typing import Any

import numpy as np

from ..errors import PatchRejectedError
from .allowlist import (
    ALLOWED_ATTRIBUTES,
    ALLOWED_LINALG,
    ALLOWED_MATH,
    ALLOWED_NODES,
    ALLOWED_NUMPY,
    FORBIDDEN_NAMES,
    MAX_AST_DEPTH,
    MAX_AST_NODES,
    MAX_CODE_CHARS,
    MODULE_NAMES,
    NODE_RULES,
    REWARD_PARAMS,
    SAFE_BUILTINS,
)

__all__ = ["ast_depth", "check_code", "checked_tree", "read_only", "reject"]


def reject(message: str, rule: str) -> PatchRejectedError:
    return PatchRejectedError(message, rule=rule)


# --------------------------------------------------------------------------- parsing and normalizing


def _parse(code: str) -> ast.Module:
    if not isinstance(code, str):
        raise reject(f"patch code must be text, got {type(code).__name__}", "syntax")
    if len(code) > MAX_CODE_CHARS:
        raise reject(f"patch code is {len(code):,} characters; keep it under {MAX_CODE_CHARS:,}", "too-long")
    try:
        tree = ast.parse(code, filename="<patch>", mode="exec")
    except SyntaxError as ex:
        raise reject(f"syntax error on line {ex.lineno}: {ex.msg}; fix the code", "syntax") from None
    except (RecursionError, MemoryError, ValueError) as ex:  # deeply nested expressions, NUL bytes
        raise reject(f"patch code cannot be parsed ({type(ex).__name__}); simplify it", "syntax") from None
    nodes = sum(1 for _ in ast.walk(tree))
    if nodes > MAX_AST_NODES:
        raise reject(f"patch code has {nodes:,} syntax nodes; keep it under {MAX_AST_NODES:,}", "too-long")
    depth = ast_depth(tree)
    if depth > MAX_AST_DEPTH:
        raise reject(f"patch code nests {depth} levels deep; keep it under {MAX_AST_DEPTH}", "too-deep")
    return tree


def ast_depth(tree: ast.AST) -> int:
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
                raise reject(f"import of '{alias.name}' is not allowed; only numpy (as np) and math", "no-imports")
            self.bindings[alias.asname or alias.name] = (alias.name, None)
        return ast.copy_location(ast.Pass(), node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST:
        module = node.module or ""
        if node.level or module not in ("numpy", "math"):
            raise reject(f"import from '{module or '.'}' is not allowed; only numpy (as np) and math", "no-imports")
        allowed = ALLOWED_NUMPY if module == "numpy" else ALLOWED_MATH
        for alias in node.names:
            if alias.name not in allowed:
                rule = f"{'numpy' if module == 'numpy' else 'math'}-not-allowed:{alias.name}"
                raise reject(f"'{module}.{alias.name}' is not on the sandbox allow-list", rule)
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
        if not isinstance(node, ALLOWED_NODES):
            rule = NODE_RULES.get(type(node), f"syntax-not-allowed:{type(node).__name__}")
            raise reject(f"{type(node).__name__} is not allowed in patch code (line {_line(node)})", rule)
        super().generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        name = node.id
        if _is_dunder(name):
            raise reject(f"dunder name '{name}' is not allowed (line {_line(node)})", "no-dunder")
        if name in FORBIDDEN_NAMES:
            raise reject(f"'{name}' is not allowed in patch code (line {_line(node)})", f"forbidden-name:{name}")
        if isinstance(node.ctx, ast.Load) and name not in self.known:
            raise reject(
                f"unknown name '{name}' (line {_line(node)}); patch code sees only its parameters, its own "
                "names, np, math and a few builtins",
                f"unknown-name:{name}",
            )
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        attr = node.attr
        if _is_dunder(attr) or attr.startswith("_"):
            rule = "no-dunder" if _is_dunder(attr) else "no-private"
            raise reject(f"attribute '{attr}' is not allowed (line {_line(node)})", rule)
        self.generic_visit(node)  # inner first, so np.random.rand names np.random
        if not isinstance(node.ctx, ast.Load):
            raise reject(
                f"assigning to attribute '{attr}' is not allowed (line {_line(node)}); a function attribute "
                f"would keep state: {_STATELESS}",
                "no-attribute-assignment",
            )
        _check_attribute(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, (str, bytes)) and ("__" in str(node.value)):
            raise reject(f"strings containing '__' are not allowed (line {_line(node)})", "no-dunder")

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if node.decorator_list:
            raise reject(f"decorators are not allowed (line {_line(node)})", "no-decorators")
        self._check_bound_name(node.name, node)
        _check_defaults(node.args)
        self.generic_visit(node)

    def visit_arg(self, node: ast.arg) -> None:
        self._check_bound_name(node.arg, node)

    def _check_bound_name(self, name: str, node: ast.AST) -> None:
        if _is_dunder(name):
            raise reject(f"dunder name '{name}' is not allowed (line {_line(node)})", "no-dunder")
        if name in FORBIDDEN_NAMES:
            raise reject(f"'{name}' is not allowed in patch code (line {_line(node)})", f"forbidden-name:{name}")

    def visit_keyword(self, node: ast.keyword) -> None:
        if node.arg is not None and _is_dunder(node.arg):
            raise reject(f"keyword '{node.arg}' is not allowed (line {_line(node)})", "no-dunder")
        self.generic_visit(node)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.type is None:
            raise reject(f"bare 'except:' is not allowed; name the exception (line {_line(node)})", "bare-except")
        if node.name:
            self._check_bound_name(node.name, node)
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global | ast.Nonlocal) -> None:
        raise reject(f"'global'/'nonlocal' is not allowed (line {_line(node)}): {_STATELESS}", "no-global")

    visit_Nonlocal = visit_Global

    def visit_Try(self, node: ast.Try) -> None:
        for jump in _jumps_in(node.finalbody):
            raise reject(
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
            raise reject(f"'while True' loops are not allowed; loop over a range (line {_line(node)})", "no-while-true")
        self.generic_visit(node)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        if node.is_async:
            raise reject("async comprehensions are not allowed", "no-async")
        self.generic_visit(node)


def _check_attribute(node: ast.Attribute) -> None:
    base, attr = node.value, node.attr
    if isinstance(base, ast.Name) and base.id in MODULE_NAMES:
        module = MODULE_NAMES[base.id]
        allowed = ALLOWED_NUMPY if module == "numpy" else ALLOWED_MATH
        if attr not in allowed:
            raise reject(
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
        if attr not in ALLOWED_LINALG:
            raise reject(
                f"'np.linalg.{attr}' is not allowed; only np.linalg.norm (line {_line(node)})",
                f"numpy-not-allowed:linalg.{attr}",
            )
        return
    if attr not in ALLOWED_ATTRIBUTES:
        raise reject(
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
            raise reject(
                f"mutable default argument (line {_line(default)}); use a tuple or a number: {_STATELESS}",
                "mutable-state",
            )


def _check_no_state(tree: ast.Module) -> None:
    """Refuse module-level lists/sets and any write into a module-level value from a function."""
    module_names: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            if _holds_mutable(stmt.value, (ast.List, ast.Set, ast.ListComp, ast.SetComp), arrays=False):
                raise reject(
                    f"module-level lists and sets are not allowed (line {_line(stmt)}); use a tuple: {_STATELESS}",
                    "mutable-state",
                )
            module_names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
    for fn in (s for s in tree.body if isinstance(s, ast.FunctionDef)):
        local = _bound_names(fn)
        for node in ast.walk(fn):
            root = _written_root(node)
            if root is not None and root in module_names and root not in local:
                raise reject(
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


def read_only(value: Any) -> Any:
    """A module-level constant made read-only: dicts as mapping proxies, arrays with ``write=False``."""
    if isinstance(value, np.ndarray):
        value.setflags(write=False)
        return value
    if isinstance(value, dict):
        return MappingProxyType({k: read_only(v) for k, v in value.items()})
    if isinstance(value, tuple):
        return tuple(read_only(v) for v in value)
    return value


# --------------------------------------------------------------------------- module level: definitions only


def _check_top_level(tree: ast.Module) -> None:
    """Module-level code may only define functions and literal constants (it runs in the caller)."""
    numeric: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef):
            for default in [*stmt.args.defaults, *(d for d in stmt.args.kw_defaults if d is not None)]:
                if not _is_literal(default, numeric):
                    raise reject(f"default values must be literals (line {_line(default)})", "non-literal-default")
        elif isinstance(stmt, ast.Assign):
            if not all(isinstance(t, ast.Name) for t in stmt.targets) or not _is_literal(stmt.value, numeric):
                raise reject(
                    f"module-level assignments must be literal constants (line {_line(stmt)}); compute inside the function",
                    "top-level-code",
                )
            if _is_number(stmt.value, numeric):
                numeric.update(t.id for t in stmt.targets)  # type: ignore[attr-defined]
        elif isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            continue
        elif not isinstance(stmt, (ast.Import, ast.ImportFrom)):
            raise reject(
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
        raise reject(f"the code must define '{entry}({', '.join(params)})' at module level", "missing-entry")
    args = defs[-1].args
    positional = [*args.posonlyargs, *args.args]
    required = len(positional) - len(args.defaults)
    fits = (len(positional) >= len(params) or args.vararg is not None) and required <= len(params)
    kw_required = any(d is None for d in args.kw_defaults)
    if not fits or kw_required:
        have = ", ".join(a.arg for a in positional)
        raise reject(f"'{entry}' takes ({have}); it must take ({', '.join(params)})", "bad-signature")


def checked_tree(code: str, entry: str, params: tuple[str, ...]) -> tuple[ast.Module, dict]:
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
    checked_tree(code, entry, tuple(params))
