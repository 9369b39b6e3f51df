"""Making Gymnasium envs by id, with clear errors, setup wrappers and coarse traits.

Everything that builds an env for Remedy (evidence rollouts, fine-tuning arms,
fault scenarios) goes through :func:`make_env`, so an unknown id, bad kwargs or
a checkpoint whose spaces disagree with the env all end as one clear
:class:`~remedy.cases.errors.RemedyError` line.
"""

from __future__ import annotations

import difflib
import importlib
import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import TimeLimit

from ..errors import CheckpointError, EnvError
from ..model import ActionSpaceType, EnvTraits, RewardDensity
from .wrappers import WrapperSpec, apply_wrappers

__all__ = [
    "SPARSE_REWARD_ENVS",
    "CONTINUING_ENVS",
    "is_continuing",
    "registered_time_limit",
    "make_env",
    "env_traits",
    "traits_of_spaces",
    "time_limit_of",
    "check_spaces",
    "check_env_id",
    "suggest_env_id",
    "registered_env_ids",
]

#: envs whose reward says little until the goal is reached (prefix match on the id's name).
SPARSE_REWARD_ENVS: tuple[str, ...] = ("MountainCar", "MountainCarContinuous", "Acrobot", "FrozenLake")
#: envs without terminal states: every episode ends at the time limit, so timeouts say nothing there.
CONTINUING_ENVS: tuple[str, ...] = ("Pendulum", "HalfCheetah", "Swimmer", "Reacher", "Pusher", "HumanoidStandup")


def _base_name(env_id: str) -> str:
    return env_id.split(":")[-1].split("-v")[0]


def is_continuing(env_id: str) -> bool:
    """True for envs that never terminate (Pendulum, HalfCheetah, ...): episodes only end at the time limit."""
    return _base_name(env_id) in CONTINUING_ENVS


def registered_time_limit(env_id: str) -> int | None:
    """The time limit the env is registered with (None when unknown or unlimited)."""
    try:
        spec = gym.spec(_gym_id(env_id))
    except Exception:  # unknown ids, "module:id" not imported yet
        return None
    return int(spec.max_episode_steps) if spec.max_episode_steps else None


def registered_env_ids() -> list[str]:
    """Every id in Gymnasium's registry."""
    return list(gym.envs.registry.keys())


def suggest_env_id(env_id: str) -> str | None:
    """The registered id closest to ``env_id``, or None."""
    close = difflib.get_close_matches(env_id, registered_env_ids(), n=1, cutoff=0.6)
    return close[0] if close else None


#: "module:Env-v0" ids whose module a trusted caller imported in this process (see :func:`check_env_id`).
_TRUSTED_MODULE_IDS: set[str] = set()


def _gym_id(env_id: str) -> str:
    """The id to hand Gymnasium: ``module:Env-v0`` only once a trusted check imported the module, else
    ``Env-v0`` (Gymnasium imports any ``module:`` prefix it is given; a config must not choose imports)."""
    return env_id if env_id in _TRUSTED_MODULE_IDS else env_id.split(":", 1)[-1]


def check_env_id(env_id: str, *, trust: bool = False) -> None:
    """Raise :class:`EnvError` (with a did-you-mean) unless ``env_id`` is registered.

    A ``package.module:Env-v0`` id imports ``package.module`` only when ``trust`` is set (the
    user's own run, ``--trust-checkpoint``), and only counts once the import registered
    ``Env-v0``. Untrusted, the id passes only if ``Env-v0`` is already registered; nothing is imported.
    """
    if env_id in _TRUSTED_MODULE_IDS:  # imported by a trusted check earlier in this process
        return
    if ":" in env_id:
        module, name = env_id.split(":", 1)
        if not trust and name not in gym.envs.registry:
            raise EnvError(
                f"env '{env_id}' would import module '{module}', which a run directory may not choose; "
                "pass --trust-checkpoint if this is your own run (never in the service), or use a registered id"
            )
        if trust:
            _import_env_module(env_id, module, name)
        return
    if env_id not in gym.envs.registry:
        hint = suggest_env_id(env_id)
        tail = f"; did you mean '{hint}'?" if hint else "; check the id against `gymnasium.pprint_registry()`"
        raise EnvError(f"unknown env '{env_id}'{tail}")


