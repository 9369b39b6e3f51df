"""Neighbours by patient: the k most similar past failures with their attempts, not the k most similar cases.

A fix loop stores one case per attempt, and the case factory tries the same patient several times,
so the k cases nearest to a signature are often one or two patients' attempts over and over (on the
holdout patients the ten nearest cases held 2.7 distinct patients: ``bench/neighbour_diversity.py``).
The vote then hears the same experience repeatedly and never the next most similar failure, whose
fix may be the one that fits. :func:`by_patient` widens the search to a pool and keeps the cases
of the ``k`` most similar distinct patients, every attempt of each that the pool holds, best first.

A patient is the failing run a case treated: its bench scenario when it has one, else its
checkpoint's hash, else the case alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from remedy.cases.model import Case

from .diagnosis import RetrievedCase

__all__ = ["POOL_PER_PATIENT", "MAX_POOL", "patient_key", "pool_size", "by_patient"]

#: cases searched per wanted patient: a patient's attempts are usually fewer than this
POOL_PER_PATIENT = 8
#: the widest search, whatever k asks: bounds the work of one diagnosis
MAX_POOL = 200


def patient_key(case: Case) -> str:
    """Which failing run ``case`` treated (see the module docstring)."""
    if case.scenario:
        return f"scenario:{case.scenario}"
    if case.subject.checkpoint_sha256:
        return f"checkpoint:{case.subject.checkpoint_sha256}"
    return f"case:{case.case_id}"


def pool_size(k: int) -> int:
    """How many cases to search for ``k`` patients."""
    return max(k, min(k * POOL_PER_PATIENT, MAX_POOL))


def by_patient(cases: Sequence[RetrievedCase], k: int) -> list[RetrievedCase]:
    """The cases of the ``k`` distinct patients first met in ``cases`` (best first), in their given order."""
    keep: set[str] = set()
    out = []
    for r in cases:
        key = patient_key(r.case)
        if key not in keep:
            if len(keep) >= k:
                continue
            keep.add(key)
        out.append(r)
    return out
