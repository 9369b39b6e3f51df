"""The remedy ranker's read side: features, the stored form (validated, never unpickled) and reordering a diagnosis."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from remedy.cases.model import (
    ActionSpaceType,
    Cause,
    Diagnosis,
    EnvTraits,
    RemedyFamily,
    RootCause,
    Signature,
    Subject,
)
from remedy.cases.patches.spec import Hyperparameters, Patch, TimeLimit
from remedy.retrieval.diagnosis import CandidatePatch, DiagnosisContext, DiagnosisReport
from remedy.retrieval.offline import OfflineDiagnoser
from remedy.retrieval.remedy_ranker import RemedyRanker, attempt_features, cause_for, rerank

SUBJECT = Subject(
    env_id="CartPole-v1", algo="PPO", traits=EnvTraits(action_space=ActionSpaceType.discrete, obs_dim=4, action_dim=2)
)
SIGNATURE = Signature(
    summary="episodes hit the time limit", symptoms=["timeouts"], features={"truncation_rate": 1.0, "return_iqm": -200}
)
LR = Patch(parts=[Hyperparameters(changes={"learning_rate": 1e-4})])
TL = Patch(parts=[TimeLimit(max_episode_steps=500)])


def _ranker(weights: dict[str, float], intercept: float = -2.0) -> RemedyRanker:
    names = sorted(weights)
    return RemedyRanker(
        names=names, center=[0.0] * len(names), scale=[1.0] * len(names), coef=[weights[n] for n in names],
        intercept=intercept,
    )  # fmt: skip


def test_features_describe_failure_remedy_and_their_interactions() -> None:
    x = attempt_features(SUBJECT, SIGNATURE, LR, RemedyFamily.hyperparameters, RootCause.unstable_optimization, 0.4, 2)
    assert x["family=hyperparameters"] == x["tag=timeouts"] == x["family=hyperparameters&tag=timeouts"] == 1.0
    assert x["cause=unstable_optimization&tag=timeouts"] == x["algo=PPO"] == x["space=discrete"] == 1.0
    assert x["cause_confidence"] == 0.4 and x["cause_reciprocal_rank"] == 0.5
    assert x["param:hyperparameters.changes.learning_rate"] == pytest.approx(math.log1p(1e-4))
    assert x["f:return_iqm"] == pytest.approx(-math.log1p(200))  # signed log keeps the order


def test_cause_for_picks_the_best_ranked_cause_the_family_addresses() -> None:
    ranked = [RootCause.unstable_optimization, RootCause.time_limit_misconfiguration]
    assert cause_for(RemedyFamily.time_limit, ranked) == RootCause.time_limit_misconfiguration
    assert cause_for(RemedyFamily.safety_constraint, ranked) == RootCause.unstable_optimization  # none addressed
    assert cause_for(RemedyFamily.time_limit, []) is None


def test_a_stored_ranker_round_trips_and_a_malformed_one_is_refused() -> None:
    ranker = _ranker({"family=time_limit": 1.5, "tag=timeouts": 0.5})
    x = attempt_features(SUBJECT, SIGNATURE, TL, RemedyFamily.time_limit, None)
    back = RemedyRanker.model_validate_json(ranker.model_dump_json())
    assert back == ranker and back.probability(x) == ranker.probability(x)
    assert ranker.probability(x) == pytest.approx(1 / (1 + math.exp(-(1.5 + 0.5 - 2.0))))
    good = ranker.model_dump()
    for bad in ({"coef": [1.0]}, {"scale": [0.0, 1.0]}, {"coef": [float("nan"), 1.0]}, {"pickle": "x"}):
        with pytest.raises(ValidationError):
            RemedyRanker.model_validate({**good, **bad})


def _report() -> DiagnosisReport:
    causes = [
        Cause(cause=RootCause.unstable_optimization, confidence=0.5, rationale="vote"),
        Cause(cause=RootCause.time_limit_misconfiguration, confidence=0.3, rationale="vote"),
    ]
    return DiagnosisReport(
        signature=SIGNATURE,
        diagnosis=Diagnosis(causes=causes, backend="offline", program_version="offline-1:x"),
        candidates=[
            CandidatePatch(patch=LR, family=RemedyFamily.hyperparameters, score=2.0),
            CandidatePatch(patch=TL, family=RemedyFamily.time_limit, score=1.0),
        ],
    )


def test_rerank_orders_candidates_by_probability_and_causes_by_their_best_candidate() -> None:
    ranked = rerank(_report(), _ranker({"family=time_limit": 2.0}), SUBJECT)
    assert [c.family for c in ranked.candidates] == [RemedyFamily.time_limit, RemedyFamily.hyperparameters]
    assert ranked.diagnosis.root_causes[0] == RootCause.time_limit_misconfiguration
    assert (
        ranked.candidates[0].score > ranked.candidates[1].score and "vote score 1.000" in ranked.candidates[0].rationale
    )
    assert ranked.diagnosis.program_version == "offline-1:x+ranker:unsaved"
    # the blend weighs the vote's confidence; "ranker" orders causes by the best candidate alone
    weak = _ranker({"family=time_limit": 0.3})
    assert rerank(_report(), weak, SUBJECT).diagnosis.root_causes[0] == RootCause.unstable_optimization
    assert (
        rerank(_report(), weak, SUBJECT, causes="ranker").diagnosis.root_causes[0]
        == RootCause.time_limit_misconfiguration
    )
    flat = rerank(_report(), _ranker({}), SUBJECT)  # a base-rate ranker: every remedy alike, the vote's order stands
    assert [c.family for c in flat.candidates] == [RemedyFamily.hyperparameters, RemedyFamily.time_limit]
    assert flat.diagnosis.root_causes == _report().diagnosis.root_causes


def test_the_offline_diagnoser_uses_a_ranker_only_when_given_one() -> None:
    traits = EnvTraits(action_space=ActionSpaceType.discrete, obs_dim=2, action_dim=3, reward_density="sparse")
    subject = Subject(env_id="MountainCar-v0", algo="PPO", train_steps=40_000, traits=traits)
    signature = Signature(
        summary="never reaches the flag",
        symptoms=["timeouts", "never_succeeds", "sparse_signal"],
        features={"truncation_rate": 1.0, "success_rate": 0.0, "return_iqm": -200.0, "reward_informative_frac": 0.0},
    )
    ctx = DiagnosisContext(subject=subject, signature=signature)  # priors alone offer a few families
    vote = OfflineDiagnoser().diagnose(ctx)
    assert len(vote.candidates) >= 2
    last = vote.candidates[-1].family
    ranked = OfflineDiagnoser(ranker=_ranker({f"family={last.value}": 5.0})).diagnose(ctx)
    assert ranked.candidates[0].family == last != vote.candidates[0].family
    assert "+ranker:" in ranked.diagnosis.program_version and "+ranker" not in vote.diagnosis.program_version
    assert sorted(c.family for c in ranked.candidates) == sorted(c.family for c in vote.candidates)