def _import_env_module(env_id: str, module: str, name: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as ex:
        raise EnvError(f"cannot import '{module}' for env '{env_id}': {ex}") from ex
    if name not in gym.envs.registry:
        raise EnvError(f"importing '{module}' registered no env '{name}'; check the id in run.yaml")
    _TRUSTED_MODULE_IDS.add(env_id)


def make_env(
    env_id: str,
    env_kwargs: dict | None = None,
    *,
    wrappers: Sequence[WrapperSpec | dict] = (),
    for_evaluation: bool = False,
    max_episode_steps: int | None = None,
    seed: int | None = None,
) -> gym.Env:
    """Build ``env_id`` with ``env_kwargs``, then the setup ``wrappers`` (reward-only ones dropped for evaluation).

    ``max_episode_steps`` overrides the registered time limit. With ``seed`` the
    env is reset once with it and its action space seeded.
    """
    check_env_id(env_id)
    kwargs = dict(env_kwargs or {})
    try:
        env = gym.make(_gym_id(env_id), max_episode_steps=max_episode_steps, **kwargs)
    except TypeError as ex:
        raise EnvError(f"env '{env_id}' rejected env_kwargs {json.dumps(kwargs, default=str)}: {ex}") from ex
    except gym.error.Error as ex:
        raise EnvError(f"cannot make env '{env_id}': {ex}") from ex
    env = apply_wrappers(env, wrappers, for_evaluation=for_evaluation)
    if seed is not None:
        env.reset(seed=int(seed))
        env.action_space.seed(int(seed))
    return env


def _space_dim(space: gym.Space) -> int:
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(np.sum(space.nvec))
    shape = getattr(space, "shape", None) or ()
    return int(np.prod(shape)) if shape else 0


def traits_of_spaces(env_id: str, observation_space: gym.Space, action_space: gym.Space) -> EnvTraits:
    """Coarse traits from spaces plus the known sparse-reward table."""
    discrete = isinstance(action_space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary))
    name = _base_name(env_id)
    sparse = name in SPARSE_REWARD_ENVS or "sparse" in env_id.lower()
    return EnvTraits(
        action_space=ActionSpaceType.discrete if discrete else ActionSpaceType.continuous,
        obs_dim=_space_dim(observation_space),
        action_dim=_space_dim(action_space),
        reward_density=RewardDensity.sparse if sparse else RewardDensity.dense,
    )


@lru_cache(maxsize=64)
def _traits_cached(env_id: str, kwargs_json: str) -> EnvTraits:
    env = make_env(env_id, json.loads(kwargs_json))
    try:
        return traits_of_spaces(env_id, env.observation_space, env.action_space)
    finally:
        env.close()


def env_traits(env_id: str, env_kwargs: dict | None = None) -> EnvTraits:
    """Action-space type, observation size, action size and reward density of ``env_id``."""
    return _traits_cached(env_id, json.dumps(env_kwargs or {}, sort_keys=True, default=str))


def time_limit_of(env: Any) -> int | None:
    """The episode step limit of ``env`` (a gym env or a VecEnv's first env), or None when unlimited."""
    if hasattr(env, "envs"):  # DummyVecEnv
        env = env.envs[0]
    limit = None
    inner = env
    while isinstance(inner, gym.Wrapper):
        if isinstance(inner, TimeLimit):
            limit = inner._max_episode_steps  # outermost TimeLimit is the one seen first; inner may be shorter
            break
        inner = inner.env
    spec_limit = getattr(getattr(env, "spec", None), "max_episode_steps", None)
    return int(limit) if limit is not None else (int(spec_limit) if spec_limit else None)


def _space_text(space: gym.Space) -> str:
    return repr(space).replace("\n", " ")


def check_spaces(model: Any, env: Any) -> None:
    """Raise :class:`CheckpointError` when the model's observation or action space differs from the env's."""
    for what in ("observation_space", "action_space"):
        m_space, e_space = getattr(model, what), getattr(env, what)
        if not _spaces_match(m_space, e_space):
            raise CheckpointError(
                f"checkpoint {what.replace('_', ' ')} {_space_text(m_space)} does not match the env's "
                f"{_space_text(e_space)}; check env_id, env_kwargs and wrappers in run.yaml"
            )


def _spaces_match(a: gym.Space, b: gym.Space) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, gym.spaces.Box) and isinstance(b, gym.spaces.Box):
        # bounds may differ by float rounding after a save/load; shape and dtype matter, bounds roughly
        return (
            a.shape == b.shape
            and np.allclose(a.low, b.low, equal_nan=True)
            and np.allclose(a.high, b.high, equal_nan=True)
        )
    return a == b
