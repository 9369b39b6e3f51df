"""Racing candidates: a cheap first stage drops the candidates of a round that show no sign of helping (issue 9).

A fix-loop round verifies its top K candidates. Most do nothing (55 of the 66 dev bench cases
were ``no_effect``), yet each paid a full screen. Racing verifies a round in two stages:

1. **Stage 1** gives every candidate ``fraction`` of its full budget (default 1/3 of the env
   steps) on ``seeds`` training seeds (default 2, never fewer: one seed says nothing about
   seed-to-seed spread), against the control at THAT budget. For most patches the full budget is
   the per-candidate fine-tuning budget and the control is the shared, cached same-budget
   control (the control cache keys by budget, so the candidates of a round share one control per
   seed, and later rounds and ``remedy verify`` calls reuse it). For a patch that only adds
   training steps ("+X steps vs the checkpoint") the full budget is its X extra steps: stage 1
   is "+round(fraction·X) steps vs the checkpoint", and its control is the checkpoint itself,
   evaluated once as in the full screen. Stage 1 is a verification at ``Stage.race``, which can
   never end ``improved`` (verification turns its ``improved`` into ``inconclusive`` and does
   not mark a cleared screen). A round races whenever it has a raceable candidate, one or many.
2. A candidate is **dropped** only on evidence of harm (rule 4, the default since issue 27,
   :data:`DROP_RULE` ``harm``): its stage-1 interval, at :data:`HARM_CONFIDENCE` (90% two-sided, so
   one-sided 5%), lies wholly below zero. Every other candidate goes on, ranked and scored for the
   record. Absence of gain is not evidence of no gain: a fix that acts late (more training most of
   all) shows nothing after a third of its budget, and the futility rule below dropped 25-82% of
   simulated slow-acting fixes, the harm rule 0.7-8.6% (``bench/calibration.py racing``). Survivors
   go on from their stage-1 runs, so racing a candidate that goes on costs nothing extra; what rule 4
   gives up is the saving on candidates that merely do nothing. Under the **futility rule** (rules 2-3,
   ``RaceSettings(drop="futility")``) a candidate is dropped when it shows no sign of helping or cannot win
   (:func:`rank_stage_one`): its stage-1 interval lies wholly below zero; or its stage-1
   difference is ≤ 0 on the verification's metric (the **futility stop**, whatever the number
   of candidates), unless that is a flat tie (every seed of both arms scored the same: no
   evidence either way, :func:`uninformative`); or it ranks in the bottom half by its standardized effect (difference over
   the half-width of its 95% CI; the top ``max(1, m // 2)`` of the ``m`` candidates measured at
   stage 1 go on, so a lone candidate is only ever dropped by futility). A dropped candidate is
   stored with the evidence it reached (effect, CI, seeds, env steps at the stage budget) as
   ``stopped_early`` — no verdict, never a ``no_effect`` measured at full budget. A candidate
   whose stage 1 crashed or was refused is ``failed`` as before.
3. The **survivors** get the full screen (full budget and seeds, on the same seed block; the
   full-budget controls come from the cache when any earlier verification trained them), and
   a survivor whose screen clears is confirmed on fresh seeds exactly as without racing. The
   survivor's screen case carries its stage-1 evidence (``verification.race``), and its
   ``env_steps`` include the stage-1 steps.

**Why the futility rule had a futility stop, and successive halving rather than a sequential test.** A sequential
test (e.g. a group-sequential boundary on the seed-level Welch statistic) stops a candidate only
when its evidence is already decisive; with 2 seeds the Welch interval has one degree of freedom
(t = 12.7), so almost nothing is ever decisive at stage 1 and nothing would be saved. Successive
halving needs no decisive evidence, only a ranking, but it never stops the best of a round, nor
a round's only candidate. The futility stop needs no decisive evidence either: a candidate whose
point estimate after a third of its budget is no better than the control shows no sign of
helping, and it is dropped alone or in company. A fine-tune is a path: the full run passes
through the shorter one (same checkpoint, seeds and patch; more training continues it, up to
schedules that depend on the total budget), so a patch that helps usually shows some gain on the
way. That holds for a budget-only patch too: "+fraction·X steps vs the checkpoint" is the start
of "+X steps vs the checkpoint" on the same seeds, so more training passes through the shorter
run. Dropping a candidate whose gains appear only late costs fix rate, never correctness (measured
on the tiny CartPole patient of the fix-loop tests: "+8,192 steps" clears its screen, +0.5 success,
while "+2,731 steps" shows none, -0.1, so a race stops it). A flat tie is not evidence of no
gain: in the demo, "+10,000 steps" on the Acrobot patient scored -500 in every episode of both arms
at +3,333 and was confirmed +0.84 success at the full budget, so flat ties go on. Selection happens before the
confirmation, whose data (fresh training seeds, fresh evaluation episodes) nothing in the race
touched, so the family-wise bound of :mod:`remedy.cases.verify.stats` (at most
``confirmations × 2.5%`` false fixes per loop) holds unchanged, however the race picks. Stage-1
seeds are the first ``seeds`` of the screen's block (never more than the screen has), so a
confirmation's block stays disjoint from them.

Stage-1 measurements are not pooled into the full screen: they are at a different budget, and
mixing budgets would measure neither. But a survivor's stage-1 RUNS are the start of its full-budget
runs on the same seeds, so the survivor **goes on** from them (:func:`resume_from`, ``resume=True``,
rule version 3): on each stage-1 seed its treatment and its control (the shared control continued
the same way, cached under a key naming the run it continues) learn only the rest of the full
budget; the screen's other seeds start from the checkpoint as before. Both arms of a seed follow the
same procedure and take equal env steps, so the comparison stays a same-budget one; stage 1 is no
longer paid twice (the lone budget-patch survivors of the dev bench cost more raced than not before
this). What differs from one uninterrupted run is procedural and the same in both arms: the rollout
in progress and (off-policy) the replay buffer start afresh, and a learning-rate schedule is laid
out over each leg. A curriculum patch does not go on (its stages are laid out over the budget of one
run); nor does a seed whose stage-1 run is missing in either arm. The screen case lists the seeds
that went on (``verification.resumed_seeds``). A stage-1 case records the candidate's own patch (a
budget-only candidate trained a share of its steps; ``verification.budget_steps`` says how many) and
the budget source of the FULL budget it is a share of (:func:`as_stage_one`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import VerificationError
from ..model import Case, Effect, RaceStage, Stage, Status
from ..patches.spec import Curriculum, Patch, TrainingBudget
from .budgets import BudgetChoice
from .controls import ControlCache
from .verification import Resume, VerifyConfig

__all__ = [
    "RaceSettings",
    "RACE_FRACTION",
    "RACE_SEEDS",
    "RULE_VERSION",
    "raceable",
    "full_budget",
    "stage_patch",
    "stage_config",
    "as_stage_one",
    "standardized",
    "Standing",
    "shows_gain",
    "uninformative",
    "futile",
    "rank_stage_one",
    "stopped_early",
    "with_stage_one",
    "continuable",
    "resume_from",
]

#: share of the per-candidate budget stage 1 spends, and its training seeds (at least 2)
RACE_FRACTION = 1 / 3
RACE_SEEDS = 2
#: the version of the racing rule (2: halving and the futility stop, flat ties go on; 3: survivors go on
#: from their stage-1 runs; 4: only evidence of harm drops a candidate, :data:`DROP_RULE`); benches key their
#: results by it, so results of another rule are not mixed in
RULE_VERSION = 4
#: how stage 1 drops candidates: ``harm`` (rule 4) drops a candidate only when its stage-1 interval, at
#: :data:`HARM_CONFIDENCE`, lies wholly below zero (it is behind its control); ``futility`` (rules 2-3) also
#: drops any candidate without a gain and the bottom half of a round. The futility rule dropped patches whose
#: gain comes late: of simulated fixes with no gain yet at a third of the budget it dropped 49-64%, of
#: slow-acting fixes in all 25-82% (``bench/calibration.py racing``), and in the cost bench 4 of the 15
#: candidates that clear their full-budget screen without racing (``bench/data/cost-*-sc08.jsonl``). The harm
#: rule drops 0.7-8.6% of those slow-acting fixes (and 3% of candidates that do nothing, 42-43% of ones that
#: wreck the agent by 3 seed-SDs).
DROP_RULES = ("harm", "futility")
DROP_RULE = "harm"
#: two-sided confidence of the stage-1 interval that must lie below zero to drop a candidate (one-sided 5%)
HARM_CONFIDENCE = 0.9
#: standardized effects are clipped here: an interval of zero width would make them infinite
SCORE_CAP = 1000.0


@dataclass(frozen=True)
class RaceSettings:
    """Whether a fix-loop round races its candidates, and how much stage 1 spends."""

    enabled: bool = True
    fraction: float = RACE_FRACTION
    seeds: int = RACE_SEEDS
    #: survivors go on from their stage-1 runs (:func:`resume_from`) rather than train their full budget afresh
    resume: bool = True
    #: two-sided confidence of the stage-1 interval (:data:`HARM_CONFIDENCE`); only a race's ranking reads it
    confidence: float = HARM_CONFIDENCE
    #: what drops a candidate at stage 1 (:data:`DROP_RULE`): evidence of harm, or also no sign of gain
    drop: str = DROP_RULE

    def check(self) -> None:
        """Refuse settings that cannot rank candidates."""
        if not 0.0 < self.fraction < 1.0:
            raise VerificationError(
                f"--race-fraction must be between 0 and 1 (got {self.fraction}); 0.33 spends a third of the budget"
            )
        if self.drop not in DROP_RULES:
            raise VerificationError(f"unknown stage-1 drop rule '{self.drop}'; use one of {', '.join(DROP_RULES)}")
        if not 0.0 < self.confidence < 1.0:
            raise VerificationError(f"the stage-1 confidence must be between 0 and 1 (got {self.confidence})")
        if self.seeds < 2:
            raise VerificationError(
                f"--race-seeds must be at least 2 (got {self.seeds}): one seed says nothing about seed-to-seed spread"
            )

    def applies(self, config: VerifyConfig, patches: Sequence[Patch]) -> bool:
        """True when a round with these candidates races: enabled, 2+ seeds per arm, a raceable candidate
        (one is enough: the futility stop drops a lone candidate that shows no gain)."""
        return self.enabled and config.seeds >= 2 and any(raceable(p, self.fraction) for p in patches)

    def as_dict(self) -> dict[str, object]:
        """JSON-ready settings."""
        return {
            "enabled": self.enabled,
            "fraction": self.fraction,
            "seeds": self.seeds,
            "resume": self.resume,
            "confidence": self.confidence,
            "drop": self.drop,
        }


def raceable(patch: Patch, fraction: float = RACE_FRACTION) -> bool:
    """Whether stage 1 can run ``patch`` on ``fraction`` of its budget: every patch can, except a patch that
    only adds training steps so few that a share of them rounds to none (a prefix of nothing says nothing)."""
    if not patch.budget_only:
        return True
    return all(round(fraction * p.extra_steps) >= 1 for p in patch.parts if isinstance(p, TrainingBudget))


def full_budget(patch: Patch, budget_steps: int) -> int:
    """The budget stage 1 takes a share of: a budget-only patch's extra steps, else ``budget_steps`` per arm."""
    if patch.budget_only:
        return sum(p.extra_steps for p in patch.parts if isinstance(p, TrainingBudget))
    return budget_steps


