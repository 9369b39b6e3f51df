"""Cases and rules for the report tests: real bench cases when the repo has them, else built ones.

The rules here are test data built from cases (the miner lives in ``miners.mine``): their
evidence is computed from the cases they cite with a small seeded bootstrap, so a report over
them shows what a mined report shows.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from remedy.cases.io import read_cases
from remedy.cases.model import (
    Case,
    Cause,
    Diagnosis,
    Effect,
    EnvTraits,
    RemedyFamily,
    Signature,
    Subject,
    Verification,
)
from remedy.cases.patches import Patch
from remedy.miners.model import CaseRef, Condition, ConditionField, Review, Rule, RuleEvidence, RuleStatus, rule_id

REPO = Path(__file__).resolve().parents[2]
DEV_CASES = REPO / "reports" / "kb" / "dev-cases.jsonl"
MINED_AT = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)


def make_case(
    case_id: str,
    *,
    status: str = "improved",
    diff: float = 0.4,
    per_seed: dict[str, list[float]] | None = None,
    patch: dict | None = None,
    symptoms: Sequence[str] = ("jerky_actions",),
    action_space: str = "continuous",
    env_id: str = "Pendulum-v1",
) -> Case:
    """A verified bench case; ``per_seed`` None stores the arm means only."""
    control = 0.2
    effect = Effect(
        metric="success_rate",
        treatment=control + diff,
        control=control,
        diff=diff,
        ci_low=diff - 0.3,
        ci_high=diff + 0.3,
        method="welch_seeds",
    )
    verification = Verification(
        status=status, effect=effect, seeds=3, budget_steps=20000, per_seed=per_seed or {}, stage="confirm"
    )
    return Case(
        case_id=case_id,
        source="bench",
        scenario=f"scenario_{case_id}",
        subject=Subject(
            env_id=env_id, algo="SAC", traits=EnvTraits(action_space=action_space, obs_dim=3, action_dim=1)
        ),
        signature=Signature(symptoms=list(symptoms), summary="torque chatters between the bounds"),
        diagnosis=Diagnosis(causes=[Cause(cause="action_jitter", confidence=0.7)]),
        patch=Patch.from_data(patch or {"kind": "action_smoothness", "coef": 0.1}),
        verification=verification,
    )


def family_of(case: Case) -> RemedyFamily:
    """The remedy family of a case's first patch part."""
    return RemedyFamily(case.patch.parts[0].kind)


def _ref(case: Case) -> CaseRef:
    v = case.verification
    assert v is not None and v.effect is not None
    return CaseRef(
        case_id=case.case_id,
        scenario=case.scenario,
        env_id=case.subject.env_id,
        status=v.status,
        metric=v.effect.metric,
        diff=v.effect.diff,
        effect=v.effect.diff,
    )


def make_rule(
    cases: Sequence[Case],
    conditions: Sequence[tuple[str, str]],
    family: RemedyFamily,
    *,
    status: RuleStatus = RuleStatus.proposed,
    reviews: Sequence[Review] = (),
    flag: str = "",
    seed: int = 0,
) -> Rule:
    """A rule over ``cases`` with evidence computed from them (seeded bootstrap CI of the mean diff)."""
    diffs = np.array([c.verification.effect.diff for c in cases if c.verification and c.verification.effect])
    boot = np.random.default_rng(seed).choice(diffs, size=(500, len(diffs))).mean(axis=1)
    wins = sum(c.status == "improved" for c in cases)
    conds = [Condition(field=ConditionField(f), value=v) for f, v in conditions]
    evidence = RuleEvidence(
        support=len(cases),
        wins=wins,
        win_rate=wins / len(cases),
        effect_scale=f"{cases[0].verification.effect.metric} difference (treatment − control)",
        effect=float(diffs.mean()),
        ci_low=float(np.quantile(boot, 0.025)),
        ci_high=float(np.quantile(boot, 0.975)),
        p_value=0.01 * len(conds),
        q_value=min(1.0, 0.02 * len(conds)),
        supporting=[_ref(c) for c in cases if c.status == "improved"],
        counter=[_ref(c) for c in cases if c.status != "improved"],
        mined_at=MINED_AT,
        seed=seed,
    )
    return Rule(
        id=rule_id(conds, family),
        conditions=conds,
        family=family,
        params={"coef": 0.1} if family is RemedyFamily.action_smoothness else {},
        evidence=evidence,
        status=status,
        reviews=list(reviews),
        flag=flag,
    )


