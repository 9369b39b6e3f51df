"""Verification: does a patch help, measured against a same-budget control on the original task?

For each seed, two fine-tunes run as executor jobs: the treatment (checkpoint +
patch) and the control (checkpoint, no patch, same budget; for a patch that only
adds training steps, the control is the unpatched checkpoint itself). Each job
also evaluates its agent — on the ORIGINAL task (``for_evaluation=True``: fault
and reward wrappers dropped, observation wrappers kept), on each shifted-env
variant, and, for a reward-shaping patch, under the patched reward — so a job
is one process start and everything crossing the process boundary is a small
picklable value. The effect is treatment minus control over training seeds, with
a seed-level Welch t-interval (:mod:`remedy.cases.verify.stats`, which states the
method and the error it controls).

A verification is a **screen** or a **confirmation**. A screen whose interval
clears zero is stored as ``inconclusive`` with ``passed_screen``; only a
confirmation — the same patch re-verified on fresh training seeds (a disjoint
seed range) and fresh evaluation episodes — can end ``improved``
(:func:`verify_and_confirm`, and the fix loop). A trained arm with fewer than two
seeds is ``inconclusive``: one seed says nothing about seed-to-seed spread.

Cheap checks come first: the patch must pass :func:`check_patch` (static
sandbox rules, fuzzing, fit to env and algorithm), and a reward-shaping patch
must rank successful evidence episodes above failed ones (trajectory
preference check) unless ``force``. A refused patch, a crashed, timed-out or
diverged job, or a NaN evaluation yields a ``failed`` case with the reason and
no effect — never a zero score.
"""

from __future__ import annotations

import contextlib
import json
import platform
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..evidence.rollouts import collect_evidence, to_evidence
from ..evidence.rundir import RunDir
from ..evidence.signature import compute_signature
from ..model import Case, Provenance, Source, Stage, Status, Verification, new_case_id
from ..patches.check import check_patch
from ..patches.spec import Patch, RewardShaping
from ..patches.worker import run_limited
from . import stats
from .arms import preference_check
from .budgets import LearnedBudget, choose_budget
from .config import (
    CONFIRM_DESIGN,
    CONFIRM_DESIGNS,
    CONFIRM_EVAL_STRIDE,
    CONFIRM_SEEDS,
    EARLIER_SCREEN_CONFIDENCE,
    EVAL_BLOCK_STRIDE,
    SCREEN_CONFIDENCE,
    VerifyConfig,
)
from .executors import Executor, JobResult, get_executor
from .fixed import judge_verification
from .outcome import (
    arms_of,
    decide_status,
    look_note,
    look_verdict,
    measure_effects,
    per_seed_values,
    screen_test,
    seed_shortage,
    verdict,
    violation_rates,
)
from .plan import (
    Plan,
    Resume,
    ScenarioLike,
    ScenarioRef,
    VerifyContext,
    VerifyProgress,
    job_limits,
    keep_controls,
    merge_plans,
    plan_jobs,
    shifted_variants,
)
from .training import arm_budgets, arm_comparison

if TYPE_CHECKING:
    from ..evidence.rollcache import RolloutCache

# the config's constants, the plan's types and decide_status are re-exported: callers import them from here
__all__ = [
    "CONFIRM_EVAL_STRIDE",
    "CONFIRM_SEEDS",
    "CONFIRM_DESIGN",
    "CONFIRM_DESIGNS",
    "EARLIER_SCREEN_CONFIDENCE",
    "SCREEN_CONFIDENCE",
    "EVAL_BLOCK_STRIDE",
    "VerifyConfig",
    "VerifyProgress",
    "Resume",
    "verify_patch",
    "verify_and_confirm",
    "ScenarioLike",
    "ScenarioRef",
    "declared_budget",
    "BUILD_BUDGET_KEY",
    "decide_status",
    "versions",
]


