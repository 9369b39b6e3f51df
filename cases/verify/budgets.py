"""Which fine-tuning budget a verification uses, and where it came from.

A verification's budget (env steps per arm) is chosen in this order:

1. ``user``: an explicit ``--budget`` (``VerifyConfig.budget_steps``) always wins;
2. ``kb``: a budget learned from experience — similar past cases of the same patch
   family that were confirmed ``improved``, and at what budget relative to their
   patient's training (``remedy.retrieval.budgets`` learns it; a :class:`LearnedBudget`
   carries it here with the case ids it rests on);
3. ``scenario``: the budget a fault scenario declares for its patient;
4. ``prior``: ``VerifyConfig.budget_fraction`` of the patient's training steps.

The choice is recorded in the case (``verification.budget_source`` and
``verification.budget_cases``). Whatever its source, both arms get the same
budget (:func:`remedy.cases.verify.training.arm_budgets`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from ..errors import VerificationError
from ..model import FrozenModel

if TYPE_CHECKING:
    from .config import VerifyConfig

__all__ = ["BudgetSource", "LearnedBudget", "BudgetChoice", "choose_budget"]

#: where a verification's budget came from (``Verification.budget_source`` adds "patch": a pure budget
#: patch's own extra steps, whatever the budget chosen here)
BudgetSource = Literal["user", "kb", "scenario", "prior"]


class LearnedBudget(FrozenModel):
    """A budget learned from the KB: ``fraction`` of the patient's training steps, from ``cases``."""

    steps: int = Field(ge=1)
    fraction: float = Field(gt=0, allow_inf_nan=False)  # the robust summary (median) of the cases' ratios
    cases: list[str] = Field(default_factory=list)

    def text(self) -> str:
        """``0.2 x train steps, median of 3 confirmed fixes``."""
        return f"{self.fraction:.3g} x train steps, median of {len(self.cases)} confirmed fix(es)"


@dataclass(frozen=True)
class BudgetChoice:
    """The budget a verification runs at, and why."""

    steps: int
    source: BudgetSource
    cases: tuple[str, ...] = ()
    detail: str = ""

    def text(self) -> str:
        """``20,000 steps (kb: 0.2 x train steps, median of 3 confirmed fix(es))``."""
        why = f"{self.source}: {self.detail}" if self.detail else self.source
        return f"{self.steps:,} steps ({why})"


def choose_budget(
    config: VerifyConfig, train_steps: int | None, declared: int | None = None, learned: LearnedBudget | None = None
) -> BudgetChoice:
    """The budget per arm: the user's, else the KB's ``learned`` one, else the scenario's ``declared``, else the prior."""
    if config.budget_steps is not None:
        return BudgetChoice(int(config.budget_steps), "user", detail="--budget")
    if learned is not None:
        return BudgetChoice(learned.steps, "kb", tuple(learned.cases), learned.text())
    if declared:
        return BudgetChoice(int(declared), "scenario", detail="declared by the scenario")
    if not train_steps:
        raise VerificationError("run.yaml has no train_steps, so the default budget is unknown; pass --budget STEPS")
    steps = max(1, round(config.budget_fraction * train_steps))
    return BudgetChoice(steps, "prior", detail=f"{config.budget_fraction:g} x train steps")
