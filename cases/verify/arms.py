"""What runs inside a verification worker: one arm's fine-tune and evaluation, and the preference check.

Everything here crosses a process boundary (``run_limited``, a Ray task), so
inputs are plain values (:class:`ArmSpec`: paths, JSON text, numbers) and so
are outputs (:class:`ArmResult`, :class:`Scores`, :class:`PreferenceResult`).
Evaluation is always on the ORIGINAL task: the run's env with
``for_evaluation=True`` (fault and reward wrappers dropped, observation
wrappers kept), its success definition and its safety constraints.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..evidence.envs import env_traits, make_env
from ..evidence.rollouts import rollout
from ..evidence.rundir import RunDir
from ..patches.apply import PatchPlan, make_patched_env_fn
from ..patches.kinds import control_wrapper
from ..patches.spec import Patch, PatchPart, RewardShaping
from .training import finetune

if TYPE_CHECKING:
    import gymnasium as gym
    from stable_baselines3.common.base_class import BaseAlgorithm
    from stable_baselines3.common.vec_env import VecNormalize

    from ..evidence.rollouts import EpisodeRecord

__all__ = [
    "ARM_JOB",
    "EVAL_JOB",
    "ArmSpec",
    "Scores",
    "ArmResult",
    "PreferenceResult",
    "run_arm",
    "evaluate_trained",
    "preference_check",
    "preference_verdict",
    "trajectory_verdict",
    "task_measures",
    "task_ordered_pairs",
    "PREFERENCE_MIN",
    "PREFERENCE_TIE_FRACTION",
]

#: import path of the job function each arm runs in a worker.
ARM_JOB = "remedy.cases.verify.arms:run_arm"
#: import path of the job that only evaluates an arm trained earlier (a cached control).
EVAL_JOB = "remedy.cases.verify.arms:evaluate_trained"
#: on the episode pairs the task orders, the shaped return must agree more often than this (ties count
#: half): 0.5 is a reward that is blind to the task's order (Kendall's tau 0); below it, one that reverses it.
PREFERENCE_MIN = 0.5
#: differences within this fraction of a measure's range over the evidence episodes are ties.
PREFERENCE_TIE_FRACTION = 0.02
#: what the task says about an episode, each larger = better; NaN where the run does not define it.
TASK_MEASURES = ("success", "task return", "progress", "success margin", "fewer violations")


@dataclass(frozen=True)
class ArmSpec:
    """Everything one arm job needs; plain values only so it pickles into any worker."""

    arm: str  # "treatment" or "control"
    seed: int
    run_dir: str
    patch_json: str | None
    budget_steps: int
    n_envs: int
    learning_rate: float | None
    eval_episodes: int
    eval_seed: int
    out_dir: str
    shifted: tuple[tuple[str, str], ...] = ()  # (name, env_kwargs JSON)
    score_patch_json: str | None = None  # evaluate the shaped return under this patch too
    #: go on from this run directory (an earlier run of the same arm, e.g. a race's stage 1) instead of the
    #: checkpoint; ``done_steps`` of the arm's steps count as trained (:func:`~.training.finetune`)
    start_dir: str | None = None
    done_steps: int = 0


@dataclass(frozen=True)
class Scores:
    """Per-episode evaluation results of one agent on one env variant."""

    returns: tuple[float, ...]
    successes: tuple[float, ...]
    violations: tuple[float, ...]
    nan: bool = False

    @property
    def finite(self) -> bool:
        """True when every return is a finite number and no NaN was seen."""
        return not self.nan and bool(self.returns) and all(math.isfinite(r) for r in self.returns)


@dataclass(frozen=True)
class ArmResult:
    """What one arm job returns: training cost, and scores on the original task and variants."""

    arm: str
    seed: int
    env_steps: int
    train_wall_s: float
    diverged: bool = False
    reason: str = ""
    nominal: Scores | None = None
    shifted: dict[str, Scores] = field(default_factory=dict)
    shaped_returns: tuple[float, ...] | None = None
    shaped_return_train: float | None = None


def _scores(records: Sequence[EpisodeRecord]) -> Scores:
    return Scores(
        returns=tuple(float(r.ret) for r in records),
        successes=tuple(float(bool(r.success)) for r in records),
        violations=tuple(float(r.violations) for r in records),
        nan=any(bool(getattr(r, "nan", False)) for r in records),
    )


def _obs_normalizer(run: RunDir) -> VecNormalize | None:
    """The run's saved VecNormalize (frozen) for normalizing observations in rollouts, or None."""
    if run.vecnormalize_path is None:
        return None
    from stable_baselines3.common.vec_env import DummyVecEnv

    return run.load_vecnormalize(DummyVecEnv([run.make_env]))