def _precheck(ctx: VerifyContext) -> str:
    """Why the patch must not be trained ('' when it may): sandbox and fit, then trajectory preference."""
    c = ctx.run.config
    report = check_patch(ctx.patch, c.env_id, c.env_kwargs, c.algo)
    if not report.ok:
        return f"patch refused by pre-check ({report.rule}): {report.message}"
    if not any(isinstance(p, RewardShaping) for p in ctx.patch.parts):
        return ""
    try:
        pref = run_limited(
            preference_check,
            str(Path(ctx.run.path).resolve()),  # the worker runs in a scratch directory
            ctx.patch.model_dump_json(),
            ctx.config.eval_episodes,
            ctx.config.eval_seed,
            limits=job_limits(ctx.config, 0, 2 * ctx.config.eval_episodes),
        )
    except Exception as err:
        return f"trajectory preference check failed to run the reward code: {type(err).__name__}: {err}"
    ctx.notes.append(pref.message)
    ctx.preference = pref.status if pref.ok or not ctx.config.force else "forced"
    if pref.ok:
        return ""
    if ctx.config.force:
        ctx.notes.append("trained anyway (--force)")
        return ""
    return f"trajectory preference check failed: {pref.message}; pass --force to train it anyway"


def _base(ctx: VerifyContext, env_steps: int = 0) -> dict[str, Any]:
    """The verification fields every outcome records: seeds, budget, stage, the link to a screen."""
    cfg = ctx.config
    return dict(
        seeds=cfg.seeds,
        budget_steps=_treatment_steps(ctx),
        env_steps=env_steps,
        stage=ctx.stage,
        seed_base=cfg.seed_base,
        eval_seed=cfg.arms_eval_seed,
        confirms=ctx.confirms,
        comparison=arm_comparison(ctx.patch),
        preference=ctx.preference,
        resumed_seeds=_resumed(ctx),
        **_budget_record(ctx),
    )


def _resumed(ctx: VerifyContext) -> list[int]:
    """The training seeds of this verification whose arms went on from earlier runs (a race's stage 1)."""
    if ctx.resume is None:
        return []
    cfg = ctx.config
    return [s for s in range(cfg.seed_base, cfg.seed_base + cfg.seeds) if s in ctx.resume.starts]


def _budget_record(ctx: VerifyContext) -> dict[str, Any]:
    """Where the budget came from; a pure budget patch's arms train its own extra steps, whatever the budget."""
    choice = ctx.budget_choice
    if choice is None:
        return {}
    if arm_comparison(ctx.patch) == "budget_vs_none":
        return {"budget_source": "patch", "budget_cases": []}
    return {"budget_source": choice.source, "budget_cases": list(choice.cases)}


def _verification(ctx: VerifyContext, plan: Plan, results: Sequence[JobResult]) -> Verification:
    arms, failures, steps = arms_of(plan, results)
    shared = dict(controls=plan.controls, controls_reused=plan.n_reused)
    if failures or not arms["treatment"] or not arms["control"]:
        reason = "; ".join(failures) or "no arm produced a result"
        return Verification(
            status=Status.failed,
            reason=_reason(ctx, reason),
            wall_time_s=_elapsed(ctx),
            **_base(ctx, steps),
            **shared,
        )
    primary_name, effects = measure_effects(arms["treatment"], arms["control"], ctx.config)
    primary = effects[primary_name]
    status, passed, note = verdict(
        ctx, primary, effects.get("shaped_return"), seed_shortage(ctx, arms), screen_test(ctx, arms, primary_name)
    )
    summary = (
        f"{ctx.stage.value} {primary_name}: treatment {primary.treatment:.3g} vs control {primary.control:.3g}, "
        f"diff {primary.diff:+.3g} [{primary.ci_low:+.3g}, {primary.ci_high:+.3g}]" + (f"; {note}" if note else "")
    )
    return Verification(
        status=status,
        effect=primary,
        secondary={k: v for k, v in effects.items() if k != primary_name},
        safety_violations=violation_rates(arms) if ctx.run.config.constraints else {},
        per_seed=per_seed_values(arms, primary_name),
        reason=_reason(ctx, summary),
        wall_time_s=_elapsed(ctx),
        passed_screen=passed,
        **_base(ctx, steps),
        **shared,
    )


