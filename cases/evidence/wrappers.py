"""Setup wrappers: declarative parts of a training setup, injected faults included.

A run's ``wrappers:`` list describes how the user's (or a fault scenario's)
training env differs from the plain registered env: a reward that pays for
survival, observations scaled by 1e3, a noisy reward, sticky actions. Each
kind is registered once in :data:`WRAPPERS` with a factory and what it
affects. Reward wrappers keep the env's ORIGINAL reward in
``info["original_reward"]`` (the innermost one wins, so chains stay honest),
which is what evaluation and success tests read; ``for_evaluation=True``
drops reward-only and training-only wrappers (a setup time limit) altogether.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import TimeLimit
from pydantic import BaseModel, ConfigDict, Field, model_serializer

from ..errors import EnvError

__all__ = [
    "WrapperSpec",
    "WrapperEntry",
    "WRAPPERS",
    "ORIGINAL_REWARD_KEY",
    "REWARD_COMPONENTS_KEY",
    "apply_wrappers",
    "wrapper_kinds",
    "ObsScale",
    "ObsNoise",
    "ActionScale",
    "RewardWrapperBase",
    "RewardScale",
    "RewardNoise",
    "SurvivalReward",
    "ExploitableShaping",
    "ActionNoise",
    "StickyActions",
    "set_time_limit",
    "HiddenSetup",
    "fault_hidden",
]

#: info key holding the env's reward before any setup wrapper touched it.
ORIGINAL_REWARD_KEY = "original_reward"
#: info key holding a dict of named reward terms (for reward reflection).
REWARD_COMPONENTS_KEY = "reward_components"

Affects = Literal["reward", "observation", "dynamics", "training"]


class WrapperSpec(BaseModel):
    """One setup wrapper: its registered ``kind`` and keyword ``params``.

    ``hidden`` marks a bench patient's injected fault (the answer key): it
    shapes training and rollouts like any setup wrapper, but it is never named
    to a diagnoser (reward reference, prompt) and its reward terms and the
    pre-fault reward never reach patch code (see :class:`HiddenSetup`). A
    user's own declared wrappers are their config and stay visible.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: str
    params: dict[str, Any] = Field(default_factory=dict)
    hidden: bool = False

    @model_serializer(mode="wrap")
    def _omit_default_hidden(self, handler):
        # run.yaml files and scenario hashes written before the flag existed stay byte-identical
        data = handler(self)
        if isinstance(data, dict) and not self.hidden:
            data.pop("hidden", None)
        return data

    def describe(self) -> str:
        """Short text, e.g. ``obs_scale(factor=1000)``."""
        args = ", ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.kind}({args})"


class WrapperEntry(NamedTuple):
    """A registered wrapper kind: ``factory(env, **params) -> env`` and what it changes."""

    factory: Callable[..., gym.Env]
    affects: Affects


# ---------------------------------------------------------------- observation


class ObsScale(gym.ObservationWrapper):
    """Multiply observations by ``factor`` (the 'unnormalized observations' fault)."""

    def __init__(self, env: gym.Env, factor: float = 1000.0):
        super().__init__(env)
        if not isinstance(env.observation_space, gym.spaces.Box) or not factor > 0:
            raise EnvError("obs_scale needs a Box observation space and a positive factor")
        self.factor = float(factor)
        space = env.observation_space
        with np.errstate(over="ignore"):  # float32-max bounds (CartPole velocities) become inf, as they should
            low, high = space.low * self.factor, space.high * self.factor
        self.observation_space = gym.spaces.Box(low=low, high=high, shape=space.shape, dtype=space.dtype)

    def observation(self, observation):
        return (np.asarray(observation) * self.factor).astype(self.observation_space.dtype)


