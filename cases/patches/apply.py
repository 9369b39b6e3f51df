"""Applying a :class:`~remedy.cases.patches.spec.Patch` to an env and an algorithm.

:meth:`PatchPlan.from_patch` splits a patch into what each part touches:

- env wrappers (reward shaping, action smoothness/magnitude penalties, count
  bonus, safety constraint, action repeat) and env settings (time limit,
  curriculum stages over env kwargs);
- algorithm overrides (hyperparameters, ``ent_coef``), validated against the
  algorithm's constructor;
- normalization (SB3 ``VecNormalize`` of observations and/or rewards);
- extra training budget.

Parts that do not fit the env or algorithm are refused with
:class:`PatchRejectedError` naming the rule (the rules of
:func:`remedy.cases.patches.check.check_fit`). Every reward-changing wrapper keeps
``info["original_reward"]`` (set by the first reward-changing wrapper in the
chain, which may be a setup/fault wrapper) and writes ``info["shaped_reward"]``
(the reward it hands on), so verification can compare the shaped training
return with the original one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np

from ..errors import PatchRejectedError
from ..evidence.wrappers import ORIGINAL_REWARD_KEY, REWARD_COMPONENTS_KEY, fault_hidden
from .spec import (
    ActionMagnitude,
    ActionRepeat,
    ActionSmoothness,
    Curriculum,
    ExplorationBonus,
    FrameStack,
    Hyperparameters,
    Normalization,
    Patch,
    RewardShaping,
    SafetyConstraint,
    TimeLimit,
    TrainingBudget,
)

__all__ = [
    "PatchPlan",
    "EnvPatch",
    "ShapedRewardWrapper",
    "ActionSmoothnessWrapper",
    "ActionMagnitudeWrapper",
    "CountBonusWrapper",
    "SafetyConstraintWrapper",
    "ActionRepeatWrapper",
    "CurriculumEnv",
    "EnvStepCounter",
    "CurriculumSchedule",
    "make_patched_env_fn",
    "normalized_action",
    "patch_info",
]


# --------------------------------------------------------------------------- reward bookkeeping


def _mark(info: dict, reward_in: float, reward_out: float) -> None:
    """Keep the first reward-changer's original reward; record what this wrapper hands on."""
    info.setdefault("original_reward", float(reward_in))
    info["shaped_reward"] = float(reward_out)


#: info keys that would tell patch code about a hidden fault: the reward before the fault, the fault's own terms.
_FAULT_INFO_KEYS = (ORIGINAL_REWARD_KEY, REWARD_COMPONENTS_KEY)


def patch_info(info: dict, hide_fault: bool) -> dict:
    """A copy of ``info`` for patch code; on a bench patient (``hide_fault``) without the fault's keys.

    Patch code then sees the training reward (its ``reward`` argument) and the
    env's own info, as it would on a user's run with the same training reward.
    """
    if not hide_fault:
        return dict(info)
    return {k: v for k, v in info.items() if k not in _FAULT_INFO_KEYS}


def normalized_action(space: gym.Space, action: Any) -> np.ndarray:
    """The action as a float vector, Box actions scaled to [-1, 1] where the bounds are finite."""
    a = np.asarray(action, dtype=np.float64).reshape(-1)
    if isinstance(space, gym.spaces.Box):
        low, high = space.low.reshape(-1).astype(np.float64), space.high.reshape(-1).astype(np.float64)
        finite = np.isfinite(low) & np.isfinite(high) & (high > low)
        a = a.copy()
        a[finite] = 2.0 * (np.clip(a[finite], low[finite], high[finite]) - low[finite]) / (high[finite] - low[finite]) - 1.0
    return a


class _RewardChanger(gym.Wrapper):
    """Base for wrappers that change the reward; subclasses define ``_change``."""

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        info = dict(info)
        new = float(self._change(action, float(reward), obs, terminated, truncated, info))
        _mark(info, reward, new)
        return obs, new, terminated, truncated, info

    def _change(self, action, reward, next_obs, terminated, truncated, info) -> float:  # pragma: no cover
        raise NotImplementedError