def _treatment_steps(ctx: VerifyContext) -> int:
    """Fine-tuning steps of one treatment run (a budget-only patch: its extra steps)."""
    return arm_budgets(ctx.patch, ctx.budget)[0] + sum(getattr(p, "extra_steps", 0) for p in ctx.patch.parts)


def _elapsed(ctx: VerifyContext) -> float:
    return max(0.0, time.perf_counter() - ctx.started)


def _reason(ctx: VerifyContext, text: str) -> str:
    return "; ".join([text, *ctx.notes])


def _case(ctx: VerifyContext, verification: Verification) -> Case:
    cfg = ctx.config
    key: tuple[object, ...] = (
        "verified",
        ctx.subject.checkpoint_sha256,
        ctx.patch.model_dump(mode="json"),
        ctx.scenario,
        cfg.seeds,
        ctx.budget,
        cfg.eval_episodes,
        cfg.n_envs,
        cfg.learning_rate,
        cfg.force,
        cfg.seed_base,
        cfg.eval_seed,
    )
    key = (*key, "eval_blocks")  # a block of evaluation episodes per seed: not the measurement of older cases
    if ctx.stage is Stage.screen and cfg.screen_confidence != cfg.confidence:
        key = (*key, "screen_level", cfg.screen_confidence)  # the same data, another pass decision
    if ctx.stage is Stage.confirm and (cfg.confirm_design == "sequential3" or cfg.confirm_alpha is not None):
        key = (*key, "design", cfg.confirm_design, cfg.confirm_alpha)  # another decision rule: not another's case
    if _resumed(ctx):  # arms that went on from a race's stage 1: another procedure than a fresh screen
        key = (*key, "resumed", *_resumed(ctx))
    if ctx.stage is not Stage.screen or cfg.arm_eval_seed is not None or cfg.control_seed_offset:
        key = (
            *key,
            ctx.stage.value,
            cfg.arms_eval_seed,
            ctx.confirms,
            cfg.control_seed_offset,
        )  # old screens keep their ids
    v = versions()
    return Case(
        case_id=new_case_id(*key),
        source=Source.verified,
        subject=ctx.subject,
        evidence=to_evidence(ctx.evidence),
        signature=ctx.signature,
        patch=ctx.patch,
        verification=verification,
        provenance=Provenance(remedy_version=v.get("remedy", ""), versions=v),
        scenario=ctx.scenario,
    )


def _context(
    run_dir: str | Path | RunDir,
    patch: Patch,
    config: VerifyConfig,
    scenario: ScenarioLike | None,
    progress: VerifyProgress | None,
    learned: LearnedBudget | None = None,
    rollouts: RolloutCache | None = None,
) -> VerifyContext:
    started = time.perf_counter()
    run = run_dir if isinstance(run_dir, RunDir) else RunDir.load(run_dir)
    subject = run.subject()
    choice = choose_budget(config, subject.train_steps, declared_budget(run, scenario), learned)
    if progress is not None:
        progress(f"budget {choice.text()}; collecting evidence", 0, 0)
    bundle = collect_evidence(run, n_episodes=config.eval_episodes, seed=config.eval_seed, cache=rollouts)
    name = scenario.name if scenario is not None else None
    return VerifyContext(
        run=run,
        patch=patch,
        config=config,
        budget=choice.steps,
        subject=subject,
        evidence=bundle,
        signature=compute_signature(bundle, subject),
        scenario=name,
        started=started,
        progress=progress,
        budget_choice=choice,
        rollouts=rollouts,
    )


