"""Declared safety constraints of a run, and a minimal safe evaluator for them.

A constraint is a one-line Python expression over ``obs`` and ``action`` (and
``info``) that is TRUE WHEN VIOLATED, the same sense as the ``safety_constraint``
patch's predicate: ``abs(obs[0]) > 0.4`` means "the lander left the x-band".
Expressions come from user files, so they are checked against a small AST
allow-list (arithmetic, comparisons, subscripts, a few functions, ``np.<name>``
for an allow-listed set) before being compiled with no builtins.
"""

from __future__ import annotations

import ast
import math
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..errors import ValidationError

__all__ = ["Constraint", "check_expression", "compile_constraint", "ALLOWED_NP"]

#: numpy functions/constants a constraint may use as ``np.<name>``.
ALLOWED_NP: frozenset[str] = frozenset(
    {
        "abs",
        "sqrt",
        "square",
        "hypot",
        "sum",
        "max",
        "min",
        "mean",
        "any",
        "all",
        "clip",
        "isfinite",
        "isnan",
        "pi",
        "arctan2",
        "sin",
        "cos",
        "tan",
        "maximum",
        "minimum",
        "exp",
        "log",
        "sign",
    }
)
_NAMES = frozenset({"obs", "action", "info", "np", "abs", "min", "max", "True", "False", "None"})
_NODES = (
    ast.Expression,
    ast.BoolOp,
    ast.And,
    ast.Or,
    ast.BinOp,
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.Div,
    ast.FloorDiv,
    ast.Mod,
    ast.Pow,
    ast.UnaryOp,
    ast.USub,
    ast.UAdd,
    ast.Not,
    ast.Compare,
    ast.Eq,
    ast.NotEq,
    ast.Lt,
    ast.LtE,
    ast.Gt,
    ast.GtE,
    ast.Constant,
    ast.Name,
    ast.Load,
    ast.Subscript,
    ast.Slice,
    ast.Tuple,
    ast.Call,
    ast.Attribute,
    ast.IfExp,
)
_MAX_LEN = 500
#: largest exponent of a power (one level only, see ``_check_power``)
MAX_EXPONENT = 8
#: largest integer constant; with one level of powers this bounds every integer a constraint can build
MAX_CONSTANT = 10**15


def check_expression(expr: str) -> ast.Expression:
    """Parse ``expr`` and refuse anything outside the allow-list; returns the checked tree."""
    if len(expr) > _MAX_LEN:
        raise ValidationError(f"constraint expression longer than {_MAX_LEN} characters; simplify it")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as ex:
        raise ValidationError(f"constraint expression '{expr}' is not valid Python: {ex.msg}") from ex
    for node in ast.walk(tree):
        _check_node(node, expr)
    return tree


def _check_node(node: ast.AST, expr: str) -> None:
    if not isinstance(node, _NODES):
        raise ValidationError(f"constraint '{expr}' uses {type(node).__name__}, which is not allowed")
    if isinstance(node, ast.Name) and node.id not in _NAMES:
        raise ValidationError(
            f"constraint '{expr}' uses the name '{node.id}'; only obs, action, info, np, abs, min, max"
        )
    if isinstance(node, ast.Attribute) and not (
        isinstance(node.value, ast.Name) and node.value.id == "np" and node.attr in ALLOWED_NP
    ):
        raise ValidationError(
            f"constraint '{expr}' uses attribute '{node.attr}'; only np.<{', '.join(sorted(ALLOWED_NP))}>"
        )
    if isinstance(node, ast.Call) and not isinstance(node.func, (ast.Name, ast.Attribute)):
        raise ValidationError(f"constraint '{expr}' calls something that is not an allowed function")
    if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, bool, str, type(None))):
        raise ValidationError(f"constraint '{expr}' has a constant of type {type(node.value).__name__}")
    if isinstance(node, ast.Constant) and type(node.value) is int and abs(node.value) > MAX_CONSTANT:
        raise ValidationError(f"constraint '{expr}' has an integer constant above {MAX_CONSTANT:,}; use a float (1e15)")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        _check_power(node, expr)
    if isinstance(node, ast.BinOp):
        _check_no_sequence(node.left, expr)
        _check_no_sequence(node.right, expr)


