"""Is a patch fit to use? Fit checks against the env and algorithm, then the sandbox and a fuzz run.

:func:`check_fit` refuses parts that cannot work here (a smoothness penalty on
discrete actions, ``ent_coef`` for DQN, a hyperparameter the algorithm does not
take, a learning rate of 5). :func:`check_patch` adds, for every reward-shaping
part and safety predicate, the static sandbox check, compilation and a fuzz run
against the env's real spaces -- everything that can fail before training does.
Rejections are :class:`PatchRejectedError` with a ``rule``; ``check_patch``
turns them into a :class:`CheckReport`.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import PatchRejectedError
from .fuzz import FuzzReport, fuzz_predicate, fuzz_reward
from ..model import ActionSpaceType, EnvTraits
from .sandbox import compile_predicate, compile_reward
from .spec import (
    ActionMagnitude,
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
)

__all__ = ["CheckReport", "check_fit", "check_patch", "algo_hyperparameters", "HYPERPARAMETER_RULES"]

#: constructor arguments that are not hyperparameters a patch may set (they fix the saved policy or the run).
_NOT_HYPERPARAMETERS = frozenset({"self", "policy", "env", "policy_kwargs", "device", "seed", "_init_setup_model", "verbose"})


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
class CheckReport:
    """The verdict of :func:`check_patch`: accepted or the rule broken, and the fuzz figures."""

    ok: bool
    rule: str | None
    message: str
    fuzz: FuzzReport | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        fuzz = None
        if self.fuzz is not None:
            fuzz = {"calls": self.fuzz.calls, "max_call_ms": self.fuzz.max_call_ms, "problems": list(self.fuzz.problems)}
        return {"ok": self.ok, "rule": self.rule, "message": self.message, "fuzz": fuzz}


# --------------------------------------------------------------------------- fit


def algo_hyperparameters(algo: str) -> frozenset[str]:
    """Constructor arguments of ``algo`` (SB3/sb3-contrib) that a patch may set."""
    from ..algos import get_algo  # imports SB3 (and torch): only when an algorithm is named

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


def check_fit(
    patch: Patch,
    traits: EnvTraits,
    algo: str | None = None,
    *,
    observation_space: Any = None,
) -> None:
    """Raise :class:`PatchRejectedError` (with ``rule``) for the first part that does not fit the env/algorithm.

    ``algo`` (None: skip algorithm checks) is validated against its
    constructor; ``observation_space`` (optional) enables the checks that need
    the space's type (frame stack, observation normalization).
    """
    accepted = algo_hyperparameters(algo) if algo else None
    for part in patch.parts:
        _fit_actions(part, traits)
        _fit_algorithm(part, algo, accepted)
        _fit_env(part, observation_space)


def _fit_actions(part: Any, traits: EnvTraits) -> None:
    discrete = ActionSpaceType(traits.action_space) == ActionSpaceType.discrete
    if isinstance(part, (ActionSmoothness, ActionMagnitude)) and discrete:
        raise PatchRejectedError(
            f"{part.kind} penalizes continuous actions but this env's actions are discrete; "
            "use reward shaping or hyperparameters instead",
            rule=f"{part.kind}_needs_continuous_actions",
        )


def _fit_algorithm(part: Any, algo: str | None, accepted: frozenset[str] | None) -> None:
    if isinstance(part, ExplorationBonus) and part.ent_coef is not None:
        _check_ent_coef(algo, accepted)
    if isinstance(part, Hyperparameters):
        for name, value in part.changes.items():
            _check_hyperparameter(name, value, algo, accepted)


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
    if name == "ent_coef":
        _check_ent_coef(algo, accepted)
    if accepted is not None and name not in accepted:
        import difflib

        close = difflib.get_close_matches(name, sorted(accepted), n=2, cutoff=0.6)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise PatchRejectedError(f"{algo} has no hyperparameter '{name}'{hint}", rule="unknown_hyperparameter")
    if isinstance(value, float) and not math.isfinite(value):
        raise PatchRejectedError(f"hyperparameter '{name}' must be finite, got {value}", rule="non_finite_hyperparameter")
    test, wanted = HYPERPARAMETER_RULES.get(name, (None, ""))
    if test is not None and not test(value):
        raise PatchRejectedError(f"hyperparameter '{name}' = {value!r} is not {wanted}", rule="bad_hyperparameter_value")


def _fit_env(part: Any, observation_space: Any) -> None:
    if isinstance(part, Curriculum):
        total = sum(s.fraction for s in part.stages)
        if abs(total - 1.0) > 1e-3:
            raise PatchRejectedError(
                f"curriculum stage fractions sum to {total:g}; make them sum to 1", rule="curriculum_fractions"
            )
    if isinstance(part, TimeLimit) and part.max_episode_steps < 1:
        raise PatchRejectedError("time limit must be at least 1 step", rule="time_limit_too_short")
    if observation_space is None:
        return
    import gymnasium.spaces as S

    if isinstance(part, FrameStack) and not isinstance(observation_space, S.Box):
        raise PatchRejectedError(
            f"frame stacking needs a Box observation space, this env has {type(observation_space).__name__}",
            rule="frame_stack_needs_box",
        )
    if isinstance(part, Normalization) and part.obs and not isinstance(observation_space, (S.Box, S.Dict)):
        raise PatchRejectedError(
            f"observation normalization needs a Box observation space, this env has "
            f"{type(observation_space).__name__}; set obs: false",
            rule="normalization_needs_box",
        )


# --------------------------------------------------------------------------- the full check


def check_patch(
    patch: Patch,
    env_id: str,
    env_kwargs: dict | None = None,
    algo: str | None = None,
    *,
    n_random: int = 200,
    seed: int = 0,
    fuzz_timeout_s: float = 60.0,
) -> CheckReport:
    """Fit, static sandbox check, compile and fuzz every part of ``patch`` for ``env_id``.

    Returns a :class:`CheckReport` (rejections included); raises only for bad
    input that is not the patch's fault (unknown env or algorithm: EnvError,
    AlgorithmError).
    """
    obs_space, act_space, traits = _spaces(env_id, env_kwargs)
    reports: list[FuzzReport] = []
    try:
        check_fit(patch, traits, algo, observation_space=obs_space)
        _check_curriculum_stages(patch, env_id, env_kwargs or {}, obs_space, act_space)
        for part in patch.parts:
            report = _check_code_part(part, obs_space, act_space, n_random, seed, fuzz_timeout_s)
            if report is not None:
                reports.append(report)
    except PatchRejectedError as err:
        failed = getattr(err, "report", None)
        return CheckReport(False, err.rule or "rejected", str(err), _merge([*reports, failed] if failed else reports))
    return CheckReport(True, None, "accepted", _merge(reports))


def _check_curriculum_stages(patch: Patch, env_id: str, env_kwargs: dict, obs_space: Any, act_space: Any) -> None:
    """Build each curriculum stage's env now, so bad kwargs fail here and not after a control arm trained."""
    from ..evidence.envs import make_env
    from ..errors import EnvError

    for part in patch.parts:
        if not isinstance(part, Curriculum):
            continue
        for i, stage in enumerate(part.stages):
            kwargs = {**env_kwargs, **stage.env_kwargs}
            try:
                env = make_env(env_id, kwargs)
            except EnvError as err:
                raise PatchRejectedError(f"curriculum stage {i + 1} cannot build {env_id} with {stage.env_kwargs}: {err}",
                                         rule="curriculum_env_kwargs") from err
            same = env.observation_space == obs_space and env.action_space == act_space
            env.close()
            if not same:
                raise PatchRejectedError(f"curriculum stage {i + 1} ({stage.env_kwargs}) changes the observation or "
                                         "action space; stages may only change dynamics", rule="curriculum_env_kwargs")


def _check_code_part(part: Any, obs_space: Any, act_space: Any, n_random: int, seed: int, timeout_s: float) -> FuzzReport | None:
    if isinstance(part, RewardShaping):
        fn = compile_reward(part.code)
        return fuzz_reward(fn, obs_space, act_space, n_random=n_random, seed=seed, timeout_s=timeout_s)
    if isinstance(part, SafetyConstraint):
        pred = compile_predicate(part.predicate)
        return fuzz_predicate(pred, obs_space, act_space, n_random=max(1, n_random // 2), seed=seed, timeout_s=timeout_s)
    return None


def _merge(reports: list[FuzzReport]) -> FuzzReport | None:
    if not reports:
        return None
    return FuzzReport(
        calls=sum(r.calls for r in reports),
        max_call_ms=max(r.max_call_ms for r in reports),
        problems=[p for r in reports for p in r.problems],
    )


def _spaces(env_id: str, env_kwargs: dict | None) -> tuple[Any, Any, EnvTraits]:
    from ..evidence.envs import make_env, traits_of_spaces

    env = make_env(env_id, env_kwargs or {})
    try:
        return env.observation_space, env.action_space, traits_of_spaces(env_id, env.observation_space, env.action_space)
    finally:
        env.close()
