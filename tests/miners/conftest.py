"""Builders of measured cases for the miner tests (hand-built, small, varied)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from remedy.cases.model import (
    Case,
    Cause,
    Diagnosis,
    Effect,
    EnvTraits,
    Signature,
    Subject,
    Verification,
)
from remedy.cases.patches import Patch

#: the dev-scenario export the bench fills (committed by the lead; absent on a fresh branch)
DEV_EXPORT = Path(__file__).resolve().parents[2] / "reports" / "kb" / "dev-cases.jsonl"
_T0 = datetime(2026, 12, 1, tzinfo=UTC)
_PATCHES = {
    "action_smoothness": {"kind": "action_smoothness", "coef": 0.1},
    "training_budget": {"kind": "training_budget", "extra_steps": 20000},
    "normalization": {"kind": "normalization", "obs": True},
    "hyperparameters": {"kind": "hyperparameters", "learning_rate": 0.0003},
}


def measured(
    n: int,
    *,
    family: str = "training_budget",
    status: str = "improved",
    diff: float = 0.5,
    half: float = 0.25,
    symptoms: tuple[str, ...] = (),
    action_space: str = "discrete",
    env_id: str = "CartPole-v1",
    algo: str = "PPO",
    cause: str = "undertraining",
    patch: dict | None = None,
    stage: str = "screen",
    confirms: str | None = None,
    scenario: str | None = None,
    case_id: str | None = None,
) -> Case:
    """A bench case numbered ``n`` with a measured verdict: effect ``diff`` ± ``half``."""
    effect = Effect(
        metric="success_rate", treatment=diff, control=0.0, diff=diff, ci_low=diff - half, ci_high=diff + half
    )
    return Case(
        case_id=case_id or f"c-{n:04d}",
        source="bench",
        subject=Subject(env_id=env_id, algo=algo, traits=EnvTraits(action_space=action_space, obs_dim=4, action_dim=2)),
        signature=Signature(features={}, symptoms=list(symptoms), summary=f"case {n}"),
        diagnosis=Diagnosis(causes=[Cause(cause=cause, confidence=0.7)]),
        patch=Patch.from_data(patch or _PATCHES[family]),
        verification=Verification(status=status, effect=effect, seeds=2, stage=stage, confirms=confirms),
        scenario=scenario or f"scn_{n % 7}",
        provenance={"created_at": _T0 + timedelta(minutes=n)},
    )


def planted_cases() -> list[Case]:
    """A planted rule (continuous ∧ jerky_actions → action_smoothness: 5 of 6 improved) among noise.

    Noise: training budgets on discrete undertrained agents that never won (no_effect, worse),
    and normalization attempts with a single win in five.
    """
    cases = []
    for i in range(6):
        win = i != 5
        cases.append(
            measured(
                i,
                family="action_smoothness",
                status="improved" if win else "no_effect",
                diff=0.6 if win else 0.05,
                symptoms=("jerky_actions", "low_success"),
                action_space="continuous",
                env_id="Pendulum-v1",
                cause="action_jitter",
            )
        )
    for i in range(6, 14):
        cases.append(
            measured(
                i,
                family="training_budget",
                status="no_effect" if i % 3 else "worse",
                diff=0.02 if i % 3 else -0.3,
                symptoms=("undertrained", "low_success"),
            )
        )
    for i in range(14, 19):
        cases.append(
            measured(
                i,
                family="normalization",
                status="improved" if i == 14 else "no_effect",
                diff=0.4 if i == 14 else 0.0,
                symptoms=("low_success",),
                cause="observation_scaling",
            )
        )
    return cases


@pytest.fixture
def planted() -> list[Case]:
    """:func:`planted_cases`."""
    return planted_cases()


@pytest.fixture
def make_measured():
    """:func:`measured`, for tests that build their own case lists."""
    return measured