def stage_patch(patch: Patch, settings: RaceSettings) -> Patch:
    """The patch stage 1 trains: ``patch`` itself, or, for a budget-only patch, ``fraction`` of its extra steps
    ("+X steps vs the checkpoint" becomes "+round(fraction·X) steps vs the checkpoint")."""
    if not patch.budget_only:
        return patch
    parts = [
        p.model_copy(update={"extra_steps": max(1, round(settings.fraction * p.extra_steps))})
        if isinstance(p, TrainingBudget)
        else p
        for p in patch.parts
    ]
    return patch.model_copy(update={"parts": parts})


def stage_config(config: VerifyConfig, full_budget: int, settings: RaceSettings) -> VerifyConfig:
    """The stage-1 config: ``fraction`` of ``full_budget`` per arm, on the first ``seeds`` seeds of the screen's block,
    its interval at the race's ``confidence`` (stage 1 never decides a status, so only the drop rule reads it).

    (A budget-only patch's arms ignore the budget: :func:`stage_patch` carries its share of the steps.)
    """
    return replace(
        config,
        budget_steps=max(1, round(settings.fraction * full_budget)),
        seeds=min(settings.seeds, config.seeds),
        confidence=settings.confidence if settings.drop == "harm" else config.confidence,
    )


def as_stage_one(case: Case, patch: Patch, full: BudgetChoice) -> Case:
    """A stage-1 case as stored: the candidate's own ``patch`` (not a budget-only patch's share of its steps),
    and the source of the FULL budget ``full`` it is a share of (the stage config sets ``budget_steps``, which
    alone would read as the user's). A pure budget patch's source stays ``patch``: its own steps."""
    v = case.verification
    if v is None:
        return case.model_copy(update={"patch": patch})
    if v.budget_source not in (None, "patch"):
        v = v.model_copy(update={"budget_source": full.source, "budget_cases": list(full.cases)})
    return case.model_copy(update={"patch": patch, "verification": v})


