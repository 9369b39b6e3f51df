"""From arm results to a verdict: effects with their intervals, the status, and what the reason says.

The arms a plan's jobs produced (shared controls included, a checkpoint control pooled into one
run) are compared seed by seed (:mod:`.stats`); :func:`decide_status` turns the primary effect into a
status, and :func:`verdict` applies the stage's rules (a screen never ends ``improved``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from ..errors import VerificationError
from ..model import Effect, Stage, Status
from . import stats
from .arms import ArmResult, Scores
from .config import VerifyConfig
from .executors import Job, JobResult
from .plan import Plan, VerifyContext
from .training import arm_budgets

__all__ = [
    "decide_status",
    "measure_effects",
    "violation_rates",
    "arms_of",
    "seed_shortage",
    "verdict",
    "screen_test",
    "per_seed_values",
    "look_verdict",
    "look_note",
]


def decide_status(
    primary: Effect | None, shaped: Effect | None = None, failure: str = "", too_few_seeds: bool = False
) -> Status:
    """``failed`` on any failure; ``inconclusive`` with too few seeds; ``improved``/``worse`` when the CI
    excludes zero; ``reward_hacking`` when the shaped return rose clearly (CI above zero) while the task
    metric did not improve. (Verification turns a screen's ``improved`` into ``inconclusive``.)"""
    if failure or primary is None:
        return Status.failed
    if too_few_seeds:
        return Status.inconclusive
    if primary.ci_low > 0 and (primary.p_value is None or primary.p_value <= (1 - primary.confidence_level) / 2):
        # where an exact permutation test over seed values can reach the level, it must agree: the Welch
        # interval over 8 all-or-nothing seeds per arm false-passes about 4% of A/A confirmations, not 2.5%
        return Status.improved
    if shaped is not None and shaped.ci_low > 0:
        return Status.reward_hacking
    if primary.ci_high < 0:
        return Status.worse
    return Status.no_effect


def _pooled(controls: list[ArmResult]) -> ArmResult:
    """The checkpoint control as ONE run: its evaluations on every seed's block of episodes, concatenated.

    The checkpoint is one agent, not trained per seed, so its blocks are just more episodes of the same
    agent: its value's uncertainty is episode sampling over all of them (``stats`` treats an arm of one run
    so). The treatment's seeds, each on its own block, carry the block's luck in their spread."""

    def cat(scores: list[Scores]) -> Scores:
        return Scores(
            returns=tuple(x for s in scores for x in s.returns),
            successes=tuple(x for s in scores for x in s.successes),
            violations=tuple(x for s in scores for x in s.violations),
            nan=any(s.nan for s in scores),
        )

    first = controls[0]
    return replace(
        first,
        nominal=cat([_nominal(a) for a in controls]),
        shifted={name: cat([a.shifted[name] for a in controls]) for name in first.shifted},
        shaped_returns=None
        if any(a.shaped_returns is None for a in controls)
        else tuple(x for a in controls for x in a.shaped_returns or ()),
        env_steps=sum(a.env_steps for a in controls),
    )


def _collect(jobs: Sequence[Job], results: Sequence[JobResult]) -> tuple[dict[str, list[ArmResult]], list[str], int]:
    """Arm results by arm, failures ('job: reason'), and env steps spent by every job that reported."""
    arms: dict[str, list[ArmResult]] = {"treatment": [], "control": []}
    failures, steps = [], 0
    for job, res in zip(jobs, results):
        if not res.ok:
            failures.append(f"{job.id}: {res.error}")
            continue
        ar: ArmResult = res.value
        steps += int(ar.env_steps)
        if ar.diverged:
            failures.append(f"{job.id}: {ar.reason}")
        elif ar.nominal is None or not ar.nominal.finite or not all(s.finite for s in ar.shifted.values()):
            failures.append(f"{job.id}: evaluation produced NaN or inf")
        elif ar.shaped_returns is not None and not all(math.isfinite(x) for x in ar.shaped_returns):
            failures.append(f"{job.id}: shaped return is NaN or inf")
        else:
            arms[ar.arm].append(ar)
    return arms, failures, steps


def _nominal(a: ArmResult) -> Scores:
    """The arm's scores on the original task (:func:`_collect` keeps only arms that have them)."""
    if a.nominal is None:
        raise VerificationError(f"{a.arm} seed {a.seed} has no evaluation on the original task")
    return a.nominal


def _shifted_scores(name: str, kind: str) -> Callable[[ArmResult], Sequence[float]]:
    """Picks an arm's ``kind`` ("returns" or "successes") on the shifted variant ``name``."""

    def pick(a: ArmResult) -> Sequence[float]:
        scores = a.shifted[name]
        return scores.returns if kind == "returns" else scores.successes

    return pick


#: the metrics a verification's primary effect is measured on: how each run is scored, how a seed is summarized
_PRIMARY: dict[str, tuple[Callable[[ArmResult], Sequence[float]], Callable]] = {
    "return_iqm": (lambda a: _nominal(a).returns, stats.iqm),
    "success_rate": (lambda a: _nominal(a).successes, stats.mean),
}


def measure_effects(t: list[ArmResult], c: list[ArmResult], cfg: VerifyConfig) -> tuple[str, dict[str, Effect]]:
    """Every effect measured, and the name of the primary one."""

    def eff(name: str, pick: Callable[[ArmResult], Sequence[float]], agg: Callable) -> Effect:
        return stats.effect(name, [pick(a) for a in t], [pick(a) for a in c], aggregate=agg, confidence=cfg.confidence)

    out = {name: eff(name, pick, agg) for name, (pick, agg) in _PRIMARY.items()}
    if any(v for a in t + c for v in _nominal(a).violations):
        out["violations"] = eff("violations", lambda a: _nominal(a).violations, stats.mean)
    for name in t[0].shifted:
        out[f"shifted:{name}:return_iqm"] = eff(
            f"shifted:{name}:return_iqm", _shifted_scores(name, "returns"), stats.iqm
        )
        out[f"shifted:{name}:success_rate"] = eff(
            f"shifted:{name}:success_rate", _shifted_scores(name, "successes"), stats.mean
        )
    if all(a.shaped_returns is not None for a in t + c):
        out["shaped_return"] = eff("shaped_return", lambda a: a.shaped_returns or (), stats.iqm)
    outcomes = {s for a in t + c for s in _nominal(a).successes}
    return ("success_rate" if len(outcomes) > 1 else "return_iqm"), out


def violation_rates(arms: dict[str, list[ArmResult]]) -> dict[str, float]:
    out = {}
    for arm, results in arms.items():
        per_episode = [v for a in results for v in _nominal(a).violations]
        if per_episode:
            out[f"{arm}_per_episode"] = float(np.mean(per_episode))
    return out


def arms_of(plan: Plan, results: Sequence[JobResult]) -> tuple[dict[str, list[ArmResult]], list[str], int]:
    """The arms a plan's results make (shared controls included, a checkpoint control pooled into one run),
    failures, and env steps spent."""
    arms, failures, steps = _collect(plan.jobs, results)
    arms["control"] = sorted(arms["control"] + plan.reused, key=lambda a: a.seed)
    if plan.checkpoint_control and arms["control"]:
        arms["control"] = [_pooled(arms["control"])]
    return arms, failures, steps


def seed_shortage(ctx: VerifyContext, arms: dict[str, list[ArmResult]]) -> str:
    """Why the arms hold too few training seeds for a verdict ('' when they do not)."""
    t_budget, c_budget = arm_budgets(ctx.patch, ctx.budget)
    trained_control = not (t_budget == 0 and c_budget == 0)  # a checkpoint control is not trained: no seeds needed
    short = [arm for arm, results in arms.items() if len(results) < 2 and (arm == "treatment" or trained_control)]
    if not short:
        return ""
    return (
        f"inconclusive: {' and '.join(short)} arm(s) hold fewer than 2 training seeds, so seed-to-seed "
        "spread is unknown; verify with --seeds 2 or more"
    )


def verdict(
    ctx: VerifyContext, primary: Effect, shaped: Effect | None, shortage: str, screen_test: Effect | None = None
) -> tuple[Status, bool, str]:
    """Status, whether the screen was passed, and what to add to the reason. ``screen_test`` is the primary
    effect at the screen's own level (:attr:`VerifyConfig.screen_confidence`); None: ``primary``'s."""
    status = decide_status(primary, shaped, too_few_seeds=bool(shortage))
    if shortage:
        return status, False, shortage
    if status is Status.improved and ctx.stage is Stage.race:
        # stage 1 of a race only ranks candidates (cases.verify.racing): neither a fix nor a cleared screen
        return Status.inconclusive, False, "stage 1 of a race ranks candidates; it never decides improved"
    test = primary if screen_test is None else screen_test
    if ctx.stage is Stage.screen and status is not Status.worse and decide_status(test) is Status.improved:
        at = ""
        if test is not primary:
            at = (
                f" at {test.confidence_level:.0%} ([{test.ci_low:+.3g}, {test.ci_high:+.3g}], one-sided "
                f"{(1 - test.confidence_level) / 2:.3g})"
            )
        return (
            Status.inconclusive,
            True,
            f"cleared the screen{at}; a case is improved only after a confirmation on fresh seeds",
        )
    level = (1 - primary.confidence_level) / 2
    if primary.ci_low > 0 and primary.p_value is not None and primary.p_value > level and status is not Status.improved:
        why = (
            "the interval is above 0 but the exact permutation test over seed values is not "
            f"(p = {primary.p_value:.3g} > {level:.3g}), so not improved"
        )
        return status, False, why
    return status, False, ""


def screen_test(ctx: VerifyContext, arms: dict[str, list[ArmResult]], primary: str) -> Effect | None:
    """The primary effect at the screen's level, when this is a screen whose level differs from the config's."""
    cfg = ctx.config
    if ctx.stage is not Stage.screen or cfg.screen_confidence == cfg.confidence:
        return None
    pick, agg = _PRIMARY[primary]
    t, c = arms["treatment"], arms["control"]
    return stats.effect(
        primary, [pick(a) for a in t], [pick(a) for a in c], aggregate=agg, confidence=cfg.screen_confidence
    )


def per_seed_values(arms: dict[str, list[ArmResult]], metric: str) -> dict[str, list[float]]:
    """The primary metric of each run, by arm, in seed order (for tables and later analysis)."""
    pick = (
        (lambda a: stats.mean(a.nominal.successes))
        if metric == "success_rate"
        else (lambda a: stats.iqm(a.nominal.returns))
    )
    return {arm: [pick(a) for a in sorted(results, key=lambda a: a.seed)] for arm, results in arms.items()}


def look_verdict(plan: Plan, results: Sequence[JobResult], design: stats.SequentialDesign, k: int) -> str:
    """What look ``k`` decides (a failed job or a missing arm ends the confirmation: ``end``)."""
    arms, failures, _ = arms_of(plan, results)
    if failures or not arms["treatment"] or not arms["control"]:
        return stats.END
    outcomes = {s for a in arms["treatment"] + arms["control"] for s in _nominal(a).successes}
    name = "success_rate" if len(outcomes) > 1 else "return_iqm"  # the primary metric, as measure_effects picks it
    pick, agg = _PRIMARY[name]
    t, c = ([pick(a) for a in arms[arm]] for arm in ("treatment", "control"))
    return stats.sequential_look(name, t, c, design, k, aggregate=agg)[1]


def look_note(design: stats.SequentialDesign, k: int, verdict: str) -> str:
    """What the reason says about where a sequential confirmation stopped."""
    why = {
        stats.IMPROVED: "the gain crossed the efficacy boundary",
        stats.FUTILE: "futility stop: no gain half-way",
        stats.END: "the last look",
    }[verdict]
    looks = "/".join(map(str, design.looks))
    return (
        f"sequential confirmation (looks at {looks} seeds, {design.spending} spending of one-sided "
        f"{design.alpha:.3g}): stopped at look {k + 1} ({design.looks[k]} seeds per arm, one-sided level "
        f"{design.level(k):.4g}): {why}"
    )