class ObsNoise(gym.ObservationWrapper):
    """Add Gaussian noise of standard deviation ``std`` to every observation dimension (seeded; a noisy sensor).

    The noise is part of the agent's world, so it stays at evaluation too: the agent has to cope with it.
    """

    def __init__(self, env: gym.Env, std: float = 0.1, seed: int = 0):
        super().__init__(env)
        if not isinstance(env.observation_space, gym.spaces.Box) or not std >= 0:
            raise EnvError("obs_noise needs a Box observation space and a non-negative std")
        self.std, self.seed = float(std), int(seed)
        self._rng = np.random.default_rng(self.seed)

    def reset(self, *, seed=None, options=None):
        if seed is not None:  # same env seed -> same noise
            self._rng = np.random.default_rng([self.seed, int(seed)])
        return super().reset(seed=seed, options=options)

    def observation(self, observation):
        obs = np.asarray(observation)
        return (obs + self._rng.normal(0.0, self.std, size=obs.shape)).astype(self.observation_space.dtype)


# ---------------------------------------------------------------- reward


class RewardWrapperBase(gym.Wrapper):
    """A reward wrapper that records the original reward and its own reward terms in ``info``."""

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        info = dict(info)
        info.setdefault(ORIGINAL_REWARD_KEY, float(reward))
        new_reward, terms = self.transform(obs, action, float(reward), terminated, truncated, info)
        if terms:
            comps = dict(info.get(REWARD_COMPONENTS_KEY, {}))
            comps.update(terms)
            info[REWARD_COMPONENTS_KEY] = comps
        return obs, float(new_reward), terminated, truncated, info

    def transform(self, obs, action, reward: float, terminated: bool, truncated: bool, info: dict):
        """Return ``(new_reward, {term_name: value})``."""
        raise NotImplementedError


class RewardScale(RewardWrapperBase):
    """Multiply the reward by ``factor``."""

    def __init__(self, env: gym.Env, factor: float = 0.01):
        super().__init__(env)
        self.factor = float(factor)

    def transform(self, obs, action, reward, terminated, truncated, info):
        return reward * self.factor, {}


class RewardNoise(RewardWrapperBase):
    """Add Gaussian noise of standard deviation ``std`` to the reward (seeded)."""

    def __init__(self, env: gym.Env, std: float = 1.0, seed: int = 0):
        super().__init__(env)
        self.std, self.seed = float(std), int(seed)
        self._rng = np.random.default_rng(self.seed)

    def reset(self, *, seed=None, options=None):
        if seed is not None:  # same env seed -> same noise
            self._rng = np.random.default_rng([self.seed, int(seed)])
        return self.env.reset(seed=seed, options=options)

    def transform(self, obs, action, reward, terminated, truncated, info):
        noise = float(self._rng.normal(0.0, self.std))
        return reward + noise, {"noise": noise}


def _lunar_fuel_cost(env: gym.Env, action) -> float:
    """Fuel charged by LunarLander for ``action`` (0.30 per unit main, 0.03 per unit side engine)."""
    a = np.asarray(action)
    if getattr(env.unwrapped, "continuous", False):
        a = np.clip(a.astype(float).reshape(-1), -1.0, 1.0)
        m_power = (np.clip(a[0], 0.0, 1.0) + 1.0) * 0.5 if a[0] > 0.0 else 0.0
        s_power = np.clip(abs(a[1]), 0.5, 1.0) if abs(a[1]) > 0.5 else 0.0
    else:
        act = int(a)
        m_power, s_power = (1.0 if act == 2 else 0.0), (1.0 if act in (1, 3) else 0.0)
    return float(m_power * 0.30 + s_power * 0.03)


class SurvivalReward(RewardWrapperBase):
    """The 'hover' fault: pay ``bonus_per_step`` for being alive, charge only ``fuel_scale`` of the fuel.

    With ``drop_terminal_bonus`` the terminal +-100 (landing/crash) is removed, so
    nothing pays for landing and staying aloft until the time limit is optimal.
    The fuel refund is computed for LunarLander; other envs just get the bonus.
    """

    def __init__(
        self, env: gym.Env, bonus_per_step: float = 1.0, drop_terminal_bonus: bool = True, fuel_scale: float = 0.1
    ):
        super().__init__(env)
        self.bonus, self.drop_terminal, self.fuel_scale = (
            float(bonus_per_step),
            bool(drop_terminal_bonus),
            float(fuel_scale),
        )
        self._lunar = type(env.unwrapped).__name__ == "LunarLander"

    def transform(self, obs, action, reward, terminated, truncated, info):
        terms = {"survival": self.bonus}
        if self._lunar:
            terms["fuel_refund"] = _lunar_fuel_cost(self.env, action) * (1.0 - self.fuel_scale)
        if self.drop_terminal and terminated and abs(reward) >= 100.0:
            terms["terminal_removed"] = -reward
        return reward + sum(terms.values()), terms