def standardized(effect: Effect | None) -> float | None:
    """The difference over the half-width of its CI (1: the interval just reaches zero); None without an effect."""
    if effect is None:
        return None
    half = (effect.ci_high - effect.ci_low) / 2.0
    if half <= 0.0:
        raw = 0.0 if effect.diff == 0 else (SCORE_CAP if effect.diff > 0 else -SCORE_CAP)
    else:
        raw = effect.diff / half
    return max(-SCORE_CAP, min(SCORE_CAP, raw))


@dataclass(frozen=True)
class Standing:
    """One candidate after stage 1: its score, rank (1 = best; 0 = not measured), whether it goes on, and why."""

    score: float | None
    rank: int
    of: int
    survived: bool
    rule: str


def shows_gain(effect: Effect, returns: Effect | None = None) -> bool:
    """Whether a stage-1 effect shows any sign of helping: a difference > 0 on the verification's metric.

    A difference of exactly 0 on a success rate is a tie, not a loss, and success is coarse at
    stage 1 (a few evaluation episodes of an agent trained a third as long); when the verification
    also measured the return (``returns``, its ``return_iqm`` secondary) and that rose, the
    candidate is moving toward success and is kept. (When every episode of both arms fails, the
    verification's metric already is the return IQM, so "both arms score 0" is judged on return.)
    A success rate that fell is no sign of gain, whatever the return did: success is the task.
    """
    if effect.diff > 0:
        return True
    return effect.diff == 0 and effect.metric == "success_rate" and returns is not None and returns.diff > 0


