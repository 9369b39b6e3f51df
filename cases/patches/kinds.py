"""The patch-kind registry: everything Remedy knows about one kind of patch, in one entry.

A :class:`PatchKind` names the spec model (``spec.py``), the remedy family it belongs to,
its fit rule (``fit.py``), how it enters a :class:`~remedy.cases.patches.apply.PatchPlan`
(algorithm overrides, plan settings, an env wrapper), the sandboxed code it carries (to be
compiled and fuzzed before use), and whether it changes the training reward. Adding a kind
means a spec model in ``spec.py`` (and in its ``PatchPart`` union), a member of
``RemedyFamily`` and one entry here; ``tests/cases/patches/test_kinds.py`` checks the three
agree.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
from pydantic import BaseModel

from ..errors import PatchRejectedError
from ..model import EnvTraits, RemedyFamily
from . import fit, spec, wrappers
from .fuzz import FuzzReport, fuzz_predicate, fuzz_reward
from .sandbox import compile_predicate, compile_reward
from .spec import Patch

__all__ = ["PatchKind", "PATCH_KINDS", "patch_kind", "reward_kinds", "control_wrapper", "check_fit"]

#: (part, observation space, action space, n_random, seed, timeout_s) -> FuzzReport
CodeCheck = Callable[[Any, gym.Space, gym.Space, int, int, float], FuzzReport]


@dataclass(frozen=True)
class PatchKind:
    """One patch kind.

    ``overrides(part)`` gives algorithm constructor overrides; ``settings(part)`` gives
    :class:`PatchPlan` fields to set (``extra_steps`` adds up); ``wrapper(part, env)`` wraps
    one training env and ``wraps(part)`` says whether this part needs it; ``code_check``
    compiles and fuzzes sandboxed code before anything trains on it. ``controls``: the wrapper is part
    of how the agent acts (an action repeat), so an evaluation on the original task keeps it, as it keeps
    observation wrappers (:func:`control_wrapper`); every other wrapper shapes training only.
    """

    model: type[BaseModel]
    family: RemedyFamily
    fit: Callable[[Any, fit.FitContext], None] | None = None
    overrides: Callable[[Any], dict[str, Any]] | None = None
    settings: Callable[[Any], dict[str, Any]] | None = None
    wrapper: Callable[[Any, gym.Env], gym.Env] | None = None
    wraps: Callable[[Any], bool] = lambda part: True
    code_check: CodeCheck | None = None
    changes_reward: bool = False
    controls: bool = False

    @property
    def name(self) -> str:
        """The ``kind`` literal of the spec model."""
        return self.model.model_fields["kind"].default


# --------------------------------------------------------------------------- sandboxed code


def _shaped_reward_wrapper(part: spec.RewardShaping, env: gym.Env) -> gym.Env:
    return wrappers.ShapedRewardWrapper(env, compile_reward(part.code))


def _safety_wrapper(part: spec.SafetyConstraint, env: gym.Env) -> gym.Env:
    return wrappers.SafetyConstraintWrapper(env, compile_predicate(part.predicate), part.mode, part.penalty)


def _fuzz_reward(
    part: spec.RewardShaping, obs: gym.Space, act: gym.Space, n: int, seed: int, timeout_s: float
) -> FuzzReport:
    return fuzz_reward(compile_reward(part.code), obs, act, n_random=n, seed=seed, timeout_s=timeout_s)


def _fuzz_predicate(
    part: spec.SafetyConstraint, obs: gym.Space, act: gym.Space, n: int, seed: int, timeout_s: float
) -> FuzzReport:
    return fuzz_predicate(
        compile_predicate(part.predicate), obs, act, n_random=max(1, n // 2), seed=seed, timeout_s=timeout_s
    )


def _ent_coef(part: spec.ExplorationBonus) -> dict[str, Any]:
    return {} if part.ent_coef is None else {"ent_coef": float(part.ent_coef)}


# --------------------------------------------------------------------------- the registry

_KINDS = [
    PatchKind(
        spec.RewardShaping,
        RemedyFamily.reward_shaping,
        wrapper=_shaped_reward_wrapper,
        code_check=_fuzz_reward,
        changes_reward=True,
    ),
    PatchKind(
        spec.ActionSmoothness,
        RemedyFamily.action_smoothness,
        fit=fit.needs_continuous_actions,
        wrapper=lambda p, env: wrappers.ActionSmoothnessWrapper(env, p.coef),
        changes_reward=True,
    ),
    PatchKind(
        spec.ActionMagnitude,
        RemedyFamily.action_magnitude,
        fit=fit.needs_continuous_actions,
        wrapper=lambda p, env: wrappers.ActionMagnitudeWrapper(env, p.coef),
        changes_reward=True,
    ),
    PatchKind(
        spec.Hyperparameters,
        RemedyFamily.hyperparameters,
        fit=fit.fit_hyperparameters,
        overrides=lambda p: dict(p.changes),
    ),
    PatchKind(
        spec.Normalization,
        RemedyFamily.normalization,
        fit=fit.fit_normalization,
        settings=lambda p: {"normalization": p},
    ),
    PatchKind(
        spec.TimeLimit,
        RemedyFamily.time_limit,
        fit=fit.fit_time_limit,
        settings=lambda p: {"max_episode_steps": p.max_episode_steps},
    ),
    PatchKind(
        spec.FrameStack, RemedyFamily.frame_stack, fit=fit.fit_frame_stack, settings=lambda p: {"frame_stack": p.n}
    ),
    PatchKind(
        spec.ActionRepeat,
        RemedyFamily.action_repeat,
        wrapper=lambda p, env: wrappers.ActionRepeatWrapper(env, p.n),
        controls=True,
    ),
    PatchKind(
        spec.ExplorationBonus,
        RemedyFamily.exploration_bonus,
        fit=fit.fit_exploration,
        overrides=_ent_coef,
        wrapper=lambda p, env: wrappers.CountBonusWrapper(env, p.count_bonus),
        wraps=lambda p: p.count_bonus > 0,
        changes_reward=True,
    ),
    PatchKind(spec.Curriculum, RemedyFamily.curriculum, fit=fit.fit_curriculum, settings=lambda p: {"curriculum": p}),
    PatchKind(
        spec.SafetyConstraint,
        RemedyFamily.safety_constraint,
        wrapper=_safety_wrapper,
        code_check=_fuzz_predicate,
        changes_reward=True,
    ),
    PatchKind(spec.TrainingBudget, RemedyFamily.training_budget, settings=lambda p: {"extra_steps": p.extra_steps}),
]

#: kind name -> its entry, in the order of ``RemedyFamily``.
PATCH_KINDS: dict[str, PatchKind] = {k.name: k for k in _KINDS}


def patch_kind(name: str) -> PatchKind:
    """The registry entry of patch kind ``name``; an unknown kind is refused with the known ones."""
    if name not in PATCH_KINDS:
        close = difflib.get_close_matches(name, list(PATCH_KINDS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else f"; known kinds: {', '.join(PATCH_KINDS)}"
        raise PatchRejectedError(f"unknown patch kind '{name}'{hint}", rule="unknown_kind")
    return PATCH_KINDS[name]


def reward_kinds() -> frozenset[str]:
    """Kinds whose env wrapper changes the training reward."""
    return frozenset(name for name, k in PATCH_KINDS.items() if k.changes_reward)


def control_wrapper(patch: Patch | None) -> Callable[[gym.Env], gym.Env]:
    """How the agent acts on an evaluation env: the wrappers of the parts whose kind is part of the agent's
    control interface (``controls``), in patch order; the env unchanged when there are none."""
    parts = [p for p in (patch.parts if patch is not None else ()) if patch_kind(p.kind).controls]

    def wrap(env: gym.Env) -> gym.Env:
        for part in parts:
            build = patch_kind(part.kind).wrapper
            if build is not None and patch_kind(part.kind).wraps(part):
                env = build(part, env)
        return env

    return wrap


def check_fit(
    patch: Patch,
    traits: EnvTraits,
    algo: str | None = None,
    *,
    observation_space: gym.Space | None = None,
) -> None:
    """Raise :class:`PatchRejectedError` (with ``rule``) for the first part that does not fit the env/algorithm.

    ``algo`` (None: skip algorithm checks) is validated against its
    constructor; ``observation_space`` (optional) enables the checks that need
    the space's type (frame stack, observation normalization).
    """
    ctx = fit.FitContext(traits, algo, fit.algo_hyperparameters(algo) if algo else None, observation_space)
    for part in patch.parts:
        rule = patch_kind(part.kind).fit
        if rule is not None:
            rule(part, ctx)