def _evaluate(
    model: BaseAlgorithm, factory: Callable[[], gym.Env], run: RunDir, spec: ArmSpec, vecnormalize: VecNormalize | None
) -> Scores:
    c = run.config
    records = rollout(
        model,
        factory,
        n_episodes=spec.eval_episodes,
        seed=spec.eval_seed,
        deterministic=True,
        success=c.success,
        constraints=c.constraints,
        keep_trajectories=0,
        vecnormalize=vecnormalize,
    )
    return _scores(records)


def _shaped_returns(
    model: BaseAlgorithm, run: RunDir, spec: ArmSpec, vecnormalize: VecNormalize | None
) -> tuple[float, ...]:
    """Returns under the treatment's training reward (patched env), for the reward-hacking test."""
    c = run.config
    patch = Patch.model_validate_json(spec.score_patch_json or "")
    plan = PatchPlan.from_patch(patch, env_traits(c.env_id, c.env_kwargs), c.algo)
    factory = make_patched_env_fn(c.env_id, c.env_kwargs, c.wrappers, plan, None, max_episode_steps=c.max_episode_steps)
    records = rollout(
        model,
        factory,
        n_episodes=spec.eval_episodes,
        seed=spec.eval_seed,
        deterministic=True,
        success=c.success,
        constraints=(),
        keep_trajectories=0,
        vecnormalize=vecnormalize,
    )
    return tuple(float(r.train_ret) for r in records)


def _control_wrapper(patch_json: str | None) -> Callable[[gym.Env], gym.Env]:
    """How the agent acts on the evaluation env: through the parts of the patch that the patch-kind registry
    marks as part of its control interface (an action repeat, like an observation wrapper), else unchanged.
    Original rewards are summed over repeated steps, so returns stay on the original task's scale."""
    return control_wrapper(Patch.model_validate_json(patch_json) if patch_json is not None else None)


def run_arm(spec: ArmSpec) -> ArmResult:
    """Fine-tune one arm (see :func:`remedy.cases.verify.training.finetune`) and evaluate it; a worker job."""
    _absolute(spec.run_dir, "run_dir")
    _absolute(spec.out_dir, "out_dir")
    if spec.start_dir is not None:
        _absolute(spec.start_dir, "start_dir")
    ft = finetune(
        spec.run_dir,
        spec.patch_json,
        budget_steps=spec.budget_steps,
        seed=spec.seed,
        n_envs=spec.n_envs,
        out_dir=spec.out_dir,
        learning_rate=spec.learning_rate,
        start_dir=spec.start_dir,
        done_steps=spec.done_steps,
    )
    if ft.diverged:
        return ArmResult(
            arm=spec.arm,
            seed=spec.seed,
            env_steps=ft.env_steps,
            train_wall_s=ft.wall_time_s,
            shaped_return_train=ft.shaped_return_mean,
            diverged=True,
            reason=ft.reason or "training diverged",
        )
    assert ft.run_dir is not None  # finetune saves a run dir whenever training did not diverge
    return evaluate_trained(
        spec, ft.run_dir, env_steps=ft.env_steps, train_wall_s=ft.wall_time_s, shaped_train=ft.shaped_return_mean
    )


