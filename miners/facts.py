"""What the miner reads off a case: its condition facts, its remedy family, its final verdict.

A measured case becomes an :class:`Attempt`: the facts a rule's condition may test (symptom
tags, env traits, algorithm family, the diagnosed root cause the patch addressed), the family
of its patch and its verdict. Each attempt counts ONCE, at its final verdict: a screen that a
confirmation on fresh seeds re-measured is replaced by that confirmation (whose
``verification.confirms`` names the screen); a screen left ``inconclusive`` that was never
confirmed stays inconclusive, counter-evidence rather than a win. A candidate a race stopped
early (``stopped_early``: measured on a share of the budget and few seeds) has no verdict and is
not an attempt here: it is neither a win nor a loss at the full budget.

The same facts are read off a subject and signature being diagnosed (:func:`subject_facts`),
so an accepted rule can be matched against a new failure (:func:`rule_holds`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from remedy.cases.algos import is_on_policy
from remedy.cases.errors import AlgorithmError
from remedy.cases.model import Case, RemedyFamily, Signature, Source, Status, Subject, patch_family
from remedy.cases.outcomes import final_verdicts

from .model import Condition, ConditionField

__all__ = [
    "MEASURED_SOURCES",
    "OBS_SIZE_BUCKETS",
    "Attempt",
    "obs_size_bucket",
    "subject_facts",
    "case_facts",
    "final_attempts",
    "rule_holds",
]

#: cases whose outcome was measured by a verification (examples carry literature claims only)
MEASURED_SOURCES = frozenset({Source.verified, Source.bench, Source.imported})
#: observation size buckets, by dimension (upper bounds, inclusive): classic-control state
#: vectors are small, MuJoCo-style bodies medium, images or stacked frames large
OBS_SIZE_BUCKETS: tuple[tuple[str, int], ...] = (("small", 8), ("medium", 64))


@dataclass(frozen=True)
class Attempt:
    """One patch attempt at its final verdict, as the miner sees it."""

    case: Case
    facts: frozenset[Condition]
    family: RemedyFamily

    @property
    def improved(self) -> bool:
        """True when the (final) verification ended ``improved``."""
        v = self.case.verification
        return v is not None and v.status.value == "improved"

    @property
    def fixed(self) -> bool:
        """True when the (final) confirmation also made the agent work (``verification.fixed``)."""
        v = self.case.verification
        return self.improved and v is not None and bool(v.fixed)


def obs_size_bucket(obs_dim: int) -> str | None:
    """``small`` (≤ 8), ``medium`` (≤ 64) or ``large``; None for an unknown (0) dimension."""
    if obs_dim <= 0:
        return None
    for name, top in OBS_SIZE_BUCKETS:
        if obs_dim <= top:
            return name
    return "large"


def _algo_family(algo: str) -> str | None:
    try:
        return "on_policy" if is_on_policy(algo) else "off_policy"
    except AlgorithmError:  # an unspecified or unknown algorithm: no fact rather than a wrong one
        return None


def subject_facts(subject: Subject, signature: Signature) -> frozenset[Condition]:
    """The facts of a subject and its failure signature (no root cause: that is what a diagnosis finds)."""
    traits = subject.traits
    facts = {Condition(field=ConditionField.symptom, value=tag) for tag in signature.symptoms}
    facts.add(Condition(field=ConditionField.action_space, value=traits.action_space.value))
    facts.add(Condition(field=ConditionField.reward_density, value=traits.reward_density.value))
    size = obs_size_bucket(traits.obs_dim)
    if size is not None:
        facts.add(Condition(field=ConditionField.obs_size, value=size))
    algo = _algo_family(subject.algo)
    if algo is not None:
        facts.add(Condition(field=ConditionField.algo_family, value=algo))
    return frozenset(facts)


def case_facts(case: Case) -> frozenset[Condition]:
    """A case's facts: those of its subject and signature, plus the top diagnosed root cause its patch addressed."""
    facts = set(subject_facts(case.subject, case.signature))
    if case.diagnosis is not None and case.diagnosis.causes:
        facts.add(Condition(field=ConditionField.root_cause, value=case.diagnosis.causes[0].cause.value))
    return frozenset(facts)


def _measured(case: Case) -> bool:
    """A verdict backed by a measurement: a measured source and a verification with an effect (stopped early: none)."""
    v = case.verification
    return (
        case.source in MEASURED_SOURCES
        and v is not None
        and v.effect is not None
        and v.status is not Status.stopped_early
    )


def final_attempts(cases: Iterable[Case]) -> list[Attempt]:
    """The measured attempts among ``cases``, each once at its final verdict, in case-id order.

    A screen that a confirmation names in ``verification.confirms`` counts once, as its latest
    confirmation (fresh seeds): :func:`remedy.cases.outcomes.final_verdicts`.
    """
    measured = [c for c in cases if _measured(c)]
    finals = sorted((verdict for _, verdict in final_verdicts(measured)), key=lambda c: c.case_id)
    return [Attempt(case=c, facts=case_facts(c), family=patch_family(c.patch)) for c in finals]


def rule_holds(conditions: Sequence[Condition], facts: frozenset[Condition]) -> bool:
    """Whether every condition holds in ``facts``, root-cause conditions aside.

    A root cause is what the diagnosis is looking for, not a fact of the failure: a rule's
    root-cause condition is left to its ``cause`` vote rather than tested here.
    """
    return all(c in facts for c in conditions if c.field != ConditionField.root_cause)
