"""Fixtures for retrieval tests: the real embedding model (loaded once) and a case factory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from remedy.cases.model import (
    ActionSpaceType,
    Case,
    Effect,
    EnvTraits,
    Signature,
    Source,
    Status,
    Subject,
    Verification,
)
from remedy.cases.patches.spec import Hyperparameters, Patch
from remedy.retrieval import MiniLMEmbedder, default_embedder

MakeCase = Callable[..., Case]


@pytest.fixture(scope="session")
def embedder() -> MiniLMEmbedder:
    """The bundled MiniLM, loaded once per test session."""
    return default_embedder()  # type: ignore[return-value]


def build_case(
    case_id: str,
    summary: str,
    *,
    symptoms: list[str] | None = None,
    env_id: str = "LunarLander-v3",
    action_space: str = "discrete",
    algo: str = "PPO",
    status: str | None = "improved",
    effect: float | None = 1.0,
    scenario: str | None = None,
    source: str = "verified",
) -> Case:
    """A minimal valid case; ``status=None`` leaves it unverified."""
    verification = None
    if status is not None:
        eff = None
        if effect is not None:
            eff = Effect(
                metric="return_iqm", treatment=effect, control=0.0, diff=effect, ci_low=effect - 1, ci_high=effect + 1
            )
        verification = Verification(status=Status(status), effect=eff, seeds=2)
    subject: dict[str, Any] = {
        "env_id": env_id,
        "algo": algo,
        "traits": EnvTraits(action_space=ActionSpaceType(action_space), obs_dim=8, action_dim=4),
    }
    return Case(
        case_id=case_id,
        source=Source(source),
        subject=Subject(**subject),
        signature=Signature(summary=summary, symptoms=symptoms or []),
        patch=Patch(parts=[Hyperparameters(changes={"learning_rate": 1e-4})]),
        verification=verification,
        scenario=scenario,
    )


@pytest.fixture
def make_case() -> MakeCase:
    """Factory for cases: ``make_case(id, summary, env_id=..., status=..., effect=...)``."""
    return build_case
