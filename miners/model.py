"""The mined meta-rule: a condition over verified cases → a remedy family, with its evidence and review.

A rule says "when a failure looks like THIS (symptoms, env traits, algorithm family, root
cause), patches of THAT family helped", with the evidence that says how often and by how
much: the cases that support it, the cases against it, a pooled effect with a bootstrap
confidence interval, and a p-value adjusted for the number of rules tested
(Benjamini–Hochberg). A person reviews every rule (``proposed`` → ``accepted`` /
``rejected``); only accepted rules reach a diagnosis.

This module is the shared vocabulary of the miner (``miners.mine``), the rule store
(``miners.store``) and the reports (``miners.report``); it knows only ``cases``.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import Field

from remedy.cases.model import FrozenModel, RemedyFamily, RootCause, Status

__all__ = [
    "ConditionField",
    "Condition",
    "RuleStatus",
    "CaseRef",
    "RuleEvidence",
    "Review",
    "Rule",
    "rule_id",
]


class ConditionField(StrEnum):
    """What a condition tests on a case."""

    symptom = "symptom"  # a tag of the case's signature (e.g. jerky_actions)
    action_space = "action_space"  # discrete | continuous
    reward_density = "reward_density"  # dense | sparse
    obs_size = "obs_size"  # small | medium | large (bucketed observation dimension)
    algo_family = "algo_family"  # on_policy | off_policy (or the algorithm, e.g. PPO)
    root_cause = "root_cause"  # the diagnosed root cause the patch addressed


class Condition(FrozenModel):
    """One conjunct of a rule's condition: ``field`` has ``value``."""

    field: ConditionField
    value: str

    @property
    def text(self) -> str:
        """Readable form, e.g. ``action_space=continuous``."""
        return f"{self.field.value}={self.value}"


class RuleStatus(StrEnum):
    """Where a rule stands in human review."""

    proposed = "proposed"  # mined, not yet reviewed
    accepted = "accepted"  # a person accepted it: it feeds the diagnosers
    rejected = "rejected"  # a person rejected it: kept (with the note) so re-mining does not re-propose it as new


class CaseRef(FrozenModel):
    """A case a rule rests on (supporting or counter-evidence), with its measured outcome."""

    case_id: str
    scenario: str | None = None
    env_id: str = ""
    status: Status
    metric: str = ""
    diff: float | None = Field(default=None, allow_inf_nan=False)  # the case's effect.diff in ``metric`` units
    effect: float | None = Field(default=None, allow_inf_nan=False)  # the same, on the rule's pooled scale
    fixed: bool | None = None  # the agent now works (verification.fixed); None: not judged (older cases)


class RuleEvidence(FrozenModel):
    """What the verified cases say about a rule, as of ``mined_at``."""

    support: int = Field(ge=0)  # matching verified cases whose patch was of the rule's family
    wins: int = Field(ge=0)  # ... of which ended ``improved`` (confirmed on fresh seeds)
    #: ... of which the agent now works (``verification.fixed``: meets success or closes the declared gap share);
    #: 0 on rules mined before it was counted
    fixed: int = Field(default=0, ge=0)
    win_rate: float = Field(ge=0, le=1)
    effect_scale: str  # the pooled scale, e.g. "normalized improvement (diff / control spread)"
    effect: float = Field(allow_inf_nan=False)  # pooled effect on ``effect_scale``
    ci_low: float = Field(allow_inf_nan=False)
    ci_high: float = Field(allow_inf_nan=False)
    confidence_level: float = Field(default=0.95, gt=0, lt=1)
    p_value: float = Field(ge=0, le=1)
    q_value: float = Field(ge=0, le=1)  # Benjamini–Hochberg adjusted over the rules tested in that mining run
    supporting: list[CaseRef] = Field(default_factory=list)  # improved
    counter: list[CaseRef] = Field(default_factory=list)  # no_effect, worse, reward_hacking, failed, inconclusive
    mined_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    seed: int = 0  # bootstrap seed (same KB + seed → same evidence)


class Review(FrozenModel):
    """One review decision."""

    decision: RuleStatus
    reviewer: str
    at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    note: str = ""


class Rule(FrozenModel):
    """A mined meta-rule: ``conditions`` (all must hold) → patches of ``family`` help.

    Satisfies ``remedy.retrieval.diagnosis.RuleLike``: ``id``, ``conditions`` and a
    ``recommendation`` with ``cause``, ``family``, ``patch`` (None: the rule votes for a family,
    the diagnoser builds the patch) and ``confidence``.
    """

    id: str
    conditions: list[Condition]
    family: RemedyFamily
    cause: RootCause | None = None  # the root cause the winning patches addressed, when consistent
    params: dict[str, Any] = Field(default_factory=dict)  # patch parameters, when consistent across the wins
    evidence: RuleEvidence
    status: RuleStatus = RuleStatus.proposed
    reviews: list[Review] = Field(default_factory=list)
    #: set when re-mining finds the evidence of an ACCEPTED rule turned against it (says how)
    flag: str = ""
    #: other conditions that matched exactly the same cases in the mining run (folded into this rule)
    equivalent: list[str] = Field(default_factory=list)

    @property
    def condition_text(self) -> str:
        """The condition, readable: ``action_space=continuous ∧ symptom=jerky_actions``."""
        return " ∧ ".join(c.text for c in self.conditions)

    @property
    def recommendation(self) -> dict[str, Any]:
        """What a diagnoser takes from the rule (see ``RuleLike``)."""
        return {
            "cause": self.cause.value if self.cause else None,
            "family": self.family.value,
            "patch": None,
            "confidence": self.evidence.win_rate,
        }


def rule_id(conditions: list[Condition], family: RemedyFamily) -> str:
    """Stable id from the condition set and the family: re-mining finds the same rule again."""
    key = json.dumps(
        {"if": sorted(c.text for c in conditions), "then": family.value}, sort_keys=True, separators=(",", ":")
    )
    return "r-" + hashlib.sha256(key.encode()).hexdigest()[:10]
