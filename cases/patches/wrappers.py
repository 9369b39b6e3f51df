"""The env wrappers that patches add to a training env, and the curriculum env.

Every reward-changing wrapper keeps ``info["original_reward"]`` (set by the first
reward-changing wrapper in the chain, which may be a setup/fault wrapper) and writes
``info["shaped_reward"]`` (the reward it hands on), so verification can compare the
shaped training return with the original one. Which patch kind builds which wrapper is
declared once, in :data:`remedy.cases.patches.kinds.PATCH_KINDS`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from ..errors import PatchRejectedError
from ..evidence.wrappers import ORIGINAL_REWARD_KEY, REWARD_COMPONENTS_KEY, fault_hidden

__all__ = [
    "ShapedRewardWrapper",
    "ActionSmoothnessWrapper",
    "ActionMagnitudeWrapper",
    "CountBonusWrapper",
    "SafetyConstraintWrapper",
    "ActionRepeatWrapper",
    "CurriculumEnv",
    "CurriculumSchedule",
    "EnvStepCounter",
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
        a[finite] = (
            2.0 * (np.clip(a[finite], low[finite], high[finite]) - low[finite]) / (high[finite] - low[finite]) - 1.0
        )
    return a


class _RewardChanger(gym.Wrapper):
    """Base for wrappers that change the reward; subclasses define ``_change``."""

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        info = dict(info)
        new = float(self._change(action, float(reward), obs, terminated, truncated, info))
        _mark(info, float(reward), new)
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
            np.array(prev, copy=True),
            np.array(action, copy=True),
            reward,
            np.array(next_obs, copy=True),
            bool(terminated),
            bool(truncated),
            patch_info(info, self._hide_fault),
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
        violated = bool(
            self._pred(np.array(obs, copy=True), np.array(action, copy=True), patch_info(info, self._hide_fault))
        )
        new = float(reward) - (self.penalty if violated else 0.0)
        if violated:
            self.violations += 1
            terminated = terminated or self.mode == "terminate"
        info["safety_violation"] = violated
        _mark(info, float(reward), new)
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
