"""Applying a :class:`~remedy.cases.patches.spec.Patch` to an env and an algorithm.

:meth:`PatchPlan.from_patch` splits a patch into what each part touches:

- env wrappers (reward shaping, action smoothness/magnitude penalties, count
  bonus, safety constraint, action repeat) and env settings (time limit,
  curriculum stages over env kwargs);
- algorithm overrides (hyperparameters, ``ent_coef``), validated against the
  algorithm's constructor;
- normalization (SB3 ``VecNormalize`` of observations and/or rewards);
- extra training budget.

What each kind contributes is its entry in :data:`remedy.cases.patches.kinds.PATCH_KINDS`.
Parts that do not fit the env or algorithm are refused with
:class:`PatchRejectedError` naming the rule (:func:`remedy.cases.patches.kinds.check_fit`).
The wrappers themselves live in :mod:`remedy.cases.patches.wrappers`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from ..evidence.envs import make_env
from .kinds import check_fit, patch_kind
from .spec import Curriculum, Normalization, Patch
from .wrappers import CurriculumEnv, CurriculumSchedule, EnvStepCounter

__all__ = ["PatchPlan", "EnvPatch", "make_patched_env_fn"]


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class EnvPatch:
    """One env-level patch part, in application order (picklable: built into a wrapper per env)."""

    kind: str
    part: Any

    def wrap(self, env: gym.Env) -> gym.Env:
        """This part's wrapper around ``env``, as its registry entry builds it."""
        build = patch_kind(self.kind).wrapper
        assert build is not None  # only parts with a wrapper become EnvPatches
        return build(self.part, env)


@dataclass(frozen=True)
class PatchPlan:
    """What a patch does, split by what it touches. Build with :meth:`from_patch`."""

    env_patches: tuple[EnvPatch, ...] = ()
    overrides: dict[str, Any] = field(default_factory=dict)
    normalization: Normalization | None = None
    extra_steps: int = 0
    max_episode_steps: int | None = None
    curriculum: Curriculum | None = None
    frame_stack: int | None = None
    parts: tuple[str, ...] = ()

    @property
    def is_budget_only(self) -> bool:
        """True when the patch only adds training steps (its control is the unpatched checkpoint)."""
        return bool(self.parts) and set(self.parts) == {"training_budget"}

    @property
    def needs_fresh_policy(self) -> bool:
        """True when the patch changes the observation space (frame stack)."""
        return self.frame_stack is not None

    @property
    def changes_reward(self) -> bool:
        """True when some env patch changes the training reward."""
        return any(patch_kind(p.kind).changes_reward for p in self.env_patches)

    @classmethod
    def from_patch(cls, patch: Patch | None, traits: Any, algo: str) -> PatchPlan:
        """Split ``patch`` for an env with ``traits`` (EnvTraits) and algorithm ``algo``; refuse misfits."""
        if patch is None:
            return cls()
        check_fit(patch, traits, algo)  # one set of fit rules, shared with `remedy patch check`
        acc: dict[str, Any] = {"env_patches": [], "overrides": {}, "extra_steps": 0}
        for part in patch.parts:
            entry = patch_kind(part.kind)
            if entry.overrides is not None:
                acc["overrides"].update(entry.overrides(part))
            for name, value in (entry.settings(part) if entry.settings is not None else {}).items():
                acc[name] = acc[name] + value if name == "extra_steps" else value
            if entry.wrapper is not None and entry.wraps(part):
                acc["env_patches"].append(EnvPatch(part.kind, part))
        return cls(**{**acc, "env_patches": tuple(acc["env_patches"]), "parts": tuple(patch.kinds)})

    def curriculum_schedule(self, budget_steps: int) -> CurriculumSchedule | None:
        """Stage kwargs with their start steps for a fine-tune of ``budget_steps`` (None without curriculum)."""
        if self.curriculum is None:
            return None
        total = sum(s.fraction for s in self.curriculum.stages)
        starts, acc = [], 0.0
        for stage in self.curriculum.stages:
            starts.append((dict(stage.env_kwargs), round(budget_steps * acc / total)))
            acc += stage.fraction
        return CurriculumSchedule(stages=starts)

    def wrap(self, env: gym.Env) -> gym.Env:
        """Apply the env patches to one env, in patch order."""
        for ep in self.env_patches:
            env = ep.wrap(env)
        return env


# --------------------------------------------------------------------------- env factory


def _setup_without_time_limit(setup_wrappers: Sequence[Any]) -> list[Any]:
    """Drop setup time-limit wrappers: a time-limit patch replaces the scenario's limit, not nests in it."""
    return [w for w in setup_wrappers if getattr(w, "kind", None) != "time_limit"]


def make_patched_env_fn(
    env_id: str,
    env_kwargs: dict[str, Any] | None,
    setup_wrappers: Sequence[Any],
    patch_plan: PatchPlan | None,
    seed: int | None = None,
    *,
    max_episode_steps: int | None = None,
    schedule: CurriculumSchedule | None = None,
    step_counter: list[int] | None = None,
) -> Callable[[], gym.Env]:
    """A factory of training envs: the env, its setup (fault) wrappers, then the patch's wrappers.

    A time-limit patch replaces the setup's limit; a curriculum (pass the
    ``schedule`` from :meth:`PatchPlan.curriculum_schedule`, shared by all envs
    of one vector env) merges each stage's kwargs over ``env_kwargs``. With
    ``step_counter`` (a one-item list) every env step taken is counted into it
    (:class:`EnvStepCounter`, between the setup and the patch wrappers).
    """
    plan = patch_plan or PatchPlan()
    base_kwargs = dict(env_kwargs or {})
    wrappers = list(setup_wrappers)
    limit = max_episode_steps
    if plan.max_episode_steps is not None:
        wrappers, limit = _setup_without_time_limit(wrappers), plan.max_episode_steps

    def build(stage_kwargs: dict[str, Any]) -> gym.Env:
        env = make_env(
            env_id, {**base_kwargs, **stage_kwargs}, wrappers=tuple(wrappers), max_episode_steps=limit, seed=seed
        )
        if step_counter is not None:
            env = EnvStepCounter(env, step_counter)
        return plan.wrap(env)

    def factory() -> gym.Env:
        if schedule is not None:
            return CurriculumEnv(build, schedule)
        return build({})

    return factory