def evaluate_trained(
    spec: ArmSpec,
    trained_dir: str,
    *,
    env_steps: int = 0,
    train_wall_s: float = 0.0,
    shaped_train: float | None = None,
) -> ArmResult:
    """Evaluate an arm already trained into ``trained_dir`` (also a worker job: a cached control
    re-evaluated under a candidate's shaped reward costs episodes, no training)."""
    run = RunDir.load(_absolute(trained_dir, "trained_dir"))
    c = run.config
    model = run.load_model()
    vn = _obs_normalizer(run)
    control = _control_wrapper(spec.patch_json)
    nominal = _evaluate(model, lambda: control(run.make_env(for_evaluation=True)), run, spec, vn)
    shifted = {}
    for name, kwargs_json in spec.shifted:
        kwargs = {**c.env_kwargs, **json.loads(kwargs_json)}

        def factory(kw=kwargs):
            return control(
                make_env(
                    c.env_id,
                    kw,
                    wrappers=c.wrappers,
                    for_evaluation=True,
                    max_episode_steps=c.max_episode_steps,
                )
            )

        shifted[name] = _evaluate(model, factory, run, spec, vn)
    shaped = _shaped_returns(model, run, spec, vn) if spec.score_patch_json else None
    return ArmResult(
        arm=spec.arm,
        seed=spec.seed,
        env_steps=env_steps,
        train_wall_s=train_wall_s,
        shaped_return_train=shaped_train,
        nominal=nominal,
        shifted=shifted,
        shaped_returns=shaped,
    )


# --------------------------------------------------------------------------- trajectory preference check


@dataclass(frozen=True)
class PreferenceResult:
    """Does the shaped return order the evidence episodes the way the task does?

    ``prob`` is the agreement: over the episode pairs the task orders, the
    fraction the shaped return orders the same way (a tie between a success
    and a failure counts half; ties between episodes of equal success are left
    out); None when nothing is left to compare (undecidable, passes).
    """

    ok: bool
    prob: float | None
    n_success: int
    n_failed: int
    message: str
    n_pairs: int = 0

    @property
    def status(self) -> str:
        """``passed``, ``refused`` or ``undecidable`` (the value stored in ``Verification.preference``)."""
        return "undecidable" if self.prob is None and self.ok else "passed" if self.ok else "refused"


def task_measures(record: EpisodeRecord) -> tuple[float, ...]:
    """One evidence episode as :data:`TASK_MEASURES`: success, original return, best progress on the env's
    own measure, the success definition's own margin, minus constraint violations (NaN = not defined)."""
    stats = getattr(record, "stats", {}) or {}
    return (
        float(bool(record.success)),
        float(record.ret),
        float(stats.get("progress_max", math.nan)),
        float(stats.get("success_margin", math.nan)),
        -float(record.violations),
    )


def _tolerances(values: Any) -> Any:
    """Per column: the tie tolerance, a fraction of the column's range over its finite values (0 if none)."""
    v = np.asarray(values, dtype=float)
    spans = []
    for col in v.T:
        finite = col[np.isfinite(col)]
        spans.append(float(finite.max() - finite.min()) if len(finite) else 0.0)
    return np.asarray(spans) * PREFERENCE_TIE_FRACTION


def task_ordered_pairs(measures: Sequence[Sequence[float]]) -> list[tuple[int, int]]:
    """Pairs ``(i, j)`` where episode i is better for the task than episode j.

    Better means at least as good on every measure both episodes define and
    clearly better (beyond a tie tolerance) on at least one (Pareto
    dominance), so measures that disagree, e.g. a crash with a higher return
    than a timeout with a better final state, order nothing.
    """
    m = np.asarray(measures, dtype=float)
    if m.ndim != 2 or len(m) < 2:
        return []
    tol = _tolerances(m)
    diff = m[:, None, :] - m[None, :, :]  # diff[i, j] = m_i - m_j
    both = np.isfinite(diff)
    not_worse = np.all(~both | (diff >= -tol), axis=2)
    better = np.any(both & (diff > tol), axis=2)
    i, j = np.nonzero(not_worse & better)
    return list(zip(i.tolist(), j.tolist()))