class ShapedRewardWrapper(_RewardChanger):
    """Replace the reward with ``fn(obs, action, reward, next_obs, terminated, truncated, info)``.

    ``reward`` is the training-view reward (after setup wrappers); ``obs`` is the
    observation the action was chosen from. Arrays handed to the code are copies
    so it cannot corrupt the env's state.
    """

    def __init__(self, env: gym.Env, fn: Callable[..., float]):
        super().__init__(env)
        self._fn = fn
        self._last_obs = None
        self._hide_fault = fault_hidden(env)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._last_obs = obs
        return obs, info

    def _change(self, action, reward, next_obs, terminated, truncated, info) -> float:
        prev, self._last_obs = self._last_obs, next_obs
        value = self._fn(
            np.array(prev, copy=True), np.array(action, copy=True), reward,
            np.array(next_obs, copy=True), bool(terminated), bool(truncated), patch_info(info, self._hide_fault),
        )
        return float(value)


class ActionSmoothnessWrapper(_RewardChanger):
    """Subtract ``coef * ||a_t - a_{t-1}||^2`` on the normalized action (none on an episode's first step)."""

    def __init__(self, env: gym.Env, coef: float):
        super().__init__(env)
        self.coef = float(coef)
        self._prev: np.ndarray | None = None

    def reset(self, **kwargs):
        self._prev = None
        return self.env.reset(**kwargs)

    def _change(self, action, reward, next_obs, terminated, truncated, info) -> float:
        a = normalized_action(self.action_space, action)
        penalty = 0.0 if self._prev is None else self.coef * float(np.sum((a - self._prev) ** 2))
        self._prev = a
        info["smoothness_penalty"] = penalty
        return reward - penalty


class ActionMagnitudeWrapper(_RewardChanger):
    """Subtract ``coef * ||a_t||^2`` on the normalized action."""

    def __init__(self, env: gym.Env, coef: float):
        super().__init__(env)
        self.coef = float(coef)

    def _change(self, action, reward, next_obs, terminated, truncated, info) -> float:
        penalty = self.coef * float(np.sum(normalized_action(self.action_space, action) ** 2))
        info["magnitude_penalty"] = penalty
        return reward - penalty


class CountBonusWrapper(_RewardChanger):
    """Add ``bonus / sqrt(N(cell))`` for the coarse cell the next observation falls in.

    Cells: ``bins`` per dimension over finite observation bounds, unit-width
    cells where a bound is infinite or huge. Counts are per env instance.
    """

    def __init__(self, env: gym.Env, bonus: float, bins: int = 10):
        super().__init__(env)
        self.bonus = float(bonus)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box):
            raise PatchRejectedError(
                "a count-based exploration bonus needs a Box observation space; use ent_coef instead",
                rule="count_bonus_box_obs",
            )
        low, high = space.low.reshape(-1).astype(np.float64), space.high.reshape(-1).astype(np.float64)
        finite = np.isfinite(low) & np.isfinite(high) & (high - low < 1e6)
        self._low = np.where(finite, low, 0.0)
        self._width = np.where(finite, np.maximum((high - low) / bins, 1e-9), 1.0)
        self.counts: dict[tuple, int] = {}

    def cell(self, obs) -> tuple:
        """The discretized cell of an observation."""
        x = np.nan_to_num(np.asarray(obs, dtype=np.float64).reshape(-1), nan=0.0, posinf=1e9, neginf=-1e9)
        return tuple(np.floor((x - self._low) / self._width).astype(np.int64).tolist())

    def _change(self, action, reward, next_obs, terminated, truncated, info) -> float:
        key = self.cell(next_obs)
        n = self.counts.get(key, 0) + 1
        self.counts[key] = n
        bonus = self.bonus / math.sqrt(n)
        info["count_bonus"] = bonus
        return reward + bonus


class SafetyConstraintWrapper(_RewardChanger):
    """Penalize (or terminate on) steps where ``predicate(obs, action, info)`` is true (a violation)."""

    def __init__(self, env: gym.Env, predicate: Callable[..., bool], mode: str, penalty: float):
        super().__init__(env)
        self._pred, self.mode, self.penalty = predicate, mode, float(penalty)
        self.violations = 0
        self._hide_fault = fault_hidden(env)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        info = dict(info)
        violated = bool(self._pred(np.array(obs, copy=True), np.array(action, copy=True),
                                   patch_info(info, self._hide_fault)))
        new = float(reward) - (self.penalty if violated else 0.0)
        if violated:
            self.violations += 1
            terminated = terminated or self.mode == "terminate"
        info["safety_violation"] = violated
        _mark(info, reward, new)
        return obs, new, terminated, truncated, info


