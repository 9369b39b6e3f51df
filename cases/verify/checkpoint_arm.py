"""The control arm of a pure budget patch, evaluated in-process from a session's rollout cache.

A patch that only adds training steps is compared with the unpatched checkpoint
(``budget_vs_none``): its control arm trains nothing, it only evaluates the
checkpoint on the original task at the arms' evaluation seeds. As a worker job
that is a process start, a copy of the checkpoint and fresh episodes each time;
here it is the same rollouts (:func:`remedy.cases.verify.arms.evaluate_trained`
with no patch: evaluation view, deterministic, no trajectories kept), taken from
a :class:`~remedy.cases.evidence.rollcache.RolloutCache` so a session computes
them once. The control runs no patch code, so it needs no sandbox.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ..evidence.envs import make_env
from ..evidence.rollcache import rollout_key
from ..evidence.rollouts import rollout
from .arms import ArmResult, ArmSpec, Scores, _obs_normalizer, _scores

if TYPE_CHECKING:
    import gymnasium as gym
    from stable_baselines3.common.base_class import BaseAlgorithm
    from stable_baselines3.common.vec_env import VecNormalize

    from ..evidence.rollcache import RolloutCache
    from ..evidence.rundir import RunDir

__all__ = ["checkpoint_control"]


def _evaluation(run: RunDir, spec: ArmSpec, cache: RolloutCache, kwargs: dict | None, model: _Lazy) -> Scores:
    c = run.config

    def factory() -> gym.Env:
        kw = c.env_kwargs if kwargs is None else kwargs
        return make_env(c.env_id, kw, wrappers=c.wrappers, for_evaluation=True, max_episode_steps=c.max_episode_steps)

    def compute(keep: int) -> list:
        return rollout(
            model(),
            factory,
            n_episodes=spec.eval_episodes,
            seed=spec.eval_seed,
            deterministic=True,
            success=c.success,
            constraints=c.constraints,
            keep_trajectories=keep,
            vecnormalize=model.vecnormalize(),
        )

    key = rollout_key(
        run,
        n_episodes=spec.eval_episodes,
        seed=spec.eval_seed,
        deterministic=True,
        for_evaluation=True,
        env_kwargs=kwargs,
    )
    return _scores(cache.get_or_compute(key, compute, 0))


class _Lazy:
    """The checkpoint and its VecNormalize, loaded on the first cache miss only."""

    def __init__(self, run: RunDir) -> None:
        self.run = run
        self._loaded: tuple[BaseAlgorithm, VecNormalize | None] | None = None

    def __call__(self) -> BaseAlgorithm:
        return self._load()[0]

    def vecnormalize(self) -> VecNormalize | None:
        return self._load()[1]

    def _load(self) -> tuple[BaseAlgorithm, VecNormalize | None]:
        if self._loaded is None:
            self._loaded = (self.run.load_model(), _obs_normalizer(self.run))
        return self._loaded


def checkpoint_control(run: RunDir, spec: ArmSpec, cache: RolloutCache) -> ArmResult:
    """The checkpoint-control arm ``spec`` describes (no patch, no budget), its episodes from ``cache``."""
    if spec.patch_json is not None or spec.budget_steps != 0 or spec.score_patch_json is not None:
        raise ValueError("only the unpatched, untrained checkpoint control is evaluated in-process")
    model = _Lazy(run)
    nominal = _evaluation(run, spec, cache, None, model)
    shifted = {
        name: _evaluation(run, spec, cache, {**run.config.env_kwargs, **json.loads(kw)}, model)
        for name, kw in spec.shifted
    }
    return ArmResult(arm=spec.arm, seed=spec.seed, env_steps=0, train_wall_s=0.0, nominal=nominal, shifted=shifted)
