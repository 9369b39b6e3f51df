"""Each attempt once, at its final verdict.

A fix loop stores a screen and, when the screen clears, its confirmation on fresh seeds (a
separate case whose ``verification.confirms`` names the screen). Whatever learns from outcomes
(rule mining, the optimizer's datasets) must count such an attempt once, with the confirmation's
verdict: counting the screen too would count one patch twice, and a screen's own status is never
``improved`` (only a confirmation may end that way).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from .model import Case, Stage

__all__ = ["final_verdicts"]


def _when(case: Case) -> tuple:
    return (case.provenance.created_at, case.case_id)


def final_verdicts(cases: Iterable[Case]) -> list[tuple[Case, Case]]:
    """``(attempt, verdict)`` per attempt among ``cases``, in the order given.

    ``attempt`` is the case of the patch as first measured (the screen); ``verdict`` is its latest
    confirmation among ``cases`` (by creation time, then id), or the attempt itself when it has
    none. A confirmation whose screen is not among ``cases`` stands alone as its own attempt.
    """
    cases = list(cases)
    ids = {c.case_id for c in cases}

    def confirms(case: Case) -> str | None:
        v = case.verification
        return v.confirms if v is not None and v.stage == Stage.confirm and v.confirms in ids else None

    later: dict[str, list[Case]] = defaultdict(list)
    for c in cases:
        if (screen := confirms(c)) is not None:
            later[screen].append(c)
    return [(c, max(later[c.case_id], key=_when) if later.get(c.case_id) else c) for c in cases if confirms(c) is None]
