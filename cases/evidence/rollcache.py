"""Rollouts once: episodes of the same unmodified agent, computed once per session and reused.

A fix loop rolls the same checkpoint out many times over: every round's diagnosis
collects evidence at the same seeds, every verification (screen and confirmation of
each candidate) collects the evidence its case records, and a pure budget patch's
control arm evaluates the checkpoint itself. Rollouts of a fixed checkpoint on a fixed
env at fixed seeds are a deterministic computation (the env is reset with each
episode's seed and torch's RNG is seeded first), so a session keeps them here.

An entry is keyed by everything that decides the episodes: the checkpoint's and the
VecNormalize statistics' SHA-256, the env as the agent sees it (id, kwargs, time limit,
the setup wrappers actually applied in that view, whether a hidden fault veils them),
the success definition and constraints, the number of episodes, the first seed, the
deterministic flag, and the code version (Remedy's version and a hash of the modules
that roll out). The training view and the evaluation view share an entry exactly when
the evaluation view drops no wrapper. Nothing is looked up by a partial match.

The cache lives in memory, for one session (a fix loop); it counts what it saved.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from .episodes import EpisodeRecord
from .wrappers import WRAPPERS, WrapperSpec

__all__ = ["RolloutCache", "RolloutSavings", "rollout_key", "rollout_code_version", "ROLLOUT_CODE_MODULES"]

#: modules whose source decides a rollout's episodes; their hash is part of every key
ROLLOUT_CODE_MODULES = (
    "rollouts.py",
    "episodes.py",
    "envs.py",
    "wrappers.py",
    "constraints.py",
    "progress.py",
    "../success.py",
)


@cache
def rollout_code_version() -> str:
    """Remedy's version and a hash of the modules that make envs and roll agents out."""
    try:
        remedy = version("remedy")
    except PackageNotFoundError:  # pragma: no cover - a source tree without metadata
        remedy = "unknown"
    h = hashlib.sha256(remedy.encode())
    here = Path(__file__).parent
    for name in ROLLOUT_CODE_MODULES:
        h.update((here / name).read_bytes())
    return f"{remedy}+{h.hexdigest()[:12]}"


def _sha256(path: Path | None) -> str | None:
    if path is None:
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _env_view(config: Any, for_evaluation: bool, env_kwargs: dict | None) -> dict[str, Any]:
    """The env as the agent sees it in this view: only the wrappers :func:`apply_wrappers` actually applies."""
    specs = [w if isinstance(w, WrapperSpec) else WrapperSpec.model_validate(w) for w in config.wrappers]
    applied = [
        s.model_dump(mode="json")
        for s in specs
        if not (for_evaluation and s.kind in WRAPPERS and WRAPPERS[s.kind].affects in ("reward", "training"))
    ]
    return {
        "env_id": config.env_id,
        "env_kwargs": config.env_kwargs if env_kwargs is None else env_kwargs,
        "max_episode_steps": config.max_episode_steps,
        "wrappers": applied,
        "hidden": any(s.hidden for s in specs),
    }


def rollout_key(
    run: Any,
    *,
    n_episodes: int,
    seed: int,
    deterministic: bool,
    for_evaluation: bool = False,
    env_kwargs: dict | None = None,
) -> str:
    """The cache key of rolling ``run``'s checkpoint out (see the module docstring); ``env_kwargs`` replaces
    the run's (a shifted variant)."""
    c = run.config
    fields = {
        "checkpoint": _sha256(run.model_path),
        "vecnormalize": _sha256(run.vecnormalize_path),
        "algo": c.algo,
        "env": _env_view(c, for_evaluation, env_kwargs),
        "success": c.success.model_dump(mode="json"),
        "constraints": [k.model_dump(mode="json") for k in c.constraints],
        "n_episodes": int(n_episodes),
        "seed": int(seed),
        "deterministic": bool(deterministic),
        "code": rollout_code_version(),
    }
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return "roll-" + hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class RolloutSavings:
    """What a session's rollout cache computed and what it reused instead of recomputing."""

    computed_episodes: int = 0
    reused_episodes: int = 0
    reused_env_steps: int = 0
    hits: int = 0
    misses: int = 0

    def as_dict(self) -> dict[str, int]:
        """JSON-ready counts."""
        return {
            "computed_episodes": self.computed_episodes,
            "reused_episodes": self.reused_episodes,
            "reused_env_steps": self.reused_env_steps,
            "hits": self.hits,
            "misses": self.misses,
        }


def _trimmed(records: list[EpisodeRecord], keep: int) -> list[EpisodeRecord]:
    """``records`` as a computation keeping trajectories for the first ``keep`` episodes would return them."""
    return [r if i < keep else replace(r, actions=None, observations=None, rewards=None) for i, r in enumerate(records)]


class RolloutCache:
    """Rollouts of unmodified checkpoints, in memory for one session, with counts of what reuse saved."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[int, list[EpisodeRecord]]] = {}  # key -> (trajectories kept, records)
        self._savings = RolloutSavings()

    @property
    def savings(self) -> RolloutSavings:
        """Counts so far."""
        return self._savings

    def get_or_compute(
        self, key: str, compute: Callable[[int], list[EpisodeRecord]], keep_trajectories: int = 0
    ) -> list[EpisodeRecord]:
        """The episodes of ``key``: cached, or ``compute(keep_trajectories)`` now (and kept for later calls).

        An entry computed keeping fewer trajectories than asked for is recomputed (and replaces it).
        """
        s = self._savings
        hit = self._entries.get(key)
        if hit is not None and hit[0] >= keep_trajectories:
            records = hit[1]
            steps = sum(r.length for r in records)
            self._savings = replace(
                s,
                hits=s.hits + 1,
                reused_episodes=s.reused_episodes + len(records),
                reused_env_steps=s.reused_env_steps + steps,
            )
            return _trimmed(records, keep_trajectories)
        records = compute(keep_trajectories)
        self._entries[key] = (keep_trajectories, records)
        self._savings = replace(s, misses=s.misses + 1, computed_episodes=s.computed_episodes + len(records))
        return list(records)
