"""One evaluation episode as a rollout records it (its own module: the rollout cache keeps them too)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["EpisodeRecord"]


@dataclass(frozen=True)
class EpisodeRecord:
    """One evaluation episode.

    ``ret``/``rewards``/``final_reward`` use the ORIGINAL env reward; ``train_ret``
    the reward the agent was trained on (setup wrappers applied). ``actions``,
    ``observations`` and ``rewards`` are kept for the first ``keep_trajectories``
    episodes only; ``stats`` (action jerk, saturation, ...) and ``states2d`` (the
    first two observation dims, for coverage) are computed on every episode.
    """

    seed: int
    ret: float
    train_ret: float
    length: int
    terminated: bool
    truncated: bool
    success: bool
    final_reward: float
    violations: int = 0
    nan: bool = False
    actions: np.ndarray | None = None
    observations: np.ndarray | None = None
    rewards: np.ndarray | None = None
    reward_components: dict[str, np.ndarray] = field(default_factory=dict)
    stats: dict[str, float] = field(default_factory=dict)
    action_counts: np.ndarray | None = None
    states2d: np.ndarray | None = None
    deterministic: bool = True
    obs_dim_std: np.ndarray | None = None

    @property
    def termination(self) -> str:
        """``nan``, ``terminated``, ``truncated`` or ``running`` (neither flag; should not happen)."""
        if self.nan:
            return "nan"
        return "terminated" if self.terminated else "truncated" if self.truncated else "running"