def uninformative(effect: Effect) -> bool:
    """A stage-1 tie with no spread at all: every seed of both arms scored the same (typically both
    still at the floor a third of the way in). It is no evidence either way, so the futility stop
    does not act on it: measured in the demo, "+10,000 steps" on the Acrobot patient ties flat at
    +3,333 (every episode times out in both arms) and is confirmed +0.84 at the full budget."""
    return effect.diff == 0 and effect.ci_low == 0 and effect.ci_high == 0


def futile(effect: Effect, returns: Effect | None = None) -> bool:
    """The futility stop: stage 1 shows no sign of gain (:func:`shows_gain`) and is informative
    (not a flat tie on the metric and, when measured, on the return)."""
    if shows_gain(effect, returns):
        return False
    return not (uninformative(effect) and (returns is None or uninformative(returns)))


def rank_stage_one(
    effects: Sequence[Effect | None], returns: Sequence[Effect | None] | None = None, rule: str = DROP_RULE
) -> list[Standing]:
    """Who survives stage 1, in the order of ``effects`` (None: the candidate's stage 1 failed).

    ``rule`` ``harm`` (:data:`DROP_RULE`): every measured candidate goes on unless its interval lies wholly
    below zero; candidates are still ranked and scored for the record. ``futility`` (racing rules 2-3):

    Measured candidates are ranked by :func:`standardized` (ties keep the diagnosis order); the
    top ``max(1, m // 2)`` of the ``m`` measured go on, except those whose CI lies wholly below
    zero and those that show no sign of gain (:func:`futile`; ``returns``, when given, holds
    each candidate's return-IQM effect, read only on a success-rate tie; a flat tie goes on). The futility stop
    applies to every candidate, the best of a round and a round's only candidate included.
    """
    if rule not in DROP_RULES:
        raise VerificationError(f"unknown stage-1 drop rule '{rule}'; use one of {', '.join(DROP_RULES)}")
    rets = list(returns) if returns is not None else [None] * len(effects)
    scores = [standardized(e) for e in effects]
    measured = [i for i, s in enumerate(scores) if s is not None]
    order = sorted(measured, key=lambda i: -(scores[i] or 0.0))  # stable: the diagnosis order breaks ties
    quota = max(1, len(measured) // 2)
    rank = {i: r for r, i in enumerate(order, start=1)}
    out = []
    for i, (e, s) in enumerate(zip(effects, scores)):
        if e is None or s is None:
            out.append(Standing(None, 0, len(measured), False, "stage 1 produced no measurement"))
            continue
        ranked = f"ranked {rank[i]} of {len(measured)}"
        if e.ci_high < 0:
            out.append(Standing(s, rank[i], len(measured), False, "its stage-1 CI lies wholly below zero"))
        elif rule == "harm":
            why = f"{ranked}; no evidence of harm at stage 1 ({e.metric} difference {e.diff:+.3g})"
            out.append(Standing(s, rank[i], len(measured), True, why))
        elif futile(e, rets[i]):
            why = f"no sign of gain at stage 1 ({e.metric} difference {e.diff:+.3g} <= 0; {ranked})"
            out.append(Standing(s, rank[i], len(measured), False, why))
        elif rank[i] > quota:
            out.append(Standing(s, rank[i], len(measured), False, f"{ranked} (top {quota} go on)"))
        elif e.diff <= 0 and shows_gain(e, rets[i]):  # a success tie, kept by its return
            ret = rets[i]
            gain = f"return_iqm {ret.diff:+.3g}" if ret is not None else "return"
            out.append(Standing(s, rank[i], len(measured), True, f"{ranked}; success rate tied, {gain} > 0"))
        elif e.diff <= 0:  # not futile, so a flat tie (uninformative)
            why = f"{ranked}; a flat tie at stage 1 (every seed of both arms scored the same): nothing to judge yet"
            out.append(Standing(s, rank[i], len(measured), True, why))
        else:
            out.append(Standing(s, rank[i], len(measured), True, ranked))
    return out


def _stage_one(case: Case, standing: Standing, full_budget: int) -> RaceStage:
    v = case.verification
    if v is None:
        raise VerificationError(f"stage-1 case {case.case_id} has no verification")
    return RaceStage(
        effect=v.effect,
        seeds=v.seeds,
        seed_base=v.seed_base,
        budget_steps=v.budget_steps,
        full_budget_steps=full_budget,
        env_steps=v.env_steps,
        wall_time_s=v.wall_time_s,
        score=standing.score,
        rank=standing.rank,
        of=standing.of,
        survived=standing.survived,
        rule=standing.rule,
        controls=list(v.controls),
    )


def stopped_early(case: Case, standing: Standing, full_budget: int) -> Case:
    """The stored case of a candidate dropped at stage 1: ``stopped_early`` with the evidence it reached.

    A stage 1 that crashed or was refused stays ``failed`` (that is a verdict on the patch at any budget).
    """
    v = case.verification
    if v is None or v.stage is not Stage.race:
        raise VerificationError("only a stage-1 (race) verification can be stopped early")
    race = _stage_one(case, standing, full_budget)
    if v.status is Status.failed:
        return case.model_copy(update={"verification": v.model_copy(update={"race": race})})
    spent = (
        f"+{v.budget_steps:,} of its +{full_budget:,} training steps vs the checkpoint"
        if v.comparison == "budget_vs_none"
        else f"{v.budget_steps:,} of {full_budget:,} env steps per arm"
    )
    reason = (
        f"stopped early at stage 1 of a race ({spent}, {v.seeds} seeds): {standing.rule}; "
        f"not measured at the full budget; {v.reason}"
    )
    update = {"status": Status.stopped_early, "reason": reason, "passed_screen": False, "race": race}
    return case.model_copy(update={"verification": v.model_copy(update=update)})


def with_stage_one(screen: Case, stage_one: Case, standing: Standing, full_budget: int) -> Case:
    """A survivor's full screen carrying its stage-1 evidence; its env steps and wall time include stage 1's."""
    v = screen.verification
    if v is None:
        return screen
    race = _stage_one(stage_one, standing, full_budget)
    update = {
        "race": race,
        "env_steps": v.env_steps + race.env_steps,
        "wall_time_s": v.wall_time_s + race.wall_time_s,
    }
    return screen.model_copy(update={"verification": v.model_copy(update=update)})


def continuable(patch: Patch) -> bool:
    """Whether a survivor of ``patch`` can go on from its stage-1 runs: every patch but a curriculum, whose
    stages are laid out over the budget of one run (going on would start the curriculum over)."""
    return not any(isinstance(p, Curriculum) for p in patch.parts)


def resume_from(stage_one: Case, arms_dir: str | Path, control_cache: str | None) -> Resume | None:
    """Where a survivor's full screen goes on from: the stage-1 runs of ``stage_one`` (its treatments kept in
    ``arms_dir`` as ``treatment-<seed>/``; its controls in the control cache under the keys the case lists,
    else in ``arms_dir`` as ``control-<seed>/``; a budget-only patch's control is the checkpoint). Only seeds
    whose runs exist in both arms go on; None when none does or the patch cannot go on (:func:`continuable`).
    """
    v = stage_one.verification
    if v is None or v.stage is not Stage.race or not continuable(stage_one.patch):
        return None
    seeds = list(range(v.seed_base, v.seed_base + v.seeds))
    checkpoint_control = v.comparison == "budget_vs_none"
    cache = ControlCache(control_cache) if control_cache and len(v.controls) == len(seeds) else None
    starts: dict[int, tuple[str, str | None]] = {}
    for i, seed in enumerate(seeds):
        treatment = Path(arms_dir) / f"treatment-{seed}"
        control: Path | None = None
        if not checkpoint_control:
            control = cache.run_dir(v.controls[i]) if cache is not None else Path(arms_dir) / f"control-{seed}"
        if (treatment / "model.zip").is_file() and (control is None or (control / "model.zip").is_file()):
            starts[seed] = (str(treatment), None if control is None else str(control))
    if not starts:
        return None
    # the stage-1 treatment trained ``budget_steps`` (a share of the budget, plus a budget part's extra steps,
    # or a budget-only patch's share of its steps); a same-budget control trained as many
    control_steps = 0 if checkpoint_control else v.budget_steps
    return Resume(starts=starts, treatment_steps=v.budget_steps, control_steps=control_steps)