class ActionRepeatWrapper(gym.Wrapper):
    """Repeat each action ``n`` env steps, summing rewards (and original rewards); stops at episode end."""

    def __init__(self, env: gym.Env, n: int):
        super().__init__(env)
        self.n = int(n)

    def step(self, action):
        total = original = 0.0
        for _ in range(self.n):
            obs, reward, terminated, truncated, info = self.env.step(action)
            info = dict(info)
            total += float(reward)
            original += float(info.get("original_reward", reward))
            if terminated or truncated:
                break
        info["original_reward"] = original
        info["shaped_reward"] = total
        return obs, total, terminated, truncated, info


class EnvStepCounter(gym.Wrapper):
    """Counts the env steps actually taken into a shared one-item list (all envs of one vector env).

    It sits under the patch's wrappers, so an action repeat's inner steps are
    counted one by one: the arms of a verification are held to the same
    number of these, not of agent decisions.
    """

    def __init__(self, env: gym.Env, counter: list[int]):
        super().__init__(env)
        self.counter = counter

    def step(self, action):
        self.counter[0] += 1
        return self.env.step(action)


# --------------------------------------------------------------------------- curriculum


@dataclass
class CurriculumSchedule:
    """Env kwargs per stage and the env step at which each stage starts; ``steps`` is a shared counter."""

    stages: list[tuple[dict[str, Any], int]]
    steps: list[int] = field(default_factory=lambda: [0])

    def kwargs_now(self) -> dict[str, Any]:
        """The env kwargs of the stage the shared step counter is in."""
        current = self.stages[0][0]
        for kwargs, start in self.stages:
            if self.steps[0] >= start:
                current = kwargs
        return current


class CurriculumEnv(gym.Wrapper):
    """Rebuilds the env with the current stage's kwargs at each reset where the stage changed.

    All envs of one vector env share the schedule's step counter, so the
    switch happens at the same budget fraction for all of them.
    """

    def __init__(self, build: Callable[[dict[str, Any]], gym.Env], schedule: CurriculumSchedule):
        self._build, self.schedule = build, schedule
        self.stage_kwargs = schedule.kwargs_now()
        super().__init__(build(self.stage_kwargs))

    def reset(self, **kwargs):
        wanted = self.schedule.kwargs_now()
        if wanted != self.stage_kwargs:
            new = self._build(wanted)
            if new.observation_space != self.observation_space or new.action_space != self.action_space:
                raise PatchRejectedError(
                    f"curriculum stage {wanted} changes the observation or action space; keep spaces fixed",
                    rule="curriculum_spaces",
                )
            self.env.close()
            self.env, self.stage_kwargs = new, wanted
        return self.env.reset(**kwargs)

    def step(self, action):
        self.schedule.steps[0] += 1
        return self.env.step(action)


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class EnvPatch:
    """One env-level patch part, in application order (picklable: built into a wrapper per env)."""

    kind: str
    part: Any


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
        return any(p.kind in _REWARD_KINDS for p in self.env_patches)

    @classmethod
    def from_patch(cls, patch: Patch | None, traits: Any, algo: str) -> "PatchPlan":
        """Split ``patch`` for an env with ``traits`` (EnvTraits) and algorithm ``algo``; refuse misfits."""
        if patch is None:
            return cls()
        from .check import check_fit  # one set of fit rules, shared with `remedy patch check`

        check_fit(patch, traits, algo)
        acc: dict[str, Any] = {"env_patches": [], "overrides": {}, "parts": []}
        for part in patch.parts:
            _HANDLERS[type(part)](part, acc, algo)
            acc["parts"].append(part.kind)
        acc["env_patches"] = tuple(acc["env_patches"])
        acc["parts"] = tuple(acc["parts"])
        return cls(**acc)

    def curriculum_schedule(self, budget_steps: int) -> CurriculumSchedule | None:
        """Stage kwargs with their start steps for a fine-tune of ``budget_steps`` (None without curriculum)."""
        if self.curriculum is None:
            return None
        total = sum(s.fraction for s in self.curriculum.stages)
        starts, acc = [], 0.0
        for stage in self.curriculum.stages:
            starts.append((dict(stage.env_kwargs), int(round(budget_steps * acc / total))))
            acc += stage.fraction
        return CurriculumSchedule(stages=starts)

    def wrap(self, env: gym.Env) -> gym.Env:
        """Apply the env patches to one env, in patch order."""
        for ep in self.env_patches:
            env = _build_wrapper(ep, env)
        return env


