"""Budgets from experience: how much fine-tuning a candidate patch needs, learned from confirmed fixes.

The diagnosis already retrieved the patient's nearest cases. Among them, those of the
candidate's patch family that a confirmation on fresh seeds found ``improved`` say
what budget was enough, relative to THEIR patient's training steps:

- a verification budget (env steps per arm): ``budget_steps`` (minus any extra steps a
  ``training_budget`` part added to both arms) / the patient's ``train_steps``;
- a ``training_budget`` patch's size: its ``extra_steps`` / the patient's ``train_steps``.

With at least :data:`MIN_BUDGET_CASES` such cases at similarity
:data:`BUDGET_SIMILARITY_FLOOR` or more, the median of their ratios (robust to one odd
case) times this patient's training steps, clipped to sane bounds, is the learned
budget; otherwise the default rule stands (scenario budget or prior fraction for a
verification, the prior multiple for a budget patch). Nothing here changes the
comparison: both arms still get the same env steps.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from remedy.cases.model import Case, RemedyFamily, Stage, Status, Subject, patch_family
from remedy.cases.patches.spec import Patch, TrainingBudget
from remedy.cases.verify.budgets import LearnedBudget

from .diagnosis import Attempt, CandidatePatch, DiagnosisReport, RetrievedCase
from .prior_templates import MAX_BUDGET_MULTIPLE

__all__ = [
    "MIN_BUDGET_CASES",
    "BUDGET_SIMILARITY_FLOOR",
    "VERIFY_FRACTION_BOUNDS",
    "EXTRA_FRACTION_BOUNDS",
    "extra_steps",
    "confirmed_fixes",
    "verify_fraction",
    "extra_fraction",
    "learned_budget",
    "learned_extra_steps",
    "LADDER_MAX_MULTIPLE",
    "ladder_steps",
    "size_candidates",
]

#: a budget is learned only from at least this many similar confirmed fixes of the family: with fewer,
#: one lucky case would set it (the median of 3 needs two to agree)
MIN_BUDGET_CASES = 3
#: neighbours less similar than this do not inform a budget; stricter than the vote's floor (0.3),
#: because a budget transfers only between failures of the same kind and size
BUDGET_SIMILARITY_FLOOR = 0.5
#: a learned verification budget stays within these fractions of the patient's training: at least a
#: few rollouts, and never more than training it again from scratch
VERIFY_FRACTION_BOUNDS = (0.02, 1.0)
#: the budget ladder within one fix loop: a budget patch that helped (a positive measured effect) but did not
#: leave a working agent is followed by twice its steps, up to this multiple of the patient's training. The
#: prior's largest proposal (MAX_BUDGET_MULTIPLE) is the ladder's first step; three doublings (one per round
#: of the default three-round loop) reach 8x. The doubling argument the prior cites needs the later steps:
#: without them a patient that needs 4x its training is never offered more than 1x-2x.
LADDER_MAX_MULTIPLE = 8 * MAX_BUDGET_MULTIPLE
#: a learned budget patch stays within these multiples of the patient's training: the ladder's top, which a
#: loop without experience may climb to, so experience can start where the ladder would have ended
EXTRA_FRACTION_BOUNDS = (0.05, LADDER_MAX_MULTIPLE)


def extra_steps(patch: Patch) -> int:
    """The extra training steps of a patch's budget parts (0 without one)."""
    return sum(int(p.extra_steps) for p in patch.parts if isinstance(p, TrainingBudget))


def confirmed_fixes(
    neighbours: Sequence[RetrievedCase], family: RemedyFamily, floor: float = BUDGET_SIMILARITY_FLOOR
) -> list[Case]:
    """Neighbours at ``floor`` similarity or more, of ``family``, confirmed ``improved`` on fresh seeds."""
    out = []
    for n in neighbours:
        v = n.case.verification
        if n.similarity < floor or v is None or v.status is not Status.improved or v.stage is not Stage.confirm:
            continue
        if patch_family(n.case.patch) == family:
            out.append(n.case)
    return out


def verify_fraction(case: Case) -> float | None:
    """The case's verification budget per arm over its patient's training steps (None: not a same-budget comparison
    or unknown)."""
    v, steps = case.verification, case.subject.train_steps
    if v is None or not steps or case.patch.budget_only:
        return None
    base = v.budget_steps - extra_steps(case.patch)  # budget_steps counts a combined budget part's steps too
    return base / steps if base > 0 else None


def extra_fraction(case: Case) -> float | None:
    """A pure budget patch's extra steps over its patient's training steps (None for other patches)."""
    steps = case.subject.train_steps
    if not steps or not case.patch.budget_only:
        return None
    return extra_steps(case.patch) / steps or None


def _learn(
    cases: Sequence[Case],
    ratio: Callable[[Case], float | None],
    train_steps: int | None,
    bounds: tuple[float, float],
    min_cases: int,
) -> LearnedBudget | None:
    """Median of the cases' ratios x ``train_steps``, clipped to ``bounds``; None with fewer than ``min_cases``."""
    pairs = [(c.case_id, r) for c in cases if (r := ratio(c)) is not None]
    if not train_steps or len(pairs) < min_cases:
        return None
    fraction = min(max(statistics.median(r for _, r in pairs), bounds[0]), bounds[1])
    return LearnedBudget(
        steps=max(1, round(fraction * train_steps)), fraction=round(fraction, 6), cases=[cid for cid, _ in pairs]
    )


