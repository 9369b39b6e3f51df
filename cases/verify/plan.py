"""The jobs of one verification: what it knows before any job runs, and the arms it trains or reuses.

For each training seed a treatment and a control arm become executor jobs (:class:`Plan`); a
control may instead come from the shared control cache (:mod:`.controls`) or, for a pure budget
patch, from the session's rollouts of the checkpoint (:mod:`.checkpoint_arm`). A :class:`Resume`
lets a race's survivors go on from their stage-1 runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypedDict

from ..errors import VerificationError
from ..model import Signature, Stage, Subject
from ..patches.spec import Patch, RewardShaping
from ..patches.worker import Limits
from .arms import ARM_JOB, EVAL_JOB, ArmResult, ArmSpec
from .budgets import BudgetChoice
from .checkpoint_arm import checkpoint_control
from .config import VerifyConfig
from .controls import ControlCache, control_key
from .executors import Job, JobResult
from .training import arm_budgets

if TYPE_CHECKING:
    from ..evidence.rollcache import RolloutCache
    from ..evidence.rollouts import EvidenceBundle
    from ..evidence.rundir import RunDir
    from .scenarios import ShiftedEnv

__all__ = [
    "VerifyProgress",
    "Resume",
    "VerifyContext",
    "ScenarioLike",
    "ScenarioRef",
    "Plan",
    "job_limits",
    "shifted_variants",
    "plan_jobs",
    "keep_controls",
    "merge_plans",
]

#: ``progress(message, done, total)``: called at each stage and as each job finishes.
VerifyProgress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class Resume:
    """Arms that go on from earlier runs of the same arms (a race's stage 1, :mod:`.racing`) instead of
    starting from the checkpoint.

    ``starts`` maps a training seed to the run directories its treatment and control go on from (control
    None: the control is the checkpoint itself, as for a budget-only patch); ``treatment_steps`` and
    ``control_steps`` are the steps those runs already trained toward this verification's per-arm totals.
    A seed goes on in both arms or in neither, so each seed's pair follows one procedure and the arms
    keep equal env steps.
    """

    starts: dict[int, tuple[str, str | None]]
    treatment_steps: int
    control_steps: int


@dataclass
class VerifyContext:
    """What one verification knows before any job runs (internal)."""

    run: RunDir
    patch: Patch
    config: VerifyConfig
    budget: int
    subject: Subject
    evidence: EvidenceBundle
    signature: Signature
    scenario: str | None
    started: float
    progress: VerifyProgress | None
    notes: list[str] = field(default_factory=list)
    stage: Stage = Stage.screen
    confirms: str | None = None
    preference: str | None = None  # outcome of the trajectory check (Verification.preference)
    budget_choice: BudgetChoice | None = None  # where ``budget`` came from (Verification.budget_source)
    rollouts: RolloutCache | None = None  # the session's rollouts of the unmodified checkpoint, if shared
    resume: Resume | None = None  # arms that go on from earlier runs (a race's stage 1)

    def say(self, message: str, done: int = 0, total: int = 0) -> None:
        if self.progress is not None:
            self.progress(message, done, total)


def job_limits(config: VerifyConfig, steps: int, evaluations: int) -> Limits:
    # generous: a shared 2-core box may run PPO at ~100 steps/s; evaluation episodes are short
    wall = config.job_wall_s or 600.0 + steps / 50.0 + 5.0 * evaluations
    return Limits(cpu_s=2.0 * wall, memory_mb=config.job_memory_mb, wall_s=wall, no_network=True)


class ScenarioLike(Protocol):
    """What verification takes from a fault scenario (:class:`~remedy.cases.verify.scenarios.Scenario` is one):
    its name (stored in the case), shifted-env variants, and a declared fine-tuning budget."""

    @property
    def name(self) -> str: ...

    @property
    def shifted(self) -> Sequence[ShiftedEnv]: ...

    @property
    def finetune_budget(self) -> int | None: ...


@dataclass(frozen=True)
class ScenarioRef:
    """A scenario known by name only: no shifted variants, no declared budget."""

    name: str
    shifted: tuple[ShiftedEnv, ...] = ()
    finetune_budget: int | None = None


def shifted_variants(scenario: ScenarioLike | None) -> tuple[tuple[str, str], ...]:
    if scenario is None:
        return ()
    return tuple((v.name, json.dumps(v.env_kwargs, sort_keys=True, default=str)) for v in scenario.shifted)


@dataclass
class Plan:
    """The jobs of one verification, and the shared controls it rests on."""

    jobs: list[Job] = field(default_factory=list)
    reused: list[ArmResult] = field(default_factory=list)  # cached controls taken as they are (no job)
    train_keys: dict[str, str] = field(default_factory=dict)  # job id -> key of a control it trains for the cache
    controls: list[str] = field(default_factory=list)  # every shared-control key used
    n_reused: int = 0  # controls not trained here (taken as they are, or only re-evaluated)
    checkpoint_control: bool = False  # the control is the untrained checkpoint, evaluated on every seed's block


def plan_jobs(
    ctx: VerifyContext, shifted: tuple[tuple[str, str], ...], workdir: Path, seeds: range | None = None
) -> Plan:
    """The jobs of the training seeds ``seeds`` (indices from 0; None: all of ``config.seeds``)."""
    cfg = ctx.config
    cache = ControlCache(cfg.control_cache) if cfg.control_cache else None
    t_budget, c_budget = arm_budgets(ctx.patch, ctx.budget)
    control_is_checkpoint = c_budget == 0 and t_budget == 0
    reward_patch = any(isinstance(p, RewardShaping) for p in ctx.patch.parts)
    extra = sum(getattr(p, "extra_steps", 0) for p in ctx.patch.parts)
    limits = job_limits(cfg, max(t_budget, c_budget) + extra, cfg.eval_episodes * (2 + len(shifted)))
    run_dir = str(Path(ctx.run.path).resolve())
    run_yaml = (Path(run_dir) / "run.yaml").read_text()
    score_patch_json = ctx.patch.model_dump_json() if reward_patch else None
    plan = Plan(checkpoint_control=control_is_checkpoint)
    for i in seeds if seeds is not None else range(cfg.seeds):
        arms: list[tuple[str, str | None, int]] = [("treatment", ctx.patch.model_dump_json(), t_budget)]
        # every seed has a control, evaluated on that seed's block; a checkpoint control is the same agent
        # for every seed (no training), but each block is its own evaluation of it
        arms.append(("control", None, c_budget))
        for arm, patch_json, budget in arms:
            seed = cfg.seed_base + i + (cfg.control_seed_offset if arm == "control" else 0)
            spec = ArmSpec(
                arm=arm,
                seed=seed,
                patch_json=patch_json,
                budget_steps=budget,
                out_dir=str(workdir / f"{arm}-{seed}"),
                run_dir=run_dir,
                n_envs=cfg.n_envs,
                learning_rate=cfg.learning_rate,
                eval_episodes=cfg.eval_episodes,
                eval_seed=cfg.block_eval_seed(i),
                shifted=shifted,
                score_patch_json=score_patch_json,
                **_start(ctx.resume, cfg.seed_base + i, arm),
            )
            job = Job(id=f"{arm} seed {seed}", fn=ARM_JOB, kwargs={"spec": spec}, limits=limits)
            if control_is_checkpoint and arm == "control" and ctx.rollouts is not None:
                plan.reused.append(_checkpoint_control(ctx, spec))  # no job: the session's rollouts of the checkpoint
                continue
            if cache is not None and arm == "control":
                shared = _shared_control(plan, cache, job, spec, ctx.subject.checkpoint_sha256 or "", run_yaml)
                if shared is None:  # reused as it is: no job
                    continue
                job = shared
            plan.jobs.append(job)
    return plan


class _Start(TypedDict, total=False):
    """ArmSpec fields of an arm that goes on from an earlier run (none: it starts from the checkpoint)."""

    start_dir: str
    done_steps: int


def _start(resume: Resume | None, seed: int, arm: str) -> _Start:
    """Where the ``arm`` of training seed ``seed`` goes on from, as ArmSpec fields ({}: the checkpoint)."""
    if resume is None or seed not in resume.starts:
        return {}
    treatment, control = resume.starts[seed]
    if arm == "treatment":
        return {"start_dir": treatment, "done_steps": resume.treatment_steps}
    return {} if control is None else {"start_dir": control, "done_steps": resume.control_steps}


def _checkpoint_control(ctx: VerifyContext, spec: ArmSpec) -> ArmResult:
    if ctx.rollouts is None:
        raise VerificationError("the checkpoint control is evaluated in-process only with a rollout cache")
    return checkpoint_control(ctx.run, spec, ctx.rollouts)


def _shared_control(
    plan: Plan, cache: ControlCache, job: Job, spec: ArmSpec, checkpoint: str, run_yaml: str
) -> Job | None:
    """The job a control needs given the cache: none (reused), an evaluation only, or training for the cache."""
    key = control_key(spec, checkpoint, run_yaml)  # ignores out_dir and the scoring patch
    plan.controls.append(key)
    hit = cache.get(key)
    if hit is None:  # train it where the cache keeps it once it succeeds
        plan.train_keys[job.id] = key
        return replace(job, kwargs={"spec": replace(spec, out_dir=str(cache.scratch(key)))})
    plan.n_reused += 1
    if spec.score_patch_json is None:
        plan.reused.append(hit)
        return None
    # a reward patch: the control's return under the candidate's reward needs its episodes replayed
    return replace(job, fn=EVAL_JOB, kwargs={"spec": spec, "trained_dir": str(cache.run_dir(key))})


def keep_controls(plan: Plan, cache_root: str | None, results: Sequence[JobResult]) -> None:
    """Put the controls this verification trained into the shared cache."""
    if not cache_root:
        return
    cache = ControlCache(cache_root)
    for job, res in zip(plan.jobs, results):
        key = plan.train_keys.get(job.id)
        if key is not None and res.ok:
            cache.put(key, res.value, Path(job.kwargs["spec"].out_dir))


def merge_plans(a: Plan, b: Plan) -> Plan:
    """Two looks' plans as one (the jobs and controls of both)."""
    return Plan(
        jobs=a.jobs + b.jobs,
        reused=a.reused + b.reused,
        train_keys={**a.train_keys, **b.train_keys},
        controls=a.controls + b.controls,
        n_reused=a.n_reused + b.n_reused,
        checkpoint_control=b.checkpoint_control,
    )