def review(decision: RuleStatus, note: str = "") -> Review:
    """A review by 'alice' at a fixed time."""
    return Review(decision=decision, reviewer="alice", at=MINED_AT, note=note)


def sample_cases() -> list[Case]:
    """Six Pendulum cases: smoothness wins (with and without per-seed data), a worse one, a no_effect."""
    return [
        make_case("c-s1", per_seed={"treatment": [0.7, 0.6, 0.5], "control": [0.2, 0.1, 0.3]}),
        make_case("c-s2", diff=0.3),
        make_case("c-s3", status="worse", diff=-0.25, per_seed={"treatment": [0.0, 0.1], "control": [0.2, 0.3]}),
        make_case("c-n1", status="no_effect", diff=0.05, patch={"kind": "training_budget", "extra_steps": 5000}),
        make_case("c-n2", status="improved", diff=0.5, patch={"kind": "training_budget", "extra_steps": 5000}),
        make_case("c-r1", status="no_effect", diff=0.0, patch={"kind": "normalization", "obs": True}),
    ]


def sample_rules(cases: Sequence[Case]) -> list[Rule]:
    """One rule of each review state over :func:`sample_cases`: accepted, proposed, flagged, rejected."""
    by_id = {c.case_id: c for c in cases}
    smooth = [by_id[i] for i in ("c-s1", "c-s2", "c-s3")]
    return [
        make_rule(
            smooth,
            [("symptom", "jerky_actions")],
            RemedyFamily.action_smoothness,
            status=RuleStatus.accepted,
            reviews=[review(RuleStatus.accepted, "matches the RL folklore | and our runs")],
        ),
        make_rule([by_id["c-n1"], by_id["c-n2"]], [("action_space", "continuous")], RemedyFamily.training_budget),
        make_rule(
            smooth[:2],
            [("symptom", "jerky_actions"), ("action_space", "continuous")],
            RemedyFamily.action_smoothness,
            status=RuleStatus.accepted,
            reviews=[review(RuleStatus.accepted)],
            flag="win rate fell from 100% to 40% after re-mining",
        ),
        make_rule(
            [by_id["c-r1"]],
            [("root_cause", "action_jitter")],
            RemedyFamily.normalization,
            status=RuleStatus.rejected,
            reviews=[review(RuleStatus.rejected, "one case, no effect")],
        ),
    ]


def dev_rules(cases: Sequence[Case], limit: int = 6) -> list[Rule]:
    """Rules over real bench cases: one per (action space, remedy family) with at least one case."""
    groups: dict[tuple[str, RemedyFamily, str], list[Case]] = defaultdict(list)
    for case in cases:
        v = case.verification
        if v is not None and v.effect is not None:  # one metric per rule: effects pool on one scale
            groups[(case.subject.traits.action_space.value, family_of(case), v.effect.metric)].append(case)
    rules = [
        make_rule(
            group, [("action_space", space)], family, status=RuleStatus.accepted if i == 0 else RuleStatus.proposed
        )
        for i, ((space, family, _), group) in enumerate(sorted(groups.items()))
    ]
    return rules[:limit]


def report_inputs() -> tuple[list[Rule], dict[str, Case]]:
    """Rules and cases for rendering: real bench cases if ``reports/kb/dev-cases.jsonl`` is there."""
    cases: list[Case] = read_cases(DEV_CASES)[0] if DEV_CASES.is_file() else []
    rules = dev_rules(cases)
    if not rules:  # no bench export in this checkout: build cases instead
        cases = [
            make_case("c-s1", per_seed={"treatment": [0.7, 0.6, 0.5], "control": [0.2, 0.1, 0.3]}),
            make_case("c-s2", diff=0.3),
            make_case("c-n1", status="no_effect", diff=0.05, patch={"kind": "training_budget", "extra_steps": 5000}),
        ]
        rules = dev_rules(cases)
    return rules, {c.case_id: c for c in cases}