def learned_budget(
    neighbours: Sequence[RetrievedCase],
    family: RemedyFamily,
    train_steps: int | None,
    *,
    min_cases: int = MIN_BUDGET_CASES,
    floor: float = BUDGET_SIMILARITY_FLOOR,
) -> LearnedBudget | None:
    """The verification budget for a ``family`` patch on a patient trained ``train_steps``, learned from the
    confirmed fixes among ``neighbours``; None when there are too few (the default rule applies)."""
    if family is RemedyFamily.training_budget:
        return None  # a pure budget patch is measured against the checkpoint: its size is the budget
    fixes = confirmed_fixes(neighbours, family, floor)
    return _learn(fixes, verify_fraction, train_steps, VERIFY_FRACTION_BOUNDS, min_cases)


def learned_extra_steps(
    neighbours: Sequence[RetrievedCase],
    train_steps: int | None,
    *,
    min_cases: int = MIN_BUDGET_CASES,
    floor: float = BUDGET_SIMILARITY_FLOOR,
) -> LearnedBudget | None:
    """A budget patch's extra steps for a patient trained ``train_steps``, learned from confirmed budget fixes
    among ``neighbours`` (their extra steps as a fraction of their patient's); None when there are too few."""
    fixes = confirmed_fixes(neighbours, RemedyFamily.training_budget, floor)
    return _learn(fixes, extra_fraction, train_steps, EXTRA_FRACTION_BOUNDS, min_cases)


def _resized(cand: CandidatePatch, extra: LearnedBudget | None, subject: Subject) -> CandidatePatch:
    """A pure budget candidate with its extra steps learned from the KB when possible; the source in its rationale."""
    if extra is None:
        steps = extra_steps(cand.patch)
        frac = f" = {steps / subject.train_steps:.3g} x train steps" if subject.train_steps else ""
        source = "a similar case" if any(c.startswith("c-") for c in cand.cites) else "the prior multiple"
        note = f"extra steps {steps:,}{frac} from {source} (too few similar confirmed budget fixes to learn from)"
        return cand.model_copy(update={"rationale": _join(cand.rationale, note)})
    note = f"extra steps {extra.steps:,} learned from the KB: {extra.text()} ({', '.join(extra.cases)})"
    patch = Patch(parts=[TrainingBudget(extra_steps=extra.steps)], description=note)
    cites = [*cand.cites, *(c for c in extra.cases if c not in cand.cites)]
    return cand.model_copy(update={"patch": patch, "rationale": _join(cand.rationale, note), "cites": cites})


def ladder_steps(tried: Sequence[Attempt], train_steps: int | None) -> tuple[int, Attempt] | None:
    """The next step of the budget ladder: twice the largest pure budget patch this loop tried that helped
    (measured effect above zero) without a working agent, or that a race dropped at stage 1 (measured on a
    third of its steps, which says little about a larger budget: a learner may dip before it climbs), capped
    at :data:`LADDER_MAX_MULTIPLE` x ``train_steps``; with the attempt it doubles. None when no such attempt
    exists or the cap is reached."""
    helped = [a for a in tried if a.patch.budget_only and (_helped(a) or a.status == Status.stopped_early.value)]
    if not helped or not train_steps:
        return None
    top = max(helped, key=lambda a: extra_steps(a.patch))
    steps = min(2 * extra_steps(top.patch), int(LADDER_MAX_MULTIPLE * train_steps))
    return (steps, top) if steps > extra_steps(top.patch) else None


def _helped(attempt: Attempt) -> bool:
    return attempt.effect is not None and attempt.effect > 0


def _laddered(cand: CandidatePatch, step: tuple[int, Attempt] | None) -> CandidatePatch:
    """A pure budget candidate raised to the ladder's next step when that is more than it already proposes."""
    if step is None or extra_steps(cand.patch) >= step[0]:
        return cand
    steps, top = step
    why = (
        f"helped (effect {top.effect:+.3g}, {top.status}) without a working agent"
        if _helped(top)
        else "a race dropped at stage 1 on a third of its steps"
    )
    note = f"extra steps {steps:,}: twice the {extra_steps(top.patch):,} this loop tried, which {why}"
    patch = Patch(parts=[TrainingBudget(extra_steps=steps)], description=f"+{steps:,} training steps (budget ladder)")
    cites = [*cand.cites, *([top.case_id] if top.case_id and top.case_id not in cand.cites else [])]
    return cand.model_copy(update={"patch": patch, "rationale": _join(cand.rationale, note), "cites": cites})


def _join(text: str, note: str) -> str:
    return f"{text}; {note}" if text else note


def size_candidates(
    report: DiagnosisReport, neighbours: Sequence[RetrievedCase], subject: Subject, tried: Sequence[Attempt] = ()
) -> DiagnosisReport:
    """``report`` with each candidate sized from experience: a budget patch's extra steps, and every other
    candidate's verification budget (``CandidatePatch.budget``), where enough similar confirmed fixes exist.
    A budget patch this loop already ``tried`` that helped without a working agent raises every budget
    candidate to the ladder's next step (:func:`ladder_steps`)."""
    extra = learned_extra_steps(neighbours, subject.train_steps)
    step = ladder_steps(tried, subject.train_steps)
    sized, seen = [], set()
    for cand in report.candidates:
        if cand.patch.budget_only:
            cand = _laddered(_resized(cand, extra, subject), step)
        else:
            budget = learned_budget(neighbours, cand.family, subject.train_steps)
            if budget is not None:
                note = f"verify at {budget.steps:,} env steps per arm learned from the KB: {budget.text()}"
                cand = cand.model_copy(update={"budget": budget, "rationale": _join(cand.rationale, note)})
        key = cand.patch.model_dump_json()
        if key not in seen:  # two budget candidates resized to the same steps are one candidate
            seen.add(key)
            sized.append(cand)
    return report.model_copy(update={"candidates": sized})
