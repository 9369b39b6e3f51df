"""The built-in prior rulebook: what an experienced RL engineer would suspect first.

A cold KB (no cases, no accepted rules) still gives sensible advice from these.
Each :class:`PriorRule` has conditions over the signature's features and
symptoms and the env's traits, the root causes it suggests with a base
confidence, patch templates instantiated with env-aware parameters (a time
cost a tenth of the per-step reward, a budget as a multiple of the original
training steps, a learning rate a third of the current one), and the
``source`` it comes from. The conditions and facts live in :mod:`remedy.retrieval.prior_conditions`,
the patch templates in :mod:`remedy.retrieval.prior_templates`; this module holds the rules. No constant is taken from the bench scenarios' own
settings: each is derived from a named source (RL Zoo, SB3 docs, Gymnasium docs,
papers) or from a stated first-principles argument. Reward code written here obeys the reward-shaping
contract and the sandbox (tests run every template through it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from remedy.cases.model import ActionSpaceType, RewardDensity, RootCause, Signature, Subject
from remedy.cases.patches.spec import Patch

from .prior_conditions import (
    LR_HIGH_RATIO,
    LR_LOW_RATIO,
    AnyOf,
    BudgetBelow,
    Condition,
    Facts,
    Feature,
    LearningRate,
    Not,
    Symptom,
    TimeLimitShort,
    Trait,
)
from .prior_templates import (
    ANDRYCHOWICZ,
    SB3_TIPS,
    T_BUDGET,
    T_BUDGET_SMALL,
    T_COUNT,
    T_CURRICULUM,
    T_DEFAULT_LR_HIGH,
    T_DEFAULT_LR_LOW,
    T_EXPLORE,
    T_LR,
    T_MAGNITUDE,
    T_NORM_BOTH,
    T_OBS_NORM,
    T_POTENTIAL,
    T_REW_NORM,
    T_SAFETY,
    T_SMOOTHNESS,
    T_SPARSE,
    T_TIME_COST,
    T_TIME_LIMIT,
    ZOO_SOURCE,
    Template,
)

__all__ = ["PriorRule", "PriorMatch", "PRIORS", "match_priors", "prior_by_id"]


@dataclass(frozen=True)
class PriorRule:
    """One prior: when ``conditions`` all hold, suspect ``causes`` and try ``templates``."""

    id: str
    title: str
    conditions: tuple[Condition, ...]
    causes: tuple[tuple[RootCause, float], ...]
    templates: tuple[Template, ...]
    source: str

    def holds(self, facts: Facts) -> bool:
        """Whether every condition holds."""
        return all(c.holds(facts) for c in self.conditions)

    def evidence(self, facts: Facts) -> tuple[str, ...]:
        """The conditions, described with the subject's values."""
        return tuple(c.describe(facts) for c in self.conditions)


@dataclass(frozen=True)
class PriorMatch:
    """A prior whose conditions hold, with the evidence and the instantiated patches."""

    rule: PriorRule
    evidence: tuple[str, ...]
    patches: tuple[tuple[Template, Patch], ...] = field(default_factory=tuple)


# Reward code: every template guards its inputs, because the sandbox fuzzes them with NaN, inf and
# huge values and wants a finite float back (BACKGROUND.md: hallucinated code must not crash training).


# ---- the rulebook ----------------------------------------------------------------------------

_C = RootCause
_CONT = Trait(action_space=ActionSpaceType.continuous)

