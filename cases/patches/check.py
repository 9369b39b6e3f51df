"""Is a patch fit to use? Fit checks against the env and algorithm, then the sandbox and a fuzz run.

:func:`check_fit` (the per-kind rules of :mod:`remedy.cases.patches.fit`, run by the registry) refuses parts
that cannot work here (a smoothness penalty on discrete actions, ``ent_coef`` for DQN, a
hyperparameter the algorithm does not take, a learning rate of 5). :func:`check_patch` adds, for every reward-shaping
part and safety predicate, the static sandbox check, compilation and a fuzz run
against the env's real spaces -- everything that can fail before training does.
Rejections are :class:`PatchRejectedError` with a ``rule``; ``check_patch``
turns them into a :class:`CheckReport`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import EnvError, PatchRejectedError
from ..evidence.envs import make_env, traits_of_spaces
from ..model import EnvTraits
from .fit import HYPERPARAMETER_RULES, algo_hyperparameters
from .fuzz import DEFAULT_FUZZ_CALLS, FuzzReport
from .kinds import check_fit, patch_kind
from .spec import Curriculum, Patch

__all__ = ["CheckReport", "check_fit", "check_patch", "algo_hyperparameters", "HYPERPARAMETER_RULES"]


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
            fuzz = {
                "calls": self.fuzz.calls,
                "max_call_ms": self.fuzz.max_call_ms,
                "problems": list(self.fuzz.problems),
            }
        return {"ok": self.ok, "rule": self.rule, "message": self.message, "fuzz": fuzz}


# --------------------------------------------------------------------------- the full check


def check_patch(
    patch: Patch,
    env_id: str,
    env_kwargs: dict | None = None,
    algo: str | None = None,
    *,
    n_random: int = DEFAULT_FUZZ_CALLS,
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
    for part in patch.parts:
        if not isinstance(part, Curriculum):
            continue
        for i, stage in enumerate(part.stages):
            kwargs = {**env_kwargs, **stage.env_kwargs}
            try:
                env = make_env(env_id, kwargs)
            except EnvError as err:
                raise PatchRejectedError(
                    f"curriculum stage {i + 1} cannot build {env_id} with {stage.env_kwargs}: {err}",
                    rule="curriculum_env_kwargs",
                ) from err
            same = env.observation_space == obs_space and env.action_space == act_space
            env.close()
            if not same:
                raise PatchRejectedError(
                    f"curriculum stage {i + 1} ({stage.env_kwargs}) changes the observation or "
                    "action space; stages may only change dynamics",
                    rule="curriculum_env_kwargs",
                )


def _check_code_part(
    part: Any, obs_space: Any, act_space: Any, n_random: int, seed: int, timeout_s: float
) -> FuzzReport | None:
    check = patch_kind(part.kind).code_check
    return None if check is None else check(part, obs_space, act_space, n_random, seed, timeout_s)


def _merge(reports: list[FuzzReport]) -> FuzzReport | None:
    if not reports:
        return None
    return FuzzReport(
        calls=sum(r.calls for r in reports),
        max_call_ms=max(r.max_call_ms for r in reports),
        problems=[p for r in reports for p in r.problems],
    )


def _spaces(env_id: str, env_kwargs: dict | None) -> tuple[Any, Any, EnvTraits]:
    env = make_env(env_id, env_kwargs or {})
    try:
        return (
            env.observation_space,
            env.action_space,
            traits_of_spaces(env_id, env.observation_space, env.action_space),
        )
    finally:
        env.close()
