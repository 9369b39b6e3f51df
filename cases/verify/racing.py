"""Racing candidates: a cheap first stage drops the candidates of a round that cannot win (issue 9, part 2).

A fix-loop round verifies its top K candidates. Most do nothing (55 of the 66 dev bench cases
were ``no_effect``), yet each paid a full screen. Racing verifies a round in two stages:

1. **Stage 1** gives every candidate ``fraction`` of the per-candidate budget (default 1/3 of
   the env steps) on ``seeds`` training seeds (default 2, never fewer: one seed says nothing
   about seed-to-seed spread), against the shared control at THAT budget (the control cache
   keys by budget, so the candidates of a round share one control per seed, and later rounds
   and ``remedy verify`` calls reuse it). It is a verification at ``Stage.race``, which can
   never end ``improved`` (verification turns its ``improved`` into ``inconclusive`` and does
   not mark a cleared screen).
2. A candidate is **dropped** when it cannot win: its stage-1 interval lies wholly below zero,
   or it ranks in the bottom half by its standardized effect (difference over the half-width
   of its 95% CI; the top ``max(1, m // 2)`` of the ``m`` candidates measured at stage 1 go
   on). A dropped candidate is stored with the evidence it reached (effect, CI, seeds, env
   steps at the stage budget) as ``stopped_early`` — no verdict, never a ``no_effect``
   measured at full budget. A candidate whose stage 1 crashed or was refused is ``failed``
   as before.
3. The **survivors** get the full screen (full budget and seeds, on the same seed block; the
   full-budget controls come from the cache when any earlier verification trained them), and
   a survivor whose screen clears is confirmed on fresh seeds exactly as without racing. The
   survivor's screen case carries its stage-1 evidence (``verification.race``), and its
   ``env_steps`` include the stage-1 steps.

**Why successive halving and not a sequential test.** A sequential test (e.g. a group-sequential
boundary on the seed-level Welch statistic) stops a candidate only when its evidence is already
decisive; with 2 seeds the Welch interval has one degree of freedom (t = 12.7), so almost
nothing is ever decisive at stage 1 and nothing would be saved. Successive halving needs no
decisive evidence, only a ranking, and its saving is known in advance (half the candidates skip
the full screen). Its risk is dropping a real fix that started slowly, which costs fix rate,
never correctness: selection happens before the confirmation, whose data (fresh training seeds,
fresh evaluation episodes) nothing in the race touched, so the family-wise bound of
:mod:`remedy.cases.verify.stats` (at most ``confirmations × 2.5%`` false fixes per loop) holds
unchanged, however the race picks. Stage-1 seeds are the first ``seeds`` of the screen's block
(never more than the screen has), so a confirmation's block stays disjoint from them.

Stage-1 runs are not pooled into the full screen: they are at a different budget, and mixing
budgets would measure neither. A candidate that is only a ``training_budget`` patch is not raced
(its extra steps ARE the patch; a share of them would be a different patch): it goes straight
to the full screen, and a round with fewer than two raceable candidates is not raced at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..errors import VerificationError
from ..model import Case, Effect, RaceStage, Stage, Status
from ..patches.spec import Patch
from .verification import VerifyConfig

__all__ = [
    "RaceSettings",
    "RACE_FRACTION",
    "RACE_SEEDS",
    "raceable",
    "stage_config",
    "standardized",
    "Standing",
    "rank_stage_one",
    "stopped_early",
    "with_stage_one",
]

#: share of the per-candidate budget stage 1 spends, and its training seeds (at least 2)
RACE_FRACTION = 1 / 3
RACE_SEEDS = 2
#: standardized effects are clipped here: an interval of zero width would make them infinite
SCORE_CAP = 1000.0


@dataclass(frozen=True)
class RaceSettings:
    """Whether a fix-loop round races its candidates, and how much stage 1 spends."""

    enabled: bool = True
    fraction: float = RACE_FRACTION
    seeds: int = RACE_SEEDS

    def check(self) -> None:
        """Refuse settings that cannot rank candidates."""
        if not 0.0 < self.fraction < 1.0:
            raise VerificationError(
                f"--race-fraction must be between 0 and 1 (got {self.fraction}); 0.33 spends a third of the budget"
            )
        if self.seeds < 2:
            raise VerificationError(
                f"--race-seeds must be at least 2 (got {self.seeds}): one seed says nothing about seed-to-seed spread"
            )

    def applies(self, config: VerifyConfig, patches: Sequence[Patch]) -> bool:
        """True when a round with these candidates races: enabled, 2+ seeds per arm, 2+ raceable candidates."""
        return self.enabled and config.seeds >= 2 and sum(raceable(p) for p in patches) >= 2

    def as_dict(self) -> dict[str, object]:
        """JSON-ready settings."""
        return {"enabled": self.enabled, "fraction": self.fraction, "seeds": self.seeds}


def raceable(patch: Patch) -> bool:
    """False for a patch that only adds training steps (a share of its steps would be another patch)."""
    return not patch.budget_only


def stage_config(config: VerifyConfig, full_budget: int, settings: RaceSettings) -> VerifyConfig:
    """The stage-1 config: ``fraction`` of ``full_budget`` per arm, on the first ``seeds`` seeds of the screen's block."""
    return replace(
        config,
        budget_steps=max(1, round(settings.fraction * full_budget)),
        seeds=min(settings.seeds, config.seeds),
    )


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


def rank_stage_one(effects: Sequence[Effect | None]) -> list[Standing]:
    """Who survives stage 1, in the order of ``effects`` (None: the candidate's stage 1 failed).

    Measured candidates are ranked by :func:`standardized` (ties keep the diagnosis order); the
    top ``max(1, m // 2)`` of the ``m`` measured go on, except those whose CI lies wholly below zero.
    """
    scores = [standardized(e) for e in effects]
    measured = [i for i, s in enumerate(scores) if s is not None]
    order = sorted(measured, key=lambda i: -(scores[i] or 0.0))  # stable: the diagnosis order breaks ties
    quota = max(1, len(measured) // 2)
    rank = {i: r for r, i in enumerate(order, start=1)}
    out = []
    for i, (e, s) in enumerate(zip(effects, scores)):
        if e is None or s is None:
            out.append(Standing(None, 0, len(measured), False, "stage 1 produced no measurement"))
        elif e.ci_high < 0:
            out.append(Standing(s, rank[i], len(measured), False, "its stage-1 CI lies wholly below zero"))
        elif rank[i] > quota:
            out.append(
                Standing(s, rank[i], len(measured), False, f"ranked {rank[i]} of {len(measured)} (top {quota} go on)")
            )
        else:
            out.append(Standing(s, rank[i], len(measured), True, f"ranked {rank[i]} of {len(measured)}"))
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
    reason = (
        f"stopped early at stage 1 of a race ({v.budget_steps:,} of {full_budget:,} env steps per arm, "
        f"{v.seeds} seeds): {standing.rule}; not measured at the full budget; {v.reason}"
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