PRIORS: tuple[PriorRule, ...] = (
    PriorRule(
        "prior-hovering-time-cost",
        "hovering: the reward pays for staying alive",
        (Symptom("hovering"),),
        ((_C.reward_misspecification, 0.8), (_C.time_limit_misconfiguration, 0.1)),
        (T_TIME_COST, T_BUDGET_SMALL),
        SB3_TIPS + "; Amodei et al. 2016 (reward misspecification)",
    ),
    PriorRule(
        "prior-timeouts-no-goal",
        "runs out the clock and never reaches the goal",
        (
            Symptom("timeouts"),
            Symptom("never_succeeds"),
            Not(Symptom("hovering")),
            Not(TimeLimitShort()),
            Not(Feature("reward_per_step", "<=", -0.5)),
        ),  # the env already charges for time (Acrobot)
        ((_C.reward_misspecification, 0.4), (_C.insufficient_exploration, 0.3)),
        (T_TIME_COST, T_EXPLORE),
        SB3_TIPS,
    ),
    PriorRule(
        "prior-time-limit-short",
        "time limit below the env's default",
        (Symptom("timeouts"), TimeLimitShort()),
        ((_C.time_limit_misconfiguration, 0.85),),
        (T_TIME_LIMIT,),
        "Pardo et al. 2018, 'Time Limits in Reinforcement Learning'",
    ),
    PriorRule(
        "prior-jerky-continuous",
        "bang-bang control on continuous actions",
        (Symptom("jerky_actions"), _CONT),
        ((_C.action_jitter, 0.85),),
        (T_SMOOTHNESS,),
        "Mysore et al. 2021, 'Regularizing Action Policies for Smooth Control' (CAPS)",
    ),
    PriorRule(
        "prior-saturated-continuous",
        "actions pinned at their bounds",
        (Symptom("saturated_actions"), _CONT),
        ((_C.action_jitter, 0.4), (_C.unstable_optimization, 0.15)),
        (T_MAGNITUDE,),
        SB3_TIPS + " (normalize and bound the action space)",
    ),
    PriorRule(
        "prior-unscaled-obs",
        "observations far from unit scale",
        (AnyOf((Symptom("unscaled_observations"), Feature("obs_abs_max", ">=", 100.0))),),
        ((_C.observation_scaling, 0.9),),
        (T_OBS_NORM,),
        SB3_TIPS + "; " + ZOO_SOURCE + " (normalize: true)",
    ),
    PriorRule(
        "prior-sparse-never",
        "sparse reward and the goal is never found",
        (Symptom("never_succeeds"), AnyOf((Trait(reward_density=RewardDensity.sparse), Symptom("sparse_signal")))),
        ((_C.sparse_reward, 0.8), (_C.insufficient_exploration, 0.45)),
        (T_POTENTIAL, T_COUNT, T_EXPLORE),
        "Ng et al. 1999, 'Policy Invariance under Reward Transformations'; " + SB3_TIPS,
    ),
    PriorRule(
        "prior-low-coverage",
        "the agent explores little of the state space",
        (Symptom("low_coverage"), AnyOf((Symptom("low_success"), Symptom("never_succeeds")))),
        ((_C.insufficient_exploration, 0.6),),
        (T_EXPLORE, T_COUNT),
        SB3_TIPS + "; " + ANDRYCHOWICZ,
    ),
    PriorRule(
        "prior-entropy-collapse",
        "the policy turned deterministic early",
        (AnyOf((Symptom("collapsed_entropy"), Feature("entropy_drop", ">=", 0.9))),),
        ((_C.premature_convergence, 0.75), (_C.insufficient_exploration, 0.35)),
        (T_EXPLORE,),
        ANDRYCHOWICZ + "; " + ZOO_SOURCE + " (ent_coef)",
    ),
    PriorRule(
        "prior-premature-plateau",
        "learning plateaued early at a poor return",
        (Symptom("premature_convergence"),),
        ((_C.premature_convergence, 0.6), (_C.insufficient_exploration, 0.25)),
        (T_EXPLORE, T_LR),
        ANDRYCHOWICZ,
    ),
    PriorRule(
        "prior-unstable",
        "the learning curve oscillates or collapses",
        (Symptom("unstable_learning"),),
        ((_C.unstable_optimization, 0.75),),
        (T_LR,),
        ANDRYCHOWICZ + "; " + ZOO_SOURCE + " (learning rates, clip ranges)",
    ),
    PriorRule(
        "prior-large-kl",
        "PPO updates far beyond the trust region",
        (Feature("approx_kl_max", ">=", 0.1),),
        ((_C.unstable_optimization, 0.6),),
        (T_LR,),
        "Schulman et al. 2017 (PPO); " + ANDRYCHOWICZ,
    ),
    PriorRule(
        "prior-collapse",
        "training return collapsed from its best",
        (Feature("curve_collapse", ">=", 0.5), Not(Symptom("unstable_learning"))),
        ((_C.unstable_optimization, 0.5),),
        (T_LR,),
        ANDRYCHOWICZ,
    ),
    PriorRule(
        "prior-nan",
        "NaN or inf during rollouts",
        (Symptom("numerical_instability"),),
        ((_C.unstable_optimization, 0.5), (_C.observation_scaling, 0.35)),
        (
            T_NORM_BOTH,
            T_LR,
        ),
        SB3_TIPS,
    ),
    PriorRule(
        "prior-undertrained",
        "returns still rising when training stopped",
        (Symptom("undertrained"),),
        ((_C.undertraining, 0.85),),
        (T_BUDGET,),
        SB3_TIPS + " ('RL needs many samples'); " + ZOO_SOURCE + " (n_timesteps)",
    ),
    PriorRule(
        "prior-tiny-budget",
        "trained for a small fraction of a known-good budget",
        (BudgetBelow(0.1), AnyOf((Symptom("low_success"), Symptom("never_succeeds")))),
        ((_C.undertraining, 0.85),),
        (T_BUDGET,),
        ZOO_SOURCE + " (n_timesteps); " + SB3_TIPS,
    ),
    PriorRule(
        "prior-lr-too-high",
        "learning rate far above the algorithm's default",
        (LearningRate(">", LR_HIGH_RATIO),),
        ((_C.unstable_optimization, 0.85),),
        (T_DEFAULT_LR_HIGH,),
        ZOO_SOURCE + "; " + ANDRYCHOWICZ + " (learning rate is the most important PPO setting)",
    ),
    PriorRule(
        "prior-lr-too-low",
        "learning rate far below the algorithm's default",
        (
            LearningRate("<", LR_LOW_RATIO),
            AnyOf((Symptom("low_success"), Symptom("never_succeeds"), Symptom("premature_convergence"))),
        ),
        ((_C.undertraining, 0.6), (_C.unstable_optimization, 0.35)),
        (T_DEFAULT_LR_LOW,),
        ZOO_SOURCE + "; " + ANDRYCHOWICZ,
    ),
    PriorRule(
        "prior-low-success-rising",
        "partial success and a curve that had not flattened",
        (Symptom("low_success"), Not(Symptom("never_succeeds")), Feature("curve_plateau", "<", 0.5)),
        ((_C.undertraining, 0.45),),
        (T_BUDGET,),
        SB3_TIPS,
    ),
    PriorRule(
        "prior-low-success",
        "succeeds less than half the time",
        (Symptom("low_success"),),
        ((_C.undertraining, 0.2), (_C.insufficient_exploration, 0.1)),
        (T_BUDGET_SMALL,),
        SB3_TIPS,
    ),
    PriorRule(
        "prior-reward-hacking",
        "reward up while the task metric is not",
        (Symptom("reward_hacking_suspected"),),
        ((_C.reward_hacking, 0.85), (_C.reward_misspecification, 0.3)),
        (T_SPARSE,),
        "Amodei et al. 2016, 'Concrete Problems in AI Safety'; BACKGROUND.md",
    ),
    PriorRule(
        "prior-constraints",
        "breaks declared safety constraints",
        (AnyOf((Symptom("constraint_violations"), Feature("constraint_violation_rate", ">", 0.01))),),
        ((_C.safety_violation, 0.9),),
        (T_SAFETY,),
        "Amodei et al. 2016; Achiam et al. 2017, 'Constrained Policy Optimization'",
    ),
    PriorRule(
        "prior-generalization",
        "performance drops on shifted variants",
        (AnyOf((Symptom("poor_generalization"), Feature("shifted_gap", "<=", -0.3))),),
        ((_C.generalization_gap, 0.85),),
        (T_CURRICULUM,),
        "Tobin et al. 2017 (domain randomization); Cobbe et al. 2019 (Procgen)",
    ),
    PriorRule(
        "prior-noisy-returns",
        "returns vary widely and the curve oscillates",
        (Symptom("high_variance"), AnyOf((Feature("curve_oscillation", ">=", 0.3), Symptom("unstable_learning")))),
        ((_C.unstable_optimization, 0.35), (_C.reward_misspecification, 0.15)),
        (T_REW_NORM, T_LR),
        SB3_TIPS + " (VecNormalize); " + ANDRYCHOWICZ,
    ),
    PriorRule(
        "prior-early-termination",
        "episodes end early by failure",
        (Symptom("early_termination"), AnyOf((Symptom("low_success"), Symptom("never_succeeds")))),
        ((_C.undertraining, 0.3), (_C.reward_misspecification, 0.2)),
        (T_BUDGET_SMALL,),
        SB3_TIPS,
    ),
)


def prior_by_id(rule_id: str) -> PriorRule:
    """The prior with ``rule_id`` (KeyError when unknown)."""
    for rule in PRIORS:
        if rule.id == rule_id:
            return rule
    raise KeyError(rule_id)


def match_priors(
    subject: Subject, signature: Signature, priors: tuple[PriorRule, ...] = PRIORS, constraints: tuple[str, ...] = ()
) -> list[PriorMatch]:
    """The priors whose conditions hold for this subject, with evidence and instantiated patches.

    ``constraints`` are the run's declared safety constraints (expressions true when violated).
    """
    facts = Facts(subject, signature, tuple(constraints))
    out = []
    for rule in priors:
        if not rule.holds(facts):
            continue
        built = tuple((t, p) for t in rule.templates if (p := t.build(facts)) is not None)
        out.append(PriorMatch(rule=rule, evidence=rule.evidence(facts), patches=built))
    return out
