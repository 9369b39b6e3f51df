"""Task progress where the env defines it: how far toward the goal an agent gets, even when it fails.

A small table maps an env class to one physical quantity (MountainCar's car
position, Acrobot's tip height, LunarLander's altitude above the pad,
Pendulum's pole height) read from the UNWRAPPED env's state, so observation
wrappers (a scaled observation, a frame stack) cannot distort it. Progress is
that quantity scaled so the usual start level is 0 and the goal level is 1,
clipped to [0, 1]. A failing agent's progress is what it still shows: the
signature's ``progress_max``/``progress_final`` features and the trajectory
preference check both read it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

__all__ = ["ProgressMeasure", "PROGRESS_MEASURES", "progress_measure", "progress_of"]


@dataclass(frozen=True)
class ProgressMeasure:
    """One env's progress quantity: ``read(unwrapped_env)``, its start level and its goal level."""

    name: str
    read: Callable[[Any], float]
    start: float
    goal: float

    def progress(self, env: gym.Env) -> float:
        """Progress of ``env``'s current state: 0 at the start level, 1 at the goal level (clipped); NaN if unreadable."""
        try:
            q = float(self.read(env.unwrapped))
        except (AttributeError, TypeError, IndexError, ValueError):
            return math.nan
        if not math.isfinite(q):
            return math.nan
        return min(1.0, max(0.0, (q - self.start) / (self.goal - self.start)))


def _lander_altitude(env: Any) -> float:
    # the same normalization as LunarLander's obs[1]: ~1.4 at the start, 0 with the legs on the pad
    from gymnasium.envs.box2d.lunar_lander import LEG_DOWN, SCALE, VIEWPORT_H

    return (env.lander.position.y - (env.helipad_y + LEG_DOWN / SCALE)) / (VIEWPORT_H / SCALE / 2)


def _acrobot_tip(env: Any) -> float:
    # Gymnasium's own termination test: -cos(t1) - cos(t1 + t2) > 1
    s = env.state
    return -math.cos(s[0]) - math.cos(s[1] + s[0])


#: env class name -> its progress measure. Start levels are where resets put the agent.
PROGRESS_MEASURES: dict[str, ProgressMeasure] = {
    "MountainCarEnv": ProgressMeasure("car position", lambda e: e.state[0], -0.5, 0.5),
    "Continuous_MountainCarEnv": ProgressMeasure("car position", lambda e: e.state[0], -0.5, 0.45),
    "AcrobotEnv": ProgressMeasure("tip height", _acrobot_tip, -2.0, 1.0),
    "LunarLander": ProgressMeasure("altitude above the pad", _lander_altitude, 1.4, 0.0),
    "PendulumEnv": ProgressMeasure("pole height", lambda e: math.cos(e.state[0]), -1.0, 1.0),
}


def progress_measure(env: gym.Env) -> ProgressMeasure | None:
    """The progress measure of ``env`` (any wrapping), or None when the table has none for it."""
    return PROGRESS_MEASURES.get(type(env.unwrapped).__name__)


def progress_of(env: gym.Env) -> float:
    """Progress of ``env``'s current state, NaN when the env defines none."""
    m = progress_measure(env)
    return m.progress(env) if m is not None else math.nan
