"""Fuzzing untrusted patch functions before any training uses them.

:func:`fuzz_reward` and :func:`fuzz_predicate` call a compiled reward or safety
predicate (see :mod:`remedy.cases.patches.sandbox`) on zeros, negatives, huge values,
NaN/inf where the space allows them, and random samples of the env's spaces --
the "``1 / distance`` divides by zero at the goal" trap lives in those inputs --
each with an ``info`` dict that varies from call to call: empty, the keys real
envs and wrappers put there (Monitor's ``episode``, ``TimeLimit.truncated``,
``is_success``, MuJoCo's ``x_velocity``, Atari's ``lives``, a cost), numpy
scalars, extreme values and odd types (None, strings, nested dicts, lists).
The run happens inside a limited worker process (:mod:`remedy.cases.patches.worker`),
each call under a CPU timer, so an endless loop or a memory bomb costs a
bounded amount of time and never the caller. A call that keeps running after
its timer fired (code that swallowed the timeout) ends the worker at once, so
the timer cannot be defeated.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import gymnasium.spaces as S
import numpy as np

from ..errors import PatchRejectedError, SandboxError
from .worker import Limits, run_limited

__all__ = [
    "FuzzReport",
    "fuzz_reward",
    "fuzz_predicate",
    "fuzz_infos",
    "FUZZ_EXTREMES",
    "FUZZ_NONFINITE",
    "DEFAULT_FUZZ_CALLS",
]

#: finite extremes every fuzz run tries (zeros, signs, huge values: the 1/distance trap lives here).
FUZZ_EXTREMES = (0.0, 1.0, -1.0, 1e6, -1e6, 1e30, -1e30)
#: what a broken simulator can hand over in a float Box.
FUZZ_NONFINITE = (math.nan, math.inf, -math.inf)
_FUZZ_REWARDS = (0.0, -1.0, 1.0, 1e6, -1e6)
_MAX_PROBLEMS = 5
#: how many calls a default fuzz run makes: thousands, so code that misbehaves only now and then shows up.
DEFAULT_FUZZ_CALLS = 3000
#: timer firings (each a quarter of the per-call budget) a call may survive after the first one raised.
_SWALLOW_GRACE = 4
#: what an escalated timer writes before ending the worker; :func:`_fuzz` turns it back into a problem.
_SWALLOWED_MARK = "remedy-fuzz-swallowed-timeout"
_SWALLOWED_EXIT = 75


@dataclass(frozen=True)
class FuzzReport:
    """What a fuzz run saw: calls made, the slowest call (CPU ms), and problems as ``"kind: detail"``."""

    calls: int
    max_call_ms: float
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the fuzz run found nothing wrong."""
        return not self.problems


@dataclass(frozen=True)
class _Case:
    label: str
    obs: Any
    action: Any
    reward: float
    next_obs: Any
    terminated: bool = False
    truncated: bool = False
    info: dict = field(default_factory=dict)

    @property
    def finite(self) -> bool:
        """True when every number handed to the code is finite (then the result must be too)."""
        return all(_all_finite(x) for x in (self.obs, self.action, self.reward, self.next_obs, self.info))