def verify_patch(
    run_dir: str | Path | RunDir,
    patch: Patch,
    config: VerifyConfig | None = None,
    *,
    executor: Executor | None = None,
    scenario: ScenarioLike | None = None,
    progress: VerifyProgress | None = None,
    stage: Stage = Stage.screen,
    confirms: str | None = None,
    budget: LearnedBudget | None = None,
    rollouts: RolloutCache | None = None,
    arms_dir: str | Path | None = None,
    resume: Resume | None = None,
) -> Case:
    """Verify ``patch`` on the agent in ``run_dir`` (a RunDir or a path) and return the case; the caller stores it.

    Raises :class:`RemedyError` only for unusable input (missing run directory,
    corrupt checkpoint, bad settings); a patch that is refused, crashes, times
    out or diverges yields a ``failed`` case with the reason. ``scenario`` (a
    fault scenario) contributes its name, shifted-env variants and declared
    fine-tuning budget. A ``screen`` never ends ``improved``; a ``confirm`` stage
    (``confirms``: the screen's case id, run with ``config.confirmation(k)``) may.
    With a Ray executor on a cluster, ``run_dir`` must be on storage every node can read.
    ``budget`` (learned from the KB) sets the budget unless ``config.budget_steps`` does; the case
    records the budget's source (:func:`~remedy.cases.verify.budgets.choose_budget`). ``rollouts``
    (a session's :class:`~remedy.cases.evidence.rollcache.RolloutCache`) reuses evidence rollouts
    and evaluates a pure budget patch's checkpoint control from it in-process (no job, no control
    cache entry: it trains nothing). ``arms_dir`` keeps the trained arms (``<arm>-<seed>/`` run
    directories; shared controls stay in the control cache) instead of a temporary folder, for a later
    verification to go on from them (``resume``, :class:`Resume`: a race's survivors go on from stage 1).
    """
    config = config or VerifyConfig()
    config.check()
    ctx = _context(run_dir, patch, config, scenario, progress, budget, rollouts)
    ctx.stage, ctx.confirms, ctx.resume = Stage(stage), confirms, resume
    if resume is not None and _resumed(ctx):
        ctx.notes.append(
            f"seeds {', '.join(map(str, _resumed(ctx)))} went on from their stage-1 runs in both arms "
            f"(treatment {resume.treatment_steps:,} and control {resume.control_steps:,} steps already trained)"
        )
    ctx.say("pre-checks")
    refusal = _precheck(ctx)
    if refusal:
        failed = Verification(status=Status.failed, reason=refusal, wall_time_s=_elapsed(ctx), **_base(ctx))
        return _case(ctx, failed)
    owned = executor is None
    executor = executor or get_executor(config.executor)
    design = config.sequential() if ctx.stage is Stage.confirm else None
    with _workdir(arms_dir) as tmp:
        try:
            if design is None:
                plan, results = _run(ctx, executor, plan_jobs(ctx, shifted_variants(scenario), Path(tmp)))
            else:
                plan, results = _sequential(ctx, executor, design, shifted_variants(scenario), Path(tmp))
        finally:
            if owned:
                executor.shutdown()
    judged = judge_verification(
        _verification(ctx, plan, results), ctx.evidence.deterministic, ctx.run.config.success, config.fixed_share
    )
    return _case(ctx, judged)


def _run(ctx: VerifyContext, executor: Executor, plan: Plan) -> tuple[Plan, list[JobResult]]:
    """Run a plan's jobs; keep the controls it trained in the shared cache."""
    reuse = f" ({plan.n_reused} shared control(s) reused)" if plan.n_reused else ""
    ctx.say(f"{len(plan.jobs)} jobs{reuse}", 0, len(plan.jobs))
    results = executor.run(plan.jobs, progress=lambda r, d, n: ctx.say(f"{r.id}: {'ok' if r.ok else 'failed'}", d, n))
    keep_controls(plan, ctx.config.control_cache, results)
    return plan, list(results)


