"""The metric: how well a predicted diagnosis agrees with what verification later said, in [0, 1].

Two kinds of example (:mod:`remedy.optimizer.dataset`):

**Solved** (some attempt of the group was confirmed ``improved``): partial credit,

    score = 0.7 * cause_credit + 0.3 * family_credit

where ``cause_credit`` is 1 when the predicted top cause is a cause of a verified fix, 0.5 when
one is at rank 2 or 3, else 0; ``family_credit`` is the same for the predicted patch families
against the families verified to fix it. So a top-1 cause (>= 0.7) beats a cause in the top
three (>= 0.35), which beats a family match alone (0.3 or 0.15).

**Unsolved** (nothing was confirmed): the group still says which families did *not* help
(verified ``no_effect``, ``worse`` or ``reward_hacking``; ``inconclusive``, crashed attempts and
candidates a race ``stopped_early`` at a share of the budget say nothing). The family part starts at 1 and loses 0.5 when the predicted top family
is one of them and 0.25 for each of ranks 2-3 that is (floored at 0); with nothing verified as
failed it is 1 whatever is predicted. A patch that did nothing does not show its cause was wrong
(the budget may have been too small), so verified failures never judge causes. Then:

- with a dev scenario's answer key (``example.truth``):
  ``score = 0.7 * cause_credit(truth) + 0.3 * family_part``, the cause credit as above against
  the key;
- without one (a user's run): ``score = family_part``, so the example only separates
  predictions that repeat a verified failure.

Predicted labels may be strings (an LLM's output); one outside the taxonomy matches nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from remedy.cases.model import RemedyFamily, RootCause, Status

from .dataset import Example

__all__ = ["Score", "score_prediction", "FAILED_STATUSES", "CAUSE_WEIGHT", "FAMILY_WEIGHT"]

#: weight of the root cause in a solved example's score (the rest is the family)
CAUSE_WEIGHT = 0.7
FAMILY_WEIGHT = 1.0 - CAUSE_WEIGHT
#: credit for a verified label at rank 1, and at ranks 2-3
_TOP1, _TOP3 = 1.0, 0.5
#: penalty on an unsolved example for a verified-failed family at rank 1, and at ranks 2-3
_FAIL_TOP1, _FAIL_TOP3 = 0.5, 0.25
#: verdicts that show a family did not help on a group
FAILED_STATUSES = frozenset({Status.no_effect.value, Status.worse.value, Status.reward_hacking.value})

E = TypeVar("E", RootCause, RemedyFamily)


@dataclass(frozen=True)
class Score:
    """A prediction's score in [0, 1], and feedback text for optimizers that read it (GEPA)."""

    score: float
    feedback: str


def score_prediction(
    example: Example, causes: Sequence[RootCause | str], families: Sequence[RemedyFamily | str]
) -> Score:
    """Score ranked predicted ``causes`` and patch ``families`` against the example's verified outcomes.

    Weights and the treatment of unsolved examples are in the module docstring.
    """
    pred_causes = _parse(RootCause, causes)
    pred_families = _parse(RemedyFamily, families)
    if example.solved:
        c = _credit(pred_causes, set(example.causes))
        f = _credit(pred_families, set(example.families))
        value, verdict = CAUSE_WEIGHT * c + FAMILY_WEIGHT * f, _solved_verdict(pred_causes, pred_families, example)
    else:
        value, verdict = _unsolved(pred_families, _failed_families(example))
        if example.truth:
            c = _credit(pred_causes, set(example.truth))
            value = CAUSE_WEIGHT * c + FAMILY_WEIGHT * value
            verdict = f"{_truth_verdict(pred_causes, example.truth)}; families: {verdict}"
    value = round(min(1.0, max(0.0, value)), 6)
    return Score(value, _feedback(example, pred_causes, pred_families, verdict, value))


def _parse(kind: type[E], items: Sequence[E | str]) -> list[E | None]:
    out: list[E | None] = []
    for item in items:
        try:
            out.append(kind(getattr(item, "value", item)))
        except ValueError:
            out.append(None)  # outside the taxonomy: holds its rank, matches nothing
    return out


def _credit(predicted: Sequence[object], truth: set) -> float:
    if predicted and predicted[0] in truth:
        return _TOP1
    return _TOP3 if any(p in truth for p in predicted[1:3]) else 0.0


def _failed_families(example: Example) -> set[RemedyFamily]:
    improved = set(example.families)
    return {t.family for t in example.tried if t.status in FAILED_STATUSES and t.family not in improved}


def _unsolved(predicted: Sequence[RemedyFamily | None], failed: set[RemedyFamily]) -> tuple[float, str]:
    if not failed:
        return 1.0, "nothing was verified to fail here, so any prediction scores 1"
    penalty = _FAIL_TOP1 if predicted and predicted[0] in failed else 0.0
    repeats = [p for p in predicted[1:3] if p in failed]
    penalty += _FAIL_TOP3 * len(repeats)
    if penalty == 0:
        return 1.0, "right: no family verified to fail here is ranked in the top three"
    named = [p.value for p in [*predicted[:1], *repeats] if p in failed]
    return 1.0 - penalty, f"wrong: ranks {', '.join(dict.fromkeys(named))} high, verified not to help here"


def _truth_verdict(causes: Sequence[RootCause | None], truth: Sequence[RootCause]) -> str:
    key = ", ".join(t.value for t in truth)
    if causes and causes[0] in truth:
        return f"right: top cause matches the scenario's answer key ({key})"
    if any(c in truth for c in causes[1:3]):
        return f"half: the answer key ({key}) is in the top three causes, not first"
    return f"wrong: the answer key ({key}) is not in the top three causes"


def _solved_verdict(
    causes: Sequence[RootCause | None], families: Sequence[RemedyFamily | None], example: Example
) -> str:
    parts = []
    for name, pred, truth in (("cause", causes, example.causes), ("family", families, example.families)):
        top = pred[0].value if pred and pred[0] is not None else "none"
        if pred and pred[0] in truth:
            parts.append(f"right: top {name} {top} is verified")
        elif any(p in truth for p in pred[1:3]):
            parts.append(f"half: top {name} {top} is not verified, but a verified one is in the top three")
        else:
            parts.append(f"wrong: no verified {name} ({', '.join(t.value for t in truth)}) in the top three")
    return "; ".join(parts)


def _feedback(
    example: Example,
    causes: Sequence[RootCause | None],
    families: Sequence[RemedyFamily | None],
    verdict: str,
    value: float,
) -> str:
    tried = "; ".join(t.text() for t in example.tried) or "nothing measured"
    fixed = (
        f"confirmed fixes: causes {', '.join(c.value for c in example.causes) or '?'}, "
        f"families {', '.join(f.value for f in example.families)} "
        f"({example.n_fixed} of {example.n_improved} improved attempts made the agent work)"
        if example.solved
        else "no attempt was confirmed to improve the task metric"
    )

    def show(items: Sequence[StrEnum | None]) -> str:
        return ", ".join(i.value if i is not None else "(not in the taxonomy)" for i in items[:3]) or "nothing"

    return (
        f"{example.group}: tried {tried}. {fixed.capitalize()}. "
        f"Predicted causes {show(causes)}; families {show(families)}. {verdict}. Score {value:.2f}."
    )
