"""Each attempt once, at its final verdict (cases/outcomes.py), as the miner and the optimizer count it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from remedy.cases.model import (
    ActionSpaceType,
    Case,
    EnvTraits,
    Provenance,
    Signature,
    Source,
    Stage,
    Status,
    Subject,
    Verification,
)
from remedy.cases.outcomes import final_verdicts
from remedy.cases.patches.spec import Hyperparameters, Patch

_T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _case(case_id: str, status: str, *, confirms: str | None = None, minute: int = 0, verified: bool = True) -> Case:
    verification = None
    if verified:
        stage = Stage.confirm if confirms else Stage.screen
        verification = Verification(status=Status(status), seeds=3, stage=stage, confirms=confirms)
    return Case(
        case_id=case_id,
        source=Source.bench,
        subject=Subject(
            env_id="CartPole-v1",
            algo="PPO",
            traits=EnvTraits(action_space=ActionSpaceType.discrete, obs_dim=4, action_dim=2),
        ),
        signature=Signature(summary="the agent fails", symptoms=[]),
        patch=Patch(parts=[Hyperparameters(changes={"learning_rate": 1e-4})]),
        verification=verification,
        provenance=Provenance(created_at=_T0 + timedelta(minutes=minute)),
    )


def _ids(pairs: list[tuple[Case, Case]]) -> list[tuple[str, str]]:
    return [(a.case_id, v.case_id) for a, v in pairs]


def test_a_confirmed_screen_counts_once_with_the_confirmations_verdict() -> None:
    screen = _case("s", "inconclusive")
    conf = _case("c", "improved", confirms="s", minute=1)
    other = _case("o", "no_effect", minute=2)
    assert _ids(final_verdicts([screen, conf, other])) == [("s", "c"), ("o", "o")]


def test_the_latest_of_two_confirmations_is_the_verdict_whatever_the_order_given() -> None:
    screen = _case("s", "inconclusive")
    early = _case("c2", "improved", confirms="s", minute=1)
    late = _case("c1", "no_effect", confirms="s", minute=5)
    for order in ([screen, early, late], [late, screen, early]):
        assert _ids(final_verdicts(order)) == [("s", "c1")]


def test_a_confirmation_without_its_screen_stands_alone() -> None:
    conf = _case("c", "improved", confirms="missing")
    assert _ids(final_verdicts([conf])) == [("c", "c")]


def test_unverified_cases_pass_through_as_their_own_verdict() -> None:
    bare = _case("b", "no_effect", verified=False)
    assert _ids(final_verdicts([bare])) == [("b", "b")]