def _all_finite(x: Any) -> bool:
    if x is None or isinstance(x, (str, bytes)):
        return True
    if isinstance(x, dict):
        return all(_all_finite(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return all(_all_finite(v) for v in x)
    try:
        return bool(np.all(np.isfinite(np.asarray(x, dtype=np.float64))))
    except (TypeError, ValueError):
        return True


class _CallTimeout(BaseException):
    """Raised by the CPU timer inside a call; a BaseException so patch code's ``except Exception`` misses it."""


def fuzz_reward(
    fn: Callable[..., float],
    observation_space: Any,
    action_space: Any,
    *,
    n_random: int = DEFAULT_FUZZ_CALLS,
    seed: int = 0,
    max_call_ms: float = 5.0,
    timeout_s: float = 60.0,
    memory_mb: int = 2048,
    isolate: bool = True,
) -> FuzzReport:
    """Call ``fn`` on extreme and random inputs; return the report, or raise PatchRejectedError(``fuzz:<kind>``).

    Finite inputs must give a finite float; no input may raise (a NaN result
    from NaN inputs is tolerated); each call must take under ``max_call_ms`` of
    CPU time. With ``isolate`` (the default) the whole run happens in a worker
    process under ``timeout_s`` (the bound on the whole run) and ``memory_mb``, so
    hangs and memory bombs are contained; each call also runs under a CPU timer
    that cannot be swallowed there; ``fn`` must then be picklable (a :class:`SandboxedReward` is).
    The rejection carries the report as ``err.report``.
    """
    report = _fuzz(
        fn, "reward", observation_space, action_space, n_random, seed, max_call_ms, timeout_s, memory_mb, isolate
    )
    return _verdict(report, "shaped_reward")


def fuzz_predicate(
    pred: Callable[..., bool],
    observation_space: Any,
    action_space: Any,
    *,
    n_random: int = DEFAULT_FUZZ_CALLS // 2,
    seed: int = 0,
    max_call_ms: float = 5.0,
    timeout_s: float = 60.0,
    memory_mb: int = 2048,
    isolate: bool = True,
) -> FuzzReport:
    """Like :func:`fuzz_reward` for a safety predicate over ``(obs, action, info)``: it must give a bool."""
    report = _fuzz(
        pred, "predicate", observation_space, action_space, n_random, seed, max_call_ms, timeout_s, memory_mb, isolate
    )
    return _verdict(report, "safety predicate")


def _fuzz(fn, kind, obs_space, act_space, n_random, seed, max_call_ms, timeout_s, memory_mb, isolate) -> FuzzReport:
    args = (fn, kind, obs_space, act_space, int(n_random), int(seed), float(max_call_ms))
    if not isolate:
        return _fuzz_calls(*args)
    limits = Limits(cpu_s=timeout_s, memory_mb=memory_mb, wall_s=timeout_s)
    try:
        return run_limited(_fuzz_calls, *args, escalate=True, limits=limits)
    except SandboxError as ex:
        return FuzzReport(calls=0, max_call_ms=0.0, problems=[_worker_problem(ex)])


def _worker_problem(ex: SandboxError) -> str:
    """One problem line for a fuzz worker that ended without a report."""
    text = str(ex)
    if _SWALLOWED_MARK in text:
        where = text.split(_SWALLOWED_MARK, 1)[1].split(_SWALLOWED_MARK, 1)[0].strip(" :")
        return (
            f"timeout: a call kept running after its CPU timer fired on {where} (the code swallows the "
            "timeout, e.g. return/break/continue in a finally block)"
        )
    reason = getattr(ex, "reason", "crash")
    kind = {"cpu": "timeout", "signal": "crash", "died": "crash", "protocol": "crash"}.get(reason, reason)
    return f"{kind}: the fuzz worker {ex}"


def _verdict(report: FuzzReport, what: str) -> FuzzReport:
    if report.ok:
        return report
    kind = report.problems[0].split(":", 1)[0].strip()
    shown = "; ".join(report.problems[:3])
    err = PatchRejectedError(
        f"{what} failed the fuzz test ({shown}); clip inputs, guard divisions with an epsilon, read info with .get()",
        rule=f"fuzz:{kind}",
    )
    err.report = report  # type: ignore[attr-defined]
    raise err


def _fuzz_calls(fn, kind, obs_space, act_space, n_random, seed, max_call_ms, escalate: bool = False) -> FuzzReport:
    """Run the fuzz cases in this process (the worker's side of :func:`fuzz_reward`).

    ``escalate`` (set only inside a worker) lets a swallowed timer end the process.
    """
    budget_s = max(0.25, 50 * max_call_ms / 1000)  # a call past this is stopped: a loop, not slowness
    problems: list[str] = []
    calls, slowest = 0, 0.0
    for case in _fuzz_cases(obs_space, act_space, n_random, seed):
        args = _call_args(case, kind)
        calls += 1
        timer = _CallTimer(budget_s, case.label, escalate)
        outcome, ms = timer.call(fn, args)
        if outcome is None and ms > max_call_ms:  # a hiccup, or really slow?
            ms = min([ms] + [_CallTimer(budget_s, case.label, escalate).call(fn, args)[1] for _ in range(2)])
        slowest = max(slowest, ms)
        problem = _judge(outcome, ms, case, kind, max_call_ms, budget_s)
        if problem:
            problems.append(problem)
        if len(problems) >= _MAX_PROBLEMS or (problem and problem.startswith(("slow", "timeout"))):
            break
    return FuzzReport(calls=calls, max_call_ms=round(slowest, 3), problems=problems)


def _call_args(case: _Case, kind: str) -> tuple:
    if kind == "predicate":
        return (case.obs, case.action, case.info)
    return (case.obs, case.action, case.reward, case.next_obs, case.terminated, case.truncated, case.info)


class _CallTimer:
    """One call under a CPU timer (SIGPROF) that raises :class:`_CallTimeout` after ``budget_s``.

    The timer re-fires every quarter budget. Code can still swallow the raise
    (``finally: continue``; the sandbox refuses that statically, but the timer
    must not depend on it), so a call that is still running ``_SWALLOW_GRACE``
    firings after the first raise is ended for good: inside a worker
    (``escalate``) the process exits with a mark the parent reads back; in
    process the timer keeps raising. A call that returned after a raise
    counts as a timeout all the same.
    """

    def __init__(self, budget_s: float, label: str, escalate: bool) -> None:
        self.budget_s, self.label, self.escalate = budget_s, label, escalate
        self.fired = 0

    def call(self, fn: Callable[..., Any], args: tuple) -> tuple[BaseException | None, float]:
        """Call ``fn``; returns (exception or None, CPU milliseconds)."""
        use_timer = threading.current_thread() is threading.main_thread()
        old = signal.signal(signal.SIGPROF, self._fire) if use_timer else None
        start = time.thread_time()
        outcome: BaseException | None = None
        try:
            try:
                if use_timer:
                    signal.setitimer(signal.ITIMER_PROF, self.budget_s, self.budget_s / 4)
                fn(*args)
            finally:
                if use_timer:
                    signal.setitimer(signal.ITIMER_PROF, 0)
        except _CallTimeout as ex:
            outcome = ex
        except Exception as ex:
            outcome = ex
        finally:
            if use_timer:
                signal.signal(signal.SIGPROF, old)
        if self.fired and not isinstance(outcome, _CallTimeout):
            outcome = _CallTimeout()  # it returned, but only because it swallowed the timer
        return outcome, (time.thread_time() - start) * 1000

    def _fire(self, signum: int, frame: Any) -> None:
        self.fired += 1
        if self.fired > 1 + _SWALLOW_GRACE and self.escalate:
            os.write(2, f"{_SWALLOWED_MARK}: {self.label} {_SWALLOWED_MARK}\n".encode("utf-8", "replace"))
            os._exit(_SWALLOWED_EXIT)  # no exception handler in the patch code can catch this
        raise _CallTimeout()


def _judge(
    outcome: BaseException | None, ms: float, case: _Case, kind: str, max_call_ms: float, budget_s: float
) -> str | None:
    if isinstance(outcome, _CallTimeout):
        return f"timeout: a call ran past {budget_s:g}s of CPU on {case.label} (an endless loop?)"
    if isinstance(outcome, MemoryError):
        return f"memory: {type(outcome).__name__} on {case.label} (the code allocates too much)"
    if outcome is not None:
        reason = getattr(outcome, "reason", "exception")
        if reason == "non-finite" and not case.finite:
            return None  # NaN in, NaN out is the sim's fault, not the patch's
        detail = str(outcome) if isinstance(outcome, SandboxError) else f"{type(outcome).__name__}: {outcome}"
        return f"{reason}: {detail} on {case.label}"
    if ms > max_call_ms:
        return f"slow: a call took {ms:.1f} ms of CPU on {case.label}; the limit is {max_call_ms:g} ms"
    return None


def _fuzz_cases(obs_space: Any, act_space: Any, n_random: int, seed: int) -> Iterator[_Case]:
    flags = [(False, False), (True, False), (False, True), (True, True)]
    for i, v in enumerate(FUZZ_EXTREMES):
        obs, act = _fill(obs_space, v), _fill(act_space, v)
        t, tr = flags[i % 4]
        yield _Case(f"obs=action={v:g}", obs, act, _FUZZ_REWARDS[i % 5], obs, t, tr)
    for a, b in ((0.0, 1.0), (1.0, 0.0), (0.0, 1e6), (-1e30, 1e30)):
        yield _Case(f"obs={a:g} next_obs={b:g}", _fill(obs_space, a), _fill(act_space, 0.0), 0.0, _fill(obs_space, b))
    for v in FUZZ_NONFINITE:
        obs = _fill(obs_space, v, finite_only=False)
        act = _fill(act_space, v, finite_only=False)
        if obs is not None or act is not None:
            obs = obs if obs is not None else _fill(obs_space, 0.0)
            act = act if act is not None else _fill(act_space, 0.0)
            yield _Case(f"obs=action={v}", obs, act, 0.0, obs)
    zero = _fill(obs_space, 0.0)
    for name, info in fuzz_infos(zero):  # every info variant once on plain inputs, so each is seen
        yield _Case(f"obs=0 with info {name}", zero, _fill(act_space, 0.0), 0.0, zero, info=info)
    yield from _random_cases(obs_space, act_space, n_random, seed)


def _random_cases(obs_space: Any, act_space: Any, n: int, seed: int) -> Iterator[_Case]:
    rng = np.random.default_rng(seed)
    obs_space.seed(seed)
    act_space.seed(seed + 1)
    for i in range(n):
        reward = float(rng.normal() * (1.0, 10.0, 1000.0)[i % 3])
        t, tr = bool(rng.random() < 0.1), bool(rng.random() < 0.1)
        obs, act, next_obs = obs_space.sample(), act_space.sample(), obs_space.sample()
        variants = fuzz_infos(next_obs, rng)
        name, info = variants[int(rng.integers(len(variants)))]
        yield _Case(f"random sample {i} with info {name}", obs, act, reward, next_obs, t, tr, info)


def fuzz_infos(next_obs: Any, rng: np.random.Generator | None = None) -> list[tuple[str, dict]]:
    """The ``info`` dicts a fuzz run hands over, as (name, dict): what real envs and wrappers put there.

    Empty (the most common), SB3's Monitor and VecEnv keys at an episode end, gymnasium's
    ``TimeLimit.truncated`` and vector-env ``final_info``, ``is_success`` as bool, numpy bool and
    float, MuJoCo-style floats (numpy scalars among them), Atari's ``lives``, a safety ``cost``,
    Remedy's own wrapper keys, extremes (a zero distance, 1e30) and odd types (None, text,
    nested dicts, lists, a non-string key). Random values come from ``rng`` when given.
    """
    u = (lambda lo, hi: float(rng.uniform(lo, hi))) if rng is not None else (lambda lo, hi: (lo + hi) / 2)
    episode = {"r": u(-500, 500), "l": int(u(1, 1000)), "t": u(0, 100)}
    return [
        ("{}", {}),
        ("{}", {}),
        (
            "of an episode end (Monitor, TimeLimit)",
            {
                "episode": episode,
                "TimeLimit.truncated": True,
                "terminal_observation": next_obs,
            },
        ),
        ("with is_success", {"is_success": bool(u(0, 1) > 0.5)}),
        ("with numpy is_success", {"is_success": np.bool_(True), "success": np.float64(1.0)}),
        (
            "of a MuJoCo env",
            {
                "x_position": u(-10, 10),
                "x_velocity": np.float32(u(-5, 5)),
                "reward_run": np.float64(u(-1, 1)),
                "reward_ctrl": u(-1, 0),
                "distance_from_origin": np.asarray(u(0, 10)),
            },
        ),
        ("of an Atari env", {"lives": int(u(0, 5)), "episode_frame_number": int(u(0, 1e5)), "frame_number": 7}),
        ("with a safety cost", {"cost": u(0, 1), "constraint_violation": np.bool_(u(0, 1) > 0.5)}),
        (
            "of Remedy's wrappers",
            {
                "original_reward": u(-10, 10),
                "shaped_reward": u(-10, 10),
                "safety_violation": False,
                "smoothness_penalty": u(0, 1),
            },
        ),
        (
            "of a vector env",
            {
                "final_observation": next_obs,
                "_final_observation": np.array([True]),
                "final_info": {"episode": episode},
            },
        ),
        ("with extremes", {"distance": 0.0, "cost": 1e30, "x_velocity": -1e6, "lives": 0, "progress": 1e30}),
        (
            "with odd types",
            {
                "debug": None,
                "message": "ok",
                "lidar": [u(0, 1), u(0, 1)],
                "nested": {"a": {"b": [1, 2]}},
                "flags": (True, False),
                "frame": np.zeros((4, 4), dtype=np.uint8),
                7: "an int key",
            },
        ),
        ("with NaN", {"x_velocity": math.nan, "cost": math.inf}),
    ]


def _fill(space: Any, v: float, finite_only: bool = True) -> Any:
    """A value of ``space`` with every entry at (or clipped towards) ``v``; None where the space cannot hold it."""
    finite = math.isfinite(v)
    if isinstance(space, S.Box):
        if np.issubdtype(space.dtype, np.floating):
            if not finite and finite_only:
                return None
            return np.full(space.shape, v, dtype=space.dtype)
        if not finite:
            return None
        info = np.iinfo(space.dtype)
        return np.full(space.shape, int(np.clip(v, info.min, info.max)), dtype=space.dtype)
    if not finite:
        return None
    if isinstance(space, S.Discrete):
        return np.int64(space.start + (0 if v <= 0 else space.n - 1))
    if isinstance(space, S.MultiDiscrete):
        return (space.nvec - 1 if v > 0 else np.zeros_like(space.nvec)).astype(space.dtype)
    if isinstance(space, S.MultiBinary):
        return np.full(space.shape, 1 if v > 0 else 0, dtype=space.dtype)
    return space.sample()
