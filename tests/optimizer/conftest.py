"""Builders for the optimizer tests: fix-loop-shaped cases (screens, confirmations, parent links)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from remedy.cases.io import read_cases
from remedy.cases.model import (
    ActionSpaceType,
    Case,
    Cause,
    Diagnosis,
    Effect,
    EnvTraits,
    Provenance,
    RootCause,
    Signature,
    Source,
    Stage,
    Status,
    Subject,
    Verification,
)
from remedy.cases.patches.spec import Hyperparameters, Normalization, Patch, TimeLimit, TrainingBudget

#: the bench's export of verified dev-scenario cases (committed to main by the lead; may grow)
DEV_CASES = Path(__file__).resolve().parents[2] / "reports" / "kb" / "dev-cases.jsonl"

PATCHES = {
    "hyperparameters": Patch(parts=[Hyperparameters(changes={"learning_rate": 1e-4})]),
    "normalization": Patch(parts=[Normalization(obs=True)]),
    "time_limit": Patch(parts=[TimeLimit(max_episode_steps=500)]),
    "training_budget": Patch(parts=[TrainingBudget(extra_steps=50_000)]),
}
_T0 = datetime(2026, 1, 1, tzinfo=UTC)


def make_case(
    case_id: str,
    *,
    family: str = "hyperparameters",
    status: str = "no_effect",
    stage: str = "screen",
    confirms: str | None = None,
    parent: str | None = None,
    scenario: str | None = "s1",
    causes: tuple[str, ...] = ("unstable_optimization", "undertraining"),
    summary: str = "the agent fails",
    effect: float | None = 0.0,
    minute: int = 0,
    checkpoint: str | None = None,
    source: str = "bench",
    env_id: str = "CartPole-v1",
    at: datetime | None = None,
) -> Case:
    """A measured case as a fix loop stores it (diagnosis of its round, stage, links)."""
    eff = None
    if effect is not None:
        eff = Effect(
            metric="return_iqm", treatment=effect, control=0.0, diff=effect, ci_low=effect - 1, ci_high=effect + 1
        )
    verification = Verification(
        status=Status(status),
        effect=eff,
        seeds=2,
        stage=Stage(stage),
        confirms=confirms,
        passed_screen=stage == "screen" and confirms is None and status == "inconclusive",
    )
    subject: dict[str, Any] = {
        "env_id": env_id,
        "algo": "PPO",
        "checkpoint_sha256": checkpoint,
        "traits": EnvTraits(action_space=ActionSpaceType.discrete, obs_dim=4, action_dim=2),
    }
    return Case(
        case_id=case_id,
        source=Source(source),
        subject=Subject(**subject),
        signature=Signature(summary=summary, symptoms=[]),
        diagnosis=Diagnosis(
            causes=[Cause(cause=RootCause(c), confidence=0.5 / (i + 1)) for i, c in enumerate(causes)],
            backend="offline",
        ),
        patch=PATCHES[family],
        verification=verification,
        provenance=Provenance(created_at=at or _T0 + timedelta(minutes=minute)),
        scenario=scenario,
        parent_id=parent,
    )


def fix_loop(
    scenario: str,
    *,
    fixed: str | None = None,
    failed: tuple[str, ...] = ("hyperparameters",),
    run: str = "",
    **kw: Any,
) -> list[Case]:
    """The cases of one fix loop: screens of ``failed`` families (no_effect), then ``fixed`` screened and
    confirmed; ``run`` suffixes the ids (several loops on one scenario)."""
    cases: list[Case] = []

    def parent() -> str | None:
        return cases[-1].case_id if cases else None

    for fam in failed:
        cases.append(make_case(f"{scenario}-{fam}{run}", family=fam, scenario=scenario, parent=parent(), **kw))
    if fixed is not None:
        screen = make_case(
            f"{scenario}-{fixed}-screen{run}",
            family=fixed,
            status="inconclusive",
            scenario=scenario,
            parent=parent(),
            effect=5.0,
            **kw,
        )
        cases.append(screen)
        cases.append(
            make_case(
                f"{scenario}-{fixed}-confirm{run}",
                family=fixed,
                status="improved",
                stage="confirm",
                confirms=screen.case_id,
                parent=parent(),
                scenario=scenario,
                effect=4.0,
                **kw,
            )
        )
    return cases


@pytest.fixture(scope="session")
def dev_cases() -> list[Case]:
    """The bench's real verified dev-scenario cases; skips when the export is not there."""
    if not DEV_CASES.exists():
        pytest.skip(f"{DEV_CASES} not present (the bench export the lead commits)")
    cases, _ = read_cases(DEV_CASES)
    return cases