class ExploitableShaping(RewardWrapperBase):
    """A shaping term that can be farmed (the 'reward hacking' fault).

    ``term="abs_obs"``: pays ``coef * |obs[index]|`` each step (MountainCar with
    index 1 pays speed, so rocking back and forth forever beats reaching the goal).
    ``term="near_ground_slow"``: pays ``coef`` each step the lander is below
    ``height`` and slower than ``max_speed`` (LunarLander obs: y=1, vx=2, vy=3),
    so hovering just above the pad beats landing.
    """

    TERMS = ("abs_obs", "near_ground_slow")

    def __init__(
        self,
        env: gym.Env,
        term: str = "abs_obs",
        coef: float = 100.0,
        index: int = 1,
        height: float = 0.3,
        max_speed: float = 0.1,
    ):
        super().__init__(env)
        if term not in self.TERMS:
            raise EnvError(f"exploitable_shaping term '{term}' is unknown; use one of {', '.join(self.TERMS)}")
        self.term, self.coef, self.index = term, float(coef), int(index)
        self.height, self.max_speed = float(height), float(max_speed)

    def transform(self, obs, action, reward, terminated, truncated, info):
        o = np.asarray(obs, dtype=float).reshape(-1)
        if self.term == "abs_obs":
            bonus = self.coef * abs(o[self.index])
        else:
            slow = float(np.hypot(o[2], o[3])) < self.max_speed
            bonus = self.coef * float(o[1] < self.height and slow)
        return reward + bonus, {"shaping_bonus": bonus}


# ---------------------------------------------------------------- dynamics


class ActionNoise(gym.ActionWrapper):
    """Perturb actions: Gaussian noise (``std`` times the range) on Box actions, else a random action w.p. ``std``."""

    def __init__(self, env: gym.Env, std: float = 0.1, seed: int = 0):
        super().__init__(env)
        self.std, self.seed = float(std), int(seed)
        self._rng = np.random.default_rng(self.seed)

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng([self.seed, int(seed)])
        return self.env.reset(seed=seed, options=options)

    def action(self, action):
        space = self.action_space
        if isinstance(space, gym.spaces.Box):
            scale = np.where(np.isfinite(space.high - space.low), space.high - space.low, 1.0)
            noisy = np.asarray(action, dtype=float) + self._rng.normal(0.0, self.std, size=space.shape) * scale
            return np.clip(noisy, space.low, space.high).astype(space.dtype)
        if isinstance(space, gym.spaces.Discrete) and self._rng.random() < self.std:
            return int(space.start + self._rng.integers(space.n))
        return action


class ActionScale(gym.ActionWrapper):
    """The env receives ``factor`` times the chosen action, clipped to its own bounds (Box actions only).

    ``factor < 1`` is a weak actuator (a unit or gain mismatch: full stick gives a fraction of the force);
    ``factor > 1`` saturates (most actions hit the bounds, control turns bang-bang). The agent's action
    space is unchanged, so a saved policy still loads; the wrapper stays at evaluation (it is the plant).
    """

    def __init__(self, env: gym.Env, factor: float = 0.5):
        super().__init__(env)
        if not isinstance(env.action_space, gym.spaces.Box) or not factor > 0:
            raise EnvError("action_scale needs a Box action space and a positive factor")
        self.factor = float(factor)
        self._bounds = (env.action_space.low, env.action_space.high, env.action_space.dtype)

    def action(self, action):
        low, high, dtype = self._bounds
        return np.clip(np.asarray(action, dtype=float) * self.factor, low, high).astype(dtype)


class StickyActions(gym.Wrapper):
    """With probability ``p`` the env repeats the previous action instead of the chosen one."""

    def __init__(self, env: gym.Env, p: float = 0.25, seed: int = 0):
        super().__init__(env)
        self.p, self.seed = float(p), int(seed)
        self._rng = np.random.default_rng(self.seed)
        self._last = None

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng([self.seed, int(seed)])
        self._last = None
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        if self._last is not None and self._rng.random() < self.p:
            action = self._last
        self._last = action
        return self.env.step(action)


