"""The sandbox for untrusted patch code: a static allow-list, a safe compile, and a fuzz run.

Reward-shaping code and safety predicates are written by people and by
language models, so they are treated as hostile until shown otherwise:

1. :func:`check_code` (:mod:`.codecheck`) walks the AST against allow-lists (:mod:`.allowlist`) (syntax, names,
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
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..errors import SandboxError
from .allowlist import (
    ALLOWED_ATTRIBUTES,
    ALLOWED_MATH,
    ALLOWED_NUMPY,
    FORBIDDEN_NAMES,
    MAX_AST_DEPTH,
    MAX_AST_NODES,
    MAX_CODE_CHARS,
    PREDICATE_PARAMS,
    REWARD_PARAMS,
    SAFE_BUILTINS,
)
from .codecheck import ast_depth, check_code, checked_tree, read_only, reject
from .fuzz import FuzzReport, fuzz_predicate, fuzz_reward

# the allow-lists (.allowlist), the static check (.codecheck) and the fuzz run (.fuzz) are re-exported:
# this module is the sandbox's one entrance
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
    tree, bindings = checked_tree(code, entry, params)
    ns = _namespace(bindings)
    try:
        exec(compile(tree, "<patch>", "exec", dont_inherit=True), ns)
    except Exception as ex:
        raise reject(f"patch code failed while being defined: {type(ex).__name__}: {ex}", "exec") from None
    for stmt in tree.body:  # aliases (``w = WEIGHTS; w["a"] = 1``) escape the static check; this does not
        for target in stmt.targets if isinstance(stmt, ast.Assign) else ():
            if isinstance(target, ast.Name):
                ns[target.id] = read_only(ns[target.id])
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
        raise reject("a safety predicate must be one expression of reasonable length", "too-long")
    try:
        parsed = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as ex:
        raise reject(f"safety predicate is not one Python expression: {ex.msg}", "syntax") from None
    except (RecursionError, MemoryError, ValueError) as ex:
        raise reject(f"safety predicate cannot be parsed ({type(ex).__name__})", "syntax") from None
    if ast_depth(parsed) > MAX_AST_DEPTH:
        raise reject(f"safety predicate nests deeper than {MAX_AST_DEPTH} levels; simplify it", "too-deep")
    # re-emitted from the AST, so nothing in the text can escape the one return statement
    return f"def safety_predicate({', '.join(names)}):\n    return ({ast.unparse(parsed.body)})\n"


def compile_reward(code: str, entry: str = "shaped_reward") -> SandboxedReward:
    """Check ``code`` and compile its ``entry`` into a :class:`SandboxedReward` (PatchRejectedError if refused)."""
    return SandboxedReward(code, entry)


def compile_predicate(expr: str, names: tuple[str, ...] = PREDICATE_PARAMS) -> SandboxedPredicate:
    """Check a one-expression safety predicate over ``names`` and compile it (PatchRejectedError if refused)."""
    return SandboxedPredicate(expr, tuple(names))
