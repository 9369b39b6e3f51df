"""Does a patch fit this env and algorithm? The fit rules of every patch kind.

Each kind's rule is a function ``(part, FitContext) -> None`` that raises
:class:`PatchRejectedError` with a ``rule``; the registry
(:data:`remedy.cases.patches.kinds.PATCH_KINDS`) says which rule belongs to which
kind, and :func:`~remedy.cases.patches.kinds.check_fit` runs them. They refuse parts that cannot work here (a
smoothness penalty on discrete actions, ``ent_coef`` for DQN, a hyperparameter the
algorithm does not take, a learning rate of 5).
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium.spaces as S

from ..algos import get_algo
from ..errors import PatchRejectedError
from ..model import ActionSpaceType, EnvTraits
from .spec import Curriculum, ExplorationBonus, FrameStack, Hyperparameters, Normalization, TimeLimit

__all__ = [
    "FitContext",
    "ARCHITECTURE_HYPERPARAMETERS",
    "HYPERPARAMETER_RULES",
    "algo_hyperparameters",
    "needs_continuous_actions",
    "fit_exploration",
    "fit_hyperparameters",
    "fit_curriculum",
    "fit_time_limit",
    "fit_frame_stack",
    "fit_normalization",
]

#: constructor arguments that are not hyperparameters a patch may set (they fix the saved policy or the run).
_NOT_HYPERPARAMETERS = frozenset(
    {"self", "policy", "env", "policy_kwargs", "device", "seed", "_init_setup_model", "verbose"}
)


#: settings that build the policy's parameters: a checkpoint saved without them does not load into a model built with
#: them (nor the reverse), so a fine-tune of that checkpoint cannot take them. Refused at fit time, with the reason,
#: instead of found out when every treatment seed fails to load the checkpoint.
ARCHITECTURE_HYPERPARAMETERS: dict[str, str] = {
    "use_sde": "gSDE replaces the policy's action noise with a state-dependent noise layer, so its parameters differ",
    "sde_net_arch": "it adds a network for gSDE's noise features",
    "net_arch": "it sets the policy network's layers (a policy_kwargs entry)",
}


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _between(lo: float, hi: float, lo_open: bool = False) -> Callable[[Any], bool]:
    return lambda x: _number(x) and (lo < x if lo_open else lo <= x) and x <= hi


def _at_least(lo: int) -> Callable[[Any], bool]:
    return lambda x: _int(x) and x >= lo


def _positive_or_none(x: Any) -> bool:
    return x is None or (_number(x) and x > 0)


def _ent_coef(x: Any) -> bool:
    return (_number(x) and x >= 0) or (isinstance(x, str) and x.startswith("auto"))


def _train_freq(x: Any) -> bool:
    return _at_least(1)(x) or (isinstance(x, (list, tuple)) and len(x) == 2 and _at_least(1)(x[0]))


#: hyperparameter -> (test, what a valid value is). Values outside these are surely mistakes.
HYPERPARAMETER_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "learning_rate": (_between(0, 1, lo_open=True), "a number in (0, 1]"),
    "gamma": (_between(0, 1, lo_open=True), "a number in (0, 1]"),
    "gae_lambda": (_between(0, 1), "a number in [0, 1]"),
    "n_steps": (_at_least(1), "an integer >= 1"),
    "batch_size": (_at_least(1), "an integer >= 1"),
    "n_epochs": (_at_least(1), "an integer >= 1"),
    "clip_range": (_between(0, 1, lo_open=True), "a number in (0, 1]"),
    "clip_range_vf": (_positive_or_none, "null or a number > 0"),
    "ent_coef": (_ent_coef, "a number >= 0 (or 'auto' for SAC-like algorithms)"),
    "vf_coef": (lambda x: _number(x) and x >= 0, "a number >= 0"),
    "max_grad_norm": (lambda x: _number(x) and x > 0, "a number > 0"),
    "target_kl": (_positive_or_none, "null or a number > 0"),
    "buffer_size": (_at_least(1), "an integer >= 1"),
    "learning_starts": (_at_least(0), "an integer >= 0"),
    "tau": (_between(0, 1, lo_open=True), "a number in (0, 1]"),
    "train_freq": (_train_freq, "an integer >= 1 or [n, 'step'|'episode']"),
    "gradient_steps": (lambda x: _int(x) and (x == -1 or x >= 1), "-1 or an integer >= 1"),
    "target_update_interval": (_at_least(1), "an integer >= 1"),
    "exploration_fraction": (_between(0, 1), "a number in [0, 1]"),
    "exploration_initial_eps": (_between(0, 1), "a number in [0, 1]"),
    "exploration_final_eps": (_between(0, 1), "a number in [0, 1]"),
    "policy_delay": (_at_least(1), "an integer >= 1"),
}


@dataclass(frozen=True)
class FitContext:
    """What a fit rule may look at: the env's traits, the algorithm and its accepted
    hyperparameters (None: skip algorithm checks), the observation space (None: skip the
    checks that need its type)."""

    traits: EnvTraits
    algo: str | None = None
    accepted: frozenset[str] | None = None
    observation_space: Any = None


# --------------------------------------------------------------------------- one rule per kind


def needs_continuous_actions(part: Any, ctx: FitContext) -> None:
    """Action penalties (smoothness, magnitude) need continuous actions."""
    if ActionSpaceType(ctx.traits.action_space) == ActionSpaceType.discrete:
        raise PatchRejectedError(
            f"{part.kind} penalizes continuous actions but this env's actions are discrete; "
            "use reward shaping or hyperparameters instead",
            rule=f"{part.kind}_needs_continuous_actions",
        )


def fit_exploration(part: ExplorationBonus, ctx: FitContext) -> None:
    """An entropy coefficient only for algorithms that have one."""
    if part.ent_coef is not None:
        _check_ent_coef(ctx.algo, ctx.accepted)


def fit_hyperparameters(part: Hyperparameters, ctx: FitContext) -> None:
    """Every change names a hyperparameter the algorithm takes, with a sane value."""
    for name, value in part.changes.items():
        _check_hyperparameter(name, value, ctx.algo, ctx.accepted)


def fit_curriculum(part: Curriculum, ctx: FitContext) -> None:
    """Stage fractions sum to 1 (building each stage's env is :func:`check_patch`'s job)."""
    total = sum(s.fraction for s in part.stages)
    if abs(total - 1.0) > 1e-3:
        raise PatchRejectedError(
            f"curriculum stage fractions sum to {total:g}; make them sum to 1", rule="curriculum_fractions"
        )


def fit_time_limit(part: TimeLimit, ctx: FitContext) -> None:
    """A time limit of at least one step."""
    if part.max_episode_steps < 1:
        raise PatchRejectedError("time limit must be at least 1 step", rule="time_limit_too_short")


def fit_frame_stack(part: FrameStack, ctx: FitContext) -> None:
    """Frame stacking needs a Box observation space."""
    if ctx.observation_space is not None and not isinstance(ctx.observation_space, S.Box):
        raise PatchRejectedError(
            f"frame stacking needs a Box observation space, this env has {type(ctx.observation_space).__name__}",
            rule="frame_stack_needs_box",
        )


def fit_normalization(part: Normalization, ctx: FitContext) -> None:
    """Observation normalization needs a Box (or Dict) observation space."""
    space = ctx.observation_space
    if space is not None and part.obs and not isinstance(space, (S.Box, S.Dict)):
        raise PatchRejectedError(
            f"observation normalization needs a Box observation space, this env has "
            f"{type(space).__name__}; set obs: false",
            rule="normalization_needs_box",
        )


def algo_hyperparameters(algo: str) -> frozenset[str]:
    """Constructor arguments of ``algo`` (SB3/sb3-contrib) that a patch may set."""
    cls = get_algo(algo)
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters
        names |= {n for n, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            break  # the concrete class lists everything it forwards
    return frozenset(names - _NOT_HYPERPARAMETERS)


def _check_ent_coef(algo: str | None, accepted: frozenset[str] | None) -> None:
    if accepted is not None and "ent_coef" not in accepted:
        raise PatchRejectedError(
            f"{algo} has no entropy coefficient (ent_coef); for more exploration use a count bonus or "
            "its own exploration settings (e.g. exploration_final_eps for DQN, action noise for TD3)",
            rule="ent_coef_unsupported",
        )


def _check_hyperparameter(name: str, value: Any, algo: str | None, accepted: frozenset[str] | None) -> None:
    if name in _NOT_HYPERPARAMETERS:
        raise PatchRejectedError(
            f"'{name}' cannot change in a fine-tune (the saved policy or the run depends on it); retrain instead",
            rule="frozen_hyperparameter",
        )
    if name in ARCHITECTURE_HYPERPARAMETERS:
        raise PatchRejectedError(
            f"'{name}' changes the policy's architecture ({ARCHITECTURE_HYPERPARAMETERS[name]}): the checkpoint "
            f"cannot load into a model built with it; drop '{name}' from the patch, or retrain from scratch",
            rule="architecture_hyperparameter",
        )
    if name == "ent_coef":
        _check_ent_coef(algo, accepted)
    if accepted is not None and name not in accepted:
        close = difflib.get_close_matches(name, sorted(accepted), n=2, cutoff=0.6)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise PatchRejectedError(f"{algo} has no hyperparameter '{name}'{hint}", rule="unknown_hyperparameter")
    if isinstance(value, float) and not math.isfinite(value):
        raise PatchRejectedError(
            f"hyperparameter '{name}' must be finite, got {value}", rule="non_finite_hyperparameter"
        )
    test, wanted = HYPERPARAMETER_RULES.get(name, (None, ""))
    if test is not None and not test(value):
        raise PatchRejectedError(
            f"hyperparameter '{name}' = {value!r} is not {wanted}", rule="bad_hyperparameter_value"
        )