def _sequential(
    ctx: VerifyContext,
    executor: Executor,
    design: stats.SequentialDesign,
    shifted: tuple[tuple[str, str], ...],
    tmp: Path,
) -> tuple[Plan, list[JobResult]]:
    """A sequential confirmation: train the seeds of each look in turn and stop at the first look that decides
    (:func:`~remedy.cases.verify.stats.sequential_look`) or fails. The config is left at the deciding look: its
    seeds, and the two-sided confidence of its nominal level, so the stored effect and status are that look's."""
    plan, done = Plan(), 0
    results: list[JobResult] = []
    for k, n in enumerate(design.looks):
        ctx.say(f"sequential confirmation, look {k + 1} of {len(design.looks)}: {n} seeds per arm")
        look, res = _run(ctx, executor, plan_jobs(ctx, shifted, tmp, range(done, n)))
        plan, results, done = merge_plans(plan, look), results + res, n
        ctx.config = replace(ctx.config, seeds=n, confidence=1.0 - 2.0 * design.level(k))
        verdict = look_verdict(plan, results, design, k)
        if verdict == stats.END and k < len(design.looks) - 1:
            break  # a job failed: the verification is failed, with the job's reason
        if verdict != stats.CONTINUE:
            ctx.notes.append(look_note(design, k, verdict))
            break
    return plan, results


@contextlib.contextmanager
def _workdir(keep: str | Path | None) -> Iterator[str]:
    """Where a verification trains its arms: ``keep`` (made if missing, left in place), else a temporary folder."""
    if keep is None:
        with tempfile.TemporaryDirectory(prefix="remedy-verify-") as tmp:
            yield tmp
        return
    path = Path(keep).resolve()  # arms train in workers that run in their own scratch directories
    path.mkdir(parents=True, exist_ok=True)
    yield str(path)


def verify_and_confirm(
    run_dir: str | Path | RunDir,
    patch: Patch,
    config: VerifyConfig | None = None,
    *,
    executor: Executor | None = None,
    scenario: ScenarioLike | None = None,
    progress: VerifyProgress | None = None,
    budget: LearnedBudget | None = None,
    rollouts: RolloutCache | None = None,
) -> tuple[Case, Case | None]:
    """Screen ``patch``; when the screen clears, confirm it once on fresh seeds. Returns (screen, confirmation).

    The confirmation (None when the screen did not clear) uses ``config.confirmation(0)``:
    the next ``seeds`` training seeds and unused evaluation episodes, and links to the
    screen through ``verification.confirms``. Only it can be ``improved``.
    """
    config = config or VerifyConfig()
    screen = verify_patch(
        run_dir,
        patch,
        config,
        executor=executor,
        scenario=scenario,
        progress=progress,
        budget=budget,
        rollouts=rollouts,
    )
    if screen.verification is None or not screen.verification.passed_screen:
        return screen, None
    if progress is not None:
        progress("screen cleared: confirming on fresh seeds", 0, 0)
    confirmation = verify_patch(
        run_dir,
        patch,
        config.confirmation(0),
        executor=executor,
        scenario=scenario,
        progress=progress,
        stage=Stage.confirm,
        confirms=screen.case_id,
        budget=budget,
        rollouts=rollouts,
    )
    return screen, confirmation


#: the key of a patient's build record (``build.json`` beside ``run.yaml``) that declares its fine-tuning budget
BUILD_BUDGET_KEY = "finetune_budget"


def declared_budget(run: RunDir, scenario: ScenarioLike | None = None) -> int | None:
    """The fine-tuning budget declared for this patient, if any.

    From ``scenario`` (its ``finetune_budget``) when given; else from the run's own build record
    (``build.json`` beside ``run.yaml``, key :data:`BUILD_BUDGET_KEY`, which a scenario build writes): a null or
    absent budget, or no record (a user's own run), declares none and the default applies.
    """
    declared = scenario.finetune_budget if scenario is not None else None
    if declared is not None:
        return int(declared)
    value = _build_record(run).get(BUILD_BUDGET_KEY)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _build_record(run: RunDir) -> dict[str, Any]:
    """The run's build record ({} when there is none or it cannot be read: only the declared budget is lost)."""
    try:
        data = json.loads((Path(run.path) / "build.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def versions() -> dict[str, str]:
    """Versions of what produced a measurement: remedy, gymnasium, SB3, torch, numpy, python."""
    out = {"python": platform.python_version()}
    for name in ("remedy", "gymnasium", "stable_baselines3", "sb3_contrib", "torch", "numpy"):
        try:
            out[name] = metadata.version(name.replace("_", "-"))
        except metadata.PackageNotFoundError:
            continue
    return out
