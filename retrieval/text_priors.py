"""Priors for a failure described in words: single symptoms, and families without a concrete patch.

The built-in rulebook (:mod:`remedy.retrieval.priors`) is written for measured signatures: its
rules mostly need two tags at once (a sparse reward *and* no success) because a measured tag fires
on a threshold and alone says little. A user who writes "the reward is almost always zero" has
stated the fact outright, and a description rarely states two. These rules therefore fire on one
tag read off a description, and only there (the offline diagnoser adds them when the context is a
description; a run-directory diagnosis never sees them). Each names its source, as the priors do.

Templates whose patch cannot be built for the subject (reward code or a curriculum for an env the
user did not name) still vote for their family in a description: the report then advises the family
(:class:`~remedy.retrieval.diagnosis.FamilyProposal` without an example) instead of staying silent.

:data:`STATED_FAMILIES` (the remedy families for a cause the text states outright) is the
taxonomy's (:mod:`remedy.retrieval.taxonomy`), re-exported here beside the rules that use it.
"""

from __future__ import annotations

from remedy.cases.model import RemedyFamily, RootCause
from remedy.cases.patches.spec import Patch

# the rulebook's own templates, so a text rule builds the same patches a measured one would
from .prior_conditions import AnyOf, Facts, Not, Symptom
from .prior_templates import (
    ANDRYCHOWICZ,
    SB3_TIPS,
    T_BUDGET_SMALL,
    T_COUNT,
    T_EXPLORE,
    T_LR,
    T_POTENTIAL,
    T_REW_NORM,
    T_TIME_COST,
    Template,
)
from .priors import PriorRule
from .taxonomy import STATED_FAMILIES

__all__ = ["TEXT_PRIORS", "STATED_FAMILIES", "REPORT_FAMILY_RATES"]

_C = RootCause
_F = RemedyFamily


def _no_patch(facts: Facts) -> Patch | None:
    """A family-level template: advises the family, builds nothing (the subject is too vague)."""
    return None


_T_TIME_LIMIT = Template(
    _F.time_limit,
    _no_patch,
    "a longer episode limit lets the agent finish the task",
    "episodes end at the goal instead of the clock",
    "longer episodes cost more env steps",
)

_SUCCESS = (Symptom("never_succeeds"), Symptom("low_success"))

TEXT_PRIORS: tuple[PriorRule, ...] = (
    PriorRule(
        "text-sparse-reward",
        "the description says the reward is (almost) always zero",
        (Symptom("sparse_signal"), Not(Symptom("never_succeeds"))),  # with never_succeeds prior-sparse-never fires
        ((_C.sparse_reward, 0.7), (_C.insufficient_exploration, 0.3)),
        (T_POTENTIAL, T_COUNT),
        "Ng et al. 1999; " + SB3_TIPS + " (sparse rewards need shaping or exploration)",
    ),
    PriorRule(
        "text-never-learns",
        "the description says the agent never succeeds, nothing more specific",
        (Symptom("never_succeeds"), Not(AnyOf((Symptom("sparse_signal"), Symptom("timeouts"))))),
        ((_C.insufficient_exploration, 0.35), (_C.sparse_reward, 0.25), (_C.undertraining, 0.15)),
        (T_EXPLORE, T_COUNT),
        SB3_TIPS + " (an agent that never sees the goal cannot learn it); " + ANDRYCHOWICZ,
    ),
    PriorRule(
        "text-low-coverage",
        "the description says the agent does not explore",
        (Symptom("low_coverage"), Not(AnyOf(_SUCCESS))),  # with a success tag prior-low-coverage fires
        ((_C.insufficient_exploration, 0.6), (_C.premature_convergence, 0.2)),
        (T_EXPLORE, T_COUNT),
        SB3_TIPS + "; " + ANDRYCHOWICZ,
    ),
    PriorRule(
        "text-unstable-scale",
        "the description says training is unstable: badly scaled rewards are a common cause",
        (Symptom("unstable_learning"),),
        ((_C.observation_scaling, 0.15),),
        (T_REW_NORM,),
        SB3_TIPS + " (normalize observations and rewards, VecNormalize)",
    ),
    PriorRule(
        "text-noisy-returns",
        "the description says returns vary widely",
        (Symptom("high_variance"), Not(Symptom("unstable_learning"))),
        ((_C.unstable_optimization, 0.35), (_C.undertraining, 0.15)),
        (T_REW_NORM, T_LR),
        SB3_TIPS + " (VecNormalize); " + ANDRYCHOWICZ,
    ),
    PriorRule(
        "text-short-time-limit",
        "the description says episodes are cut off too soon",
        (Symptom("short_time_limit"),),
        ((_C.time_limit_misconfiguration, 0.85),),
        (_T_TIME_LIMIT,),
        "Pardo et al. 2018, 'Time Limits in Reinforcement Learning'",
    ),
    PriorRule(
        "text-timeouts",
        "the description says episodes run out the clock",
        (Symptom("timeouts"), Not(AnyOf((Symptom("hovering"), Symptom("never_succeeds"))))),
        ((_C.reward_misspecification, 0.3), (_C.insufficient_exploration, 0.3), (_C.time_limit_misconfiguration, 0.2)),
        (T_TIME_COST, T_EXPLORE, _T_TIME_LIMIT),
        SB3_TIPS + "; Pardo et al. 2018",
    ),
    PriorRule(
        "text-early-termination",
        "the description says the agent falls or crashes early",
        (Symptom("early_termination"), Not(AnyOf(_SUCCESS))),  # with a success tag prior-early-termination fires
        ((_C.undertraining, 0.3), (_C.reward_misspecification, 0.2)),
        (T_BUDGET_SMALL,),
        SB3_TIPS,
    ),
)

#: How often each remedy family resolved a real public failure report: its share among the families
#: of the 140 labelled reports of batches 1-4 in ``bench/data/describe_reports.jsonl`` (GitHub issues
#: and Q&A threads, labelled from each thread's resolution), a report's i-th family weighted 1/i.
#: A description is vaguer than a measured signature, and across real reports a few families
#: (reward shaping, hyperparameters) resolve most; the offline diagnoser adds these rates to a
#: description's family ranking (``OfflineSettings.w_family_base_rate``, x the top family score).
#: Nested leave-one-out over those reports chose the weight and showed family top-3 up 2-3 points,
#: root causes untouched (README, Diagnosis from a description). ``tests/retrieval/test_describe.py`` checks
#: the table against the data file; recompute it with ``bench/describe_cv.py --family-rates``.
REPORT_FAMILY_RATES: dict[RemedyFamily, float] = {
    _F.reward_shaping: 0.243,
    _F.hyperparameters: 0.235,
    _F.training_budget: 0.133,
    _F.normalization: 0.120,
    _F.exploration_bonus: 0.107,
    _F.time_limit: 0.073,
    _F.action_magnitude: 0.032,
    _F.curriculum: 0.032,
    _F.action_smoothness: 0.016,
    _F.frame_stack: 0.006,
    _F.action_repeat: 0.003,
}