def trajectory_verdict(measures: Sequence[Sequence[float]], shaped: Sequence[float]) -> PreferenceResult:
    """Verdict of the trajectory check from each episode's task measures and its shaped (patched) return."""
    n_success = sum(1 for m in measures if m[0] >= 1.0)
    n_failed = len(measures) - n_success
    if not all(math.isfinite(x) for x in shaped):
        return PreferenceResult(False, None, n_success, n_failed, "shaped return is not finite on evidence episodes")
    pairs = task_ordered_pairs(measures)
    if not pairs:
        return PreferenceResult(
            True,
            None,
            n_success,
            n_failed,
            "preference check undecidable: the task orders no pair of evidence episodes",
        )
    s = np.asarray(shaped, dtype=float)
    tol = float(_tolerances(s[:, None])[0])
    d = np.asarray([s[i] - s[j] for i, j in pairs])
    # a success must be paid more than a failure (a tie there counts half); among episodes of the same
    # success, a reward may be indifferent (a sparse reward is, by design): only its contradictions count
    success_pair = np.asarray([measures[i][0] != measures[j][0] for i, j in pairs])
    tie = np.abs(d) <= tol
    counted = success_pair | ~tie
    if not counted.any():
        return PreferenceResult(
            True,
            None,
            n_success,
            n_failed,
            f"preference check undecidable: the shaped reward does not distinguish the "
            f"{len(pairs)} episode pairs the task orders",
            n_pairs=len(pairs),
        )
    agree = float((np.sum(d > tol) + 0.5 * np.sum(tie & success_pair)) / np.sum(counted))
    ok = agree > PREFERENCE_MIN
    verdict = "agrees" if ok else "does not agree"
    msg = (
        f"shaped reward {verdict} with the task's order of evidence episodes ({agree:.0%} of {len(pairs)} "
        f"ordered pairs; {n_success} successes, {n_failed} failures)"
    )
    return PreferenceResult(ok, agree, n_success, n_failed, msg, n_pairs=len(pairs))


def preference_check(run_dir: str, patch_json: str, n_episodes: int, seed: int) -> PreferenceResult:
    """Replay the evidence episodes (same agent, same seeds) under the patch's reward; a worker job.

    Only the patch's reward-shaping parts are applied, so the episodes are the
    evidence episodes themselves and only their rewards change; both the
    deterministic and the stochastic policy are rolled out, as in evidence.
    The shaped returns must order the episodes as the task does
    (:func:`trajectory_verdict`): on a failing agent that is still decided by
    task return, progress, the success definition's margin and violations.
    Undecidable only when the task orders no pair (all tied).
    """
    records = replay_under_reward(
        RunDir.load(_absolute(run_dir, "run_dir")), Patch.model_validate_json(patch_json), n_episodes, seed
    )
    return trajectory_verdict([task_measures(r) for r in records], [r.train_ret for r in records])


def _absolute(path: str, what: str) -> str:
    """``path``, refused unless absolute: a worker runs in its own scratch directory, so a relative
    path would silently name a folder that does not exist there (resolve it before the job starts)."""
    if not Path(path).is_absolute():
        raise ValueError(f"{what} {path!r} reached a worker as a relative path; resolve it before the job starts")
    return path


def replay_under_reward(run: RunDir, patch: Patch, n_episodes: int, seed: int) -> list[EpisodeRecord]:
    """The evidence episodes (deterministic and stochastic, same seeds) with only ``patch``'s reward-shaping
    parts applied, so only their training rewards change; episodes that diverged to NaN are dropped."""
    c = run.config
    shaping: list[PatchPart] = [p for p in patch.parts if isinstance(p, RewardShaping)]
    plan = PatchPlan.from_patch(Patch(parts=shaping), env_traits(c.env_id, c.env_kwargs), c.algo)
    factory = make_patched_env_fn(c.env_id, c.env_kwargs, c.wrappers, plan, None, max_episode_steps=c.max_episode_steps)
    model, vn = run.load_model(), _obs_normalizer(run)
    return [
        r
        for det in (True, False)
        for r in rollout(
            model,
            factory,
            n_episodes=n_episodes,
            seed=seed,
            deterministic=det,
            success=c.success,
            constraints=c.constraints,
            keep_trajectories=0,
            vecnormalize=vn,
        )
        if not r.nan
    ]


def preference_verdict(good: list[float], bad: list[float]) -> PreferenceResult:
    """Verdict from shaped returns of successful (``good``) and failed (``bad``) episodes alone.

    The task orders every success above every failure and nothing else, so this
    is :func:`trajectory_verdict` with success as the only measure: it passes
    when P(good > bad) + 0.5 P(tie) exceeds :data:`PREFERENCE_MIN` (a constant
    reward fails) and is undecidable when one side is empty.
    """
    measures = [(1.0,)] * len(good) + [(0.0,)] * len(bad)
    return trajectory_verdict(measures, list(good) + list(bad))