def _check_power(node: ast.BinOp, expr: str) -> None:
    """A power is a small constant exponent over a base without powers.

    Python integers have no size limit and ``int ** int`` holds the GIL until it is done, so
    nested powers (``((10**8)**8)**8...``) hang the process that evaluates them; with one level
    and integers bounded by :data:`MAX_CONSTANT`, a value stays within a few thousand digits.
    """
    exponent = node.right
    if isinstance(exponent, ast.UnaryOp) and isinstance(exponent.op, (ast.USub, ast.UAdd)):
        exponent = exponent.operand  # x ** -2
    if not (
        isinstance(exponent, ast.Constant)
        and isinstance(exponent.value, (int, float))
        and abs(exponent.value) <= MAX_EXPONENT
    ):
        raise ValidationError(f"constraint '{expr}' may only raise to a constant power of at most {MAX_EXPONENT}")
    if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow) for n in ast.walk(node.left)):
        raise ValidationError(f"constraint '{expr}' nests powers (a power of a power); write the product out")


def _check_no_sequence(operand: ast.AST, expr: str) -> None:
    """Arithmetic on a tuple or a string (``(0,) * 10**9``, ``'a' * 10**9``) can allocate without bound."""
    for n in ast.walk(operand):
        sequence = isinstance(n, ast.Tuple) or (isinstance(n, ast.Constant) and isinstance(n.value, str))
        # obs[0, 1] and info['key'] read a number: a tuple or string inside an index is fine
        if sequence and not _is_index(operand, n):
            raise ValidationError(f"constraint '{expr}' does arithmetic on a tuple or a string; use numbers")


def _is_index(root: ast.AST, target: ast.AST) -> bool:
    """True when ``target`` sits inside the index of a subscript below ``root``."""
    return any(isinstance(n, ast.Subscript) and any(m is target for m in ast.walk(n.slice)) for n in ast.walk(root))


class _NpFacade:
    """The only ``np`` a constraint sees: allow-listed names, nothing else."""

    def __init__(self) -> None:
        for name in ALLOWED_NP:
            setattr(self, name, getattr(np, name))


_NP = _NpFacade()


def compile_constraint(expr: str):
    """A function ``(obs, action, info) -> bool`` (True = violated) for a checked expression."""
    code = compile(check_expression(expr), "<constraint>", "eval")
    env_base = {"__builtins__": {}, "np": _NP, "abs": abs, "min": min, "max": max}

    def violated(obs: Any, action: Any, info: dict | None = None) -> bool:
        scope = dict(env_base, obs=np.asarray(obs), action=np.asarray(action), info=info or {})
        try:
            value = eval(code, scope)
        except (ArithmeticError, IndexError, KeyError, TypeError, ValueError) as ex:
            raise ValidationError(f"constraint '{expr}' failed to evaluate: {type(ex).__name__}: {ex}") from ex
        return bool(np.any(value)) if not isinstance(value, float) or not math.isnan(value) else False

    return violated


class Constraint(BaseModel):
    """A named safety constraint: ``expr`` over obs/action/info, TRUE WHEN VIOLATED."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(..., min_length=1, max_length=100)
    expr: str = Field(..., max_length=_MAX_LEN)
    description: str = Field("", max_length=2000)

    @field_validator("expr")
    @classmethod
    def _safe(cls, v: str) -> str:
        try:
            check_expression(v)
        except ValidationError as ex:
            raise ValueError(str(ex)) from None
        return v

    def compile(self):
        """The violation test ``(obs, action, info) -> bool``."""
        return compile_constraint(self.expr)