_REWARD_KINDS = {"reward_shaping", "action_smoothness", "action_magnitude", "count_bonus", "safety_constraint"}


def _on_reward_shaping(part: RewardShaping, acc: dict, algo: str) -> None:
    from .sandbox import compile_reward  # D's sandbox: static checks happen here, before any env exists

    compile_reward(part.code)
    acc["env_patches"].append(EnvPatch("reward_shaping", part))


def _on_safety(part: SafetyConstraint, acc: dict, algo: str) -> None:
    from .sandbox import compile_predicate

    compile_predicate(part.predicate)
    acc["env_patches"].append(EnvPatch("safety_constraint", part))


def _on_hyper(part: Hyperparameters, acc: dict, algo: str) -> None:
    acc["overrides"].update(part.changes)


def _on_exploration(part: ExplorationBonus, acc: dict, algo: str) -> None:
    if part.ent_coef is not None:
        acc["overrides"]["ent_coef"] = float(part.ent_coef)
    if part.count_bonus > 0:
        acc["env_patches"].append(EnvPatch("count_bonus", part))


def _on_normalization(part: Normalization, acc: dict, algo: str) -> None:
    acc["normalization"] = part


def _on_time_limit(part: TimeLimit, acc: dict, algo: str) -> None:
    acc["max_episode_steps"] = part.max_episode_steps


def _on_budget(part: TrainingBudget, acc: dict, algo: str) -> None:
    acc["extra_steps"] = acc.get("extra_steps", 0) + part.extra_steps


def _on_curriculum(part: Curriculum, acc: dict, algo: str) -> None:
    acc["curriculum"] = part


def _on_frame_stack(part: FrameStack, acc: dict, algo: str) -> None:
    acc["frame_stack"] = part.n


def _on_env_part(part: Any, acc: dict, algo: str) -> None:
    acc["env_patches"].append(EnvPatch(part.kind, part))


_HANDLERS: dict[type, Callable[[Any, dict, str], None]] = {
    RewardShaping: _on_reward_shaping,
    ActionSmoothness: _on_env_part,
    ActionMagnitude: _on_env_part,
    ActionRepeat: _on_env_part,
    Hyperparameters: _on_hyper,
    ExplorationBonus: _on_exploration,
    Normalization: _on_normalization,
    TimeLimit: _on_time_limit,
    TrainingBudget: _on_budget,
    Curriculum: _on_curriculum,
    FrameStack: _on_frame_stack,
    SafetyConstraint: _on_safety,
}


def _build_wrapper(ep: EnvPatch, env: gym.Env) -> gym.Env:
    part = ep.part
    if ep.kind == "reward_shaping":
        from .sandbox import compile_reward

        return ShapedRewardWrapper(env, compile_reward(part.code))
    if ep.kind == "safety_constraint":
        from .sandbox import compile_predicate

        return SafetyConstraintWrapper(env, compile_predicate(part.predicate), part.mode, part.penalty)
    if ep.kind == "action_smoothness":
        return ActionSmoothnessWrapper(env, part.coef)
    if ep.kind == "action_magnitude":
        return ActionMagnitudeWrapper(env, part.coef)
    if ep.kind == "count_bonus":
        return CountBonusWrapper(env, part.count_bonus)
    if ep.kind == "action_repeat":
        return ActionRepeatWrapper(env, part.n)
    raise PatchRejectedError(f"no env wrapper for patch kind '{ep.kind}'", rule="unknown_kind")  # pragma: no cover


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
    from ..evidence.envs import make_env  # C's env factory

    plan = patch_plan or PatchPlan()
    base_kwargs = dict(env_kwargs or {})
    wrappers = list(setup_wrappers)
    limit = max_episode_steps
    if plan.max_episode_steps is not None:
        wrappers, limit = _setup_without_time_limit(wrappers), plan.max_episode_steps

    def build(stage_kwargs: dict[str, Any]) -> gym.Env:
        env = make_env(env_id, {**base_kwargs, **stage_kwargs}, wrappers=tuple(wrappers),
                       max_episode_steps=limit, seed=seed)
        if step_counter is not None:
            env = EnvStepCounter(env, step_counter)
        return plan.wrap(env)

    def factory() -> gym.Env:
        if schedule is not None:
            return CurriculumEnv(build, schedule)
        return build({})

    return factory
