""" "Fixed" means the agent now works, not merely that it got better.

A confirmation ends ``improved`` when the treatment is clearly better than its control
on fresh seeds. That can be true while the agent still fails every episode (return
−1,603 against −1,611 when success needs −300). A patient is **fixed** only when the
confirmed treatment

- meets the run's success definition: its success rate reaches :data:`WORKS_AT` (the
  line below which a patient "fails", :data:`~remedy.cases.verify.solvability.FAIL_BELOW`), or
- closes at least ``share`` (default :data:`FIX_SHARE`, 50%) of the gap between the patient's
  own value and that threshold, measured on the success rate or, for a return-threshold task
  (:class:`~remedy.cases.success.ReturnThreshold`), on the return (IQM).

``gap_closed`` is the largest share closed on either scale (1.0: the threshold is reached;
negative: the treatment is worse than the patient). The patient's own value is the
deterministic evidence rollout of the unmodified checkpoint, the episodes every verification
collects anyway; the treatment's is the arms' own measurement (mean success rate, IQM of the
per-seed return IQMs). A verification that is not an ``improved`` confirmation is never fixed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..model import Stage, Status
from ..success import ReturnThreshold, SuccessSpec
from .stats import iqm

if TYPE_CHECKING:
    from ..model import Verification

__all__ = [
    "WORKS_AT",
    "FIX_SHARE",
    "FixedVerdict",
    "judge_fixed",
    "gap_share",
    "patient_values",
    "return_threshold",
    "judge_verification",
]

#: a success rate at or above this meets the success definition (solvability.FAIL_BELOW: a patient below it fails)
WORKS_AT = 0.5
#: the share of the patient's gap to the threshold a confirmed treatment must close to count as fixed
FIX_SHARE = 0.5


@dataclass(frozen=True)
class FixedVerdict:
    """Whether a verification fixed its patient, and the share of the gap its treatment closed (None: unmeasured)."""

    fixed: bool
    gap_closed: float | None


def gap_share(patient: float, treatment: float, threshold: float) -> float | None:
    """The share of ``threshold − patient`` that ``treatment`` closed (None when the patient is already there)."""
    gap = threshold - patient
    if not np.isfinite(gap) or gap <= 0 or not np.isfinite(treatment):
        return None
    return float((treatment - patient) / gap)


def judge_fixed(
    *,
    improved: bool,
    treatment_success: float | None,
    patient_success: float | None,
    treatment_return: float | None = None,
    patient_return: float | None = None,
    return_threshold: float | None = None,
    share: float = FIX_SHARE,
    works_at: float = WORKS_AT,
) -> FixedVerdict:
    """The rule on plain numbers (see the module docstring); ``improved``: a confirmation ended ``improved``."""
    gaps = []
    if treatment_success is not None and patient_success is not None:
        gaps.append(gap_share(patient_success, treatment_success, works_at))
    if return_threshold is not None and treatment_return is not None and patient_return is not None:
        gaps.append(gap_share(patient_return, treatment_return, return_threshold))
    kept = [g for g in gaps if g is not None]
    gap = max(kept) if kept else None
    works = treatment_success is not None and treatment_success >= works_at
    return FixedVerdict(fixed=bool(improved and (works or (gap is not None and gap >= share))), gap_closed=gap)


class PatientEpisode(Protocol):
    """What the judgement reads of one evidence episode of the patient (an ``EpisodeRecord`` is one)."""

    @property
    def success(self) -> bool: ...

    @property
    def ret(self) -> float: ...


def patient_values(successes: Sequence[bool], returns: Sequence[float]) -> tuple[float | None, float | None]:
    """The patient's own success rate and return IQM from its evidence episodes (None: no episodes)."""
    if not successes:
        return None, None
    finite = [r for r in returns if np.isfinite(r)]
    return float(np.mean([bool(s) for s in successes])), (iqm(finite) if finite else None)


def return_threshold(spec: SuccessSpec) -> float | None:
    """The return a task's success definition asks for, when it is a return threshold."""
    return spec.threshold if isinstance(spec, ReturnThreshold) else None


def judge_verification(
    verification: Verification, episodes: Sequence[PatientEpisode], spec: SuccessSpec, share: float = FIX_SHARE
) -> Verification:
    """``verification`` with ``fixed`` and ``gap_closed`` set, from the patient's evidence ``episodes`` (records
    with ``success`` and ``ret``) and the run's success definition; unchanged when it measured no effect."""
    v = verification
    if v.effect is None:
        return v
    effects = {v.effect.metric: v.effect, **v.secondary}
    success, ret = effects.get("success_rate"), effects.get("return_iqm")
    p_success, p_return = patient_values([e.success for e in episodes], [e.ret for e in episodes])
    verdict = judge_fixed(
        improved=v.status is Status.improved and v.stage is Stage.confirm,
        treatment_success=None if success is None else success.treatment,
        patient_success=p_success,
        treatment_return=None if ret is None else ret.treatment,
        patient_return=p_return,
        return_threshold=return_threshold(spec),
        share=share,
    )
    return v.model_copy(update={"fixed": verdict.fixed, "gap_closed": verdict.gap_closed})