def set_time_limit(env: gym.Env, max_episode_steps: int) -> gym.Env:
    """Set the episode time limit: change the env's own ``TimeLimit`` if it has one, else add one."""
    if int(max_episode_steps) <= 0:
        raise EnvError(f"time_limit needs max_episode_steps > 0, got {max_episode_steps}")
    inner = env
    while isinstance(inner, gym.Wrapper):
        if isinstance(inner, TimeLimit):
            inner._max_episode_steps = int(max_episode_steps)  # the registered limit; longer ones need this
            return env
        inner = inner.env
    return TimeLimit(env, max_episode_steps=int(max_episode_steps))


class HiddenSetup(gym.Wrapper):
    """Veils hidden (fault) setup wrappers: what passes outward carries none of their reward terms.

    ``info["reward_components"]`` gathered inside is dropped, so rollouts and
    signatures never see the fault's own terms; ``info["original_reward"]``
    stays, because Remedy's own measurement of the task reads it, and patch
    wrappers that find this veil in their chain (:func:`fault_hidden`) strip it
    from the ``info`` they hand to patch code.
    """

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if REWARD_COMPONENTS_KEY in info:
            info = {k: v for k, v in info.items() if k != REWARD_COMPONENTS_KEY}
        return obs, reward, terminated, truncated, info


def fault_hidden(env: gym.Env) -> bool:
    """True when ``env``'s wrapper chain holds a :class:`HiddenSetup` (a bench patient's veiled fault)."""
    inner = env
    while isinstance(inner, gym.Wrapper):
        if isinstance(inner, HiddenSetup):
            return True
        inner = inner.env
    return False


WRAPPERS: dict[str, WrapperEntry] = {
    "obs_scale": WrapperEntry(ObsScale, "observation"),
    "obs_noise": WrapperEntry(ObsNoise, "observation"),
    "reward_scale": WrapperEntry(RewardScale, "reward"),
    "reward_noise": WrapperEntry(RewardNoise, "reward"),
    "survival_reward": WrapperEntry(SurvivalReward, "reward"),
    "exploitable_shaping": WrapperEntry(ExploitableShaping, "reward"),
    # A setup time limit is a training choice; evaluation uses the task's own horizon.
    "time_limit": WrapperEntry(set_time_limit, "training"),
    "action_noise": WrapperEntry(ActionNoise, "dynamics"),
    "sticky_actions": WrapperEntry(StickyActions, "dynamics"),
    "action_scale": WrapperEntry(ActionScale, "dynamics"),
}


def wrapper_kinds() -> list[str]:
    """Registered setup-wrapper kinds."""
    return list(WRAPPERS)


def _entry(kind: str) -> WrapperEntry:
    if kind not in WRAPPERS:
        close = difflib.get_close_matches(kind, list(WRAPPERS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else f"; known kinds: {', '.join(WRAPPERS)}"
        raise EnvError(f"unknown wrapper kind '{kind}'{hint}")
    return WRAPPERS[kind]


def apply_wrappers(env: gym.Env, specs: Sequence[WrapperSpec | dict], *, for_evaluation: bool = False) -> gym.Env:
    """Wrap ``env`` with ``specs`` in order (first spec innermost).

    ``for_evaluation`` drops wrappers that only change the reward (so the env pays
    the original task reward) and training-only choices such as a setup time limit; observation and dynamics wrappers stay (the agent
    was trained on them and its spaces depend on them). When any spec is
    ``hidden``, the whole setup chain is veiled by :class:`HiddenSetup`.
    """
    hidden = False
    for raw in specs:
        spec = raw if isinstance(raw, WrapperSpec) else WrapperSpec.model_validate(raw)
        hidden = hidden or spec.hidden
        entry = _entry(spec.kind)
        if for_evaluation and entry.affects in ("reward", "training"):
            continue
        try:
            env = entry.factory(env, **spec.params)
        except TypeError as ex:
            raise EnvError(f"wrapper '{spec.kind}' got bad params {spec.params}: {ex}") from ex
    return HiddenSetup(env) if hidden else env
