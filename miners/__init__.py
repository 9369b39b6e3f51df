"""Meta-rule mining and review state: recurring "condition → remedy family" lessons in measured cases.

``mine`` finds the rules (``miners.mine``), ``RuleStore`` keeps them and their reviews in the
KB (``miners.store``), ``facts`` says what a condition may test and whether a rule holds for
a failure being diagnosed. Imports ``cases`` only.
"""

from .facts import Attempt, case_facts, final_attempts, rule_holds, subject_facts
from .mine import EFFECT_SCALE, MIN_ATTEMPTS, NULL_WIN_RATE, MiningResult, mine
from .model import CaseRef, Condition, ConditionField, Review, Rule, RuleEvidence, RuleStatus, rule_id
from .store import RuleStore, UpsertReport, default_reviewer

__all__ = [
    "Attempt",
    "case_facts",
    "final_attempts",
    "rule_holds",
    "subject_facts",
    "EFFECT_SCALE",
    "MIN_ATTEMPTS",
    "NULL_WIN_RATE",
    "MiningResult",
    "mine",
    "CaseRef",
    "Condition",
    "ConditionField",
    "Review",
    "Rule",
    "RuleEvidence",
    "RuleStatus",
    "rule_id",
    "RuleStore",
    "UpsertReport",
    "default_reviewer",
]
