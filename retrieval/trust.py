"""How far the offline vote trusts a retrieved case: its provenance, and what later verifications say.

Agents copy retrieved experience, so a few cases with wrong outcomes spread. Two factors, both
in [0, 1], multiply a case's vote:

- provenance: a case verified here (``verified`` or ``bench``) counts fully; an ``imported`` one
  (another team's export, not re-measured here) counts ``imported_weight``. Examples and
  unverified cases are left at 1: the diagnoser already weighs their outcomes down.
- corroboration: among the cases retrieved together, a verification made here LATER on a
  similar signature (same env, same patch family, overlapping symptom tags) agrees or disagrees
  with a case's outcome (improved vs. no effect, worse or reward hacking). With ``a`` agreeing
  and ``d`` disagreeing, the factor is ``(1 + a) / (1 + a + contradiction_weight * d)``.
"""

from __future__ import annotations

from collections.abc import Sequence

from remedy.cases.model import Case, Source, Status

from .diagnosis import patch_family

__all__ = ["trust_weights", "outcome_sign", "similar_signatures", "LOCAL_SOURCES"]

#: sources whose outcomes were measured by this KB's own verifications
LOCAL_SOURCES = frozenset({Source.verified, Source.bench})
#: symptom-tag overlap (Jaccard) from which two signatures on the same env count as similar
SYMPTOM_OVERLAP = 0.5


def outcome_sign(case: Case) -> int:
    """+1 for a verified improvement, -1 for a verified non-improvement, 0 when nothing was measured."""
    v = case.verification
    if v is None or v.status in (Status.failed, Status.stopped_early):
        return 0  # a crashed job, or a race's stage 1 on a share of the budget, says nothing about whether it helps
    return 1 if v.status == Status.improved else -1


def similar_signatures(a: Case, b: Case) -> bool:
    """Same env, same patch family, and symptom tags overlapping at least :data:`SYMPTOM_OVERLAP`."""
    if a.subject.env_id != b.subject.env_id or patch_family(a.patch) != patch_family(b.patch):
        return False
    sa, sb = set(a.signature.symptoms), set(b.signature.symptoms)
    return not (sa | sb) or len(sa & sb) / len(sa | sb) >= SYMPTOM_OVERLAP


def _corroboration(case: Case, others: Sequence[Case], contradiction_weight: float) -> float:
    sign = outcome_sign(case)
    if sign == 0 or contradiction_weight <= 0:
        return 1.0
    agree = disagree = 0
    for other in others:
        later = other.provenance.created_at > case.provenance.created_at
        if other is case or not later or other.source not in LOCAL_SOURCES or not similar_signatures(case, other):
            continue
        theirs = outcome_sign(other)
        agree += theirs == sign
        disagree += theirs == -sign
    return (1 + agree) / (1 + agree + contradiction_weight * disagree)


def trust_weights(
    cases: Sequence[Case], imported_weight: float = 0.5, contradiction_weight: float = 1.0
) -> list[float]:
    """One factor in [0, 1] per case, in order: provenance times corroboration among ``cases``.

    ``imported_weight=1`` and ``contradiction_weight=0`` switch the weighting off (all ones).
    """
    out = []
    for case in cases:
        provenance = imported_weight if case.source == Source.imported else 1.0
        out.append(provenance * _corroboration(case, cases, contradiction_weight))
    return out
