"""The cause ranker for descriptions: its features, fitting, reordering a report, and the describe path."""

from __future__ import annotations

import math

import numpy as np
import pytest

from remedy.kb.diagnose import diagnose_description
from remedy.retrieval.cause_ranker import (
    CAUSES,
    FEATURES,
    CauseRanker,
    Evidence,
    cause_features,
    fit_ranker,
    log_frequencies,
    rerank_report,
)
from remedy.retrieval.describe import SymptomReader


def _evidence(vote: dict[str, float], stated: str | None = None) -> Evidence:
    return Evidence(
        tags=["unstable_learning"],
        stated=[(stated, 0.8)] if stated else [],
        cause_scores=vote,
        family_scores={"hyperparameters": 2.0, "reward_shaping": 1.0},
        text_similarity={c: (0.5 if c == "undertraining" else 0.2) for c in CAUSES},
    )


def test_features_are_the_documented_values():
    ev = _evidence({"unstable_optimization": 0.4, "reward_hacking": 0.2}, stated="undertraining")
    freq = {c: -2.0 for c in CAUSES}
    second = cause_features(ev, "reward_hacking", freq)
    assert dict(zip(FEATURES, second)) == pytest.approx(
        {
            "vote_confidence": 0.2,
            "vote_share_of_top": 0.5,
            "vote_reciprocal_rank": 0.5,
            "stated": 0.0,
            "family_support": 0.5,  # reward_shaping (1.0) of the top family's 2.0
            "text_similarity": 0.2 - (0.5 + 11 * 0.2) / 12,
            "log_frequency": -2.0,
        }
    )
    absent = dict(zip(FEATURES, cause_features(ev, "undertraining", freq)))
    assert absent["vote_confidence"] == 0 and absent["vote_reciprocal_rank"] == 0
    assert absent["stated"] == pytest.approx(0.8)
    assert absent["text_similarity"] > 0  # closer to the text than the causes' mean


def test_log_frequencies_are_smoothed_over_every_cause():
    freq = log_frequencies([["undertraining"], ["undertraining", "sparse_reward"]])
    total = 3 + len(CAUSES)
    assert freq["undertraining"] == pytest.approx(math.log(3 / total))
    assert freq["safety_violation"] == pytest.approx(math.log(1 / total))


def test_a_fitted_ranker_learns_that_the_stated_cause_is_right():
    """In every training report the thread settled on the stated cause, which the vote ranked second."""
    causes = ["undertraining", "sparse_reward", "observation_scaling", "reward_hacking"]
    evidence, labels = [], []
    for i in range(24):
        right = causes[i % len(causes)]
        wrong = causes[(i + 1) % len(causes)]
        evidence.append(_evidence({wrong: 0.5, right: 0.3}, stated=right))
        labels.append([right])
    ranker = fit_ranker(evidence, labels)
    new = _evidence({"reward_hacking": 0.5, "undertraining": 0.3}, stated="undertraining")
    assert new.vote_ranking()[0] == "reward_hacking"
    assert ranker.rank(new)[0] == "undertraining"
    assert ranker.coef[FEATURES.index("stated")] > 0
    assert sorted(ranker.rank(new)) == sorted(CAUSES)  # every cause is ranked once


def test_a_ranker_needs_one_coefficient_per_feature():
    with pytest.raises(ValueError, match="coefficients"):
        CauseRanker([1.0, 2.0], 0.0, {})


def _stated_ranker() -> CauseRanker:
    """A hand-set ranker that follows a stated cause first, then the vote."""
    coef = np.zeros(len(FEATURES))
    coef[FEATURES.index("stated")] = 10.0
    coef[FEATURES.index("vote_confidence")] = 1.0
    return CauseRanker(coef, -3.0, log_frequencies([]))


def test_rerank_report_reorders_causes_and_keeps_the_vote_rationale(reader):
    report = diagnose_description(None, "The training is unstable and the return oscillates.", reader=reader)
    vote = [c.cause.value for c in report.diagnosis.causes]
    unnamed = next(c for c in CAUSES if c not in vote)
    ev = Evidence(
        tags=[r.tag for r in report.reading],
        stated=[(unnamed, 0.9)],
        cause_scores={c.cause.value: c.confidence for c in report.diagnosis.causes},
    )
    ranked = rerank_report(report, _stated_ranker(), ev)
    causes = ranked.diagnosis.causes
    assert causes[0].cause.value == unnamed
    assert "description model" in causes[0].rationale  # the vote never named it
    kept = next(c for c in causes if c.cause.value == vote[0])
    assert kept.rationale == report.diagnosis.causes[0].rationale
    assert all(0 < c.confidence < 1 for c in causes)
    assert [c.confidence for c in causes] == sorted((c.confidence for c in causes), reverse=True)


@pytest.fixture(scope="module")
def reader(embedder) -> SymptomReader:
    return SymptomReader(embedder)


def test_diagnose_description_keeps_the_vote_unless_given_a_ranker(reader):
    text = "The learning rate is far too high and the return oscillates."
    plain = diagnose_description(None, text, reader=reader)
    assert plain.stated and plain.stated[0].cause.value == "unstable_optimization"
    coef = np.zeros(len(FEATURES))
    coef[FEATURES.index("vote_reciprocal_rank")] = -5.0  # a ranker that inverts the vote
    ranked = diagnose_description(None, text, reader=reader, ranker=CauseRanker(coef, 0.0, log_frequencies([])))
    assert plain.diagnosis.causes[0].cause.value == "unstable_optimization"
    assert ranked.diagnosis.causes[0].cause.value not in {c.cause.value for c in plain.diagnosis.causes}
