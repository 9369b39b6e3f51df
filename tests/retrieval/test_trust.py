"""Trust weights in the offline vote: provenance and corroboration, values computed by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from remedy.cases.model import Cause, Diagnosis, Provenance, RootCause
from remedy.retrieval.diagnosis import DiagnosisContext, RetrievedCase
from remedy.retrieval.offline import OfflineDiagnoser
from remedy.retrieval.trust import outcome_sign, similar_signatures, trust_weights

from .conftest import build_case

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _at(case, days: float, **update):
    return case.model_copy(update={"provenance": Provenance(created_at=T0 + timedelta(days=days)), **update})


def _c(cid, status="improved", source="verified", days=0.0, symptoms=("hovering", "timeouts"), effect=1.0):
    return _at(
        build_case(cid, "lander hovers", symptoms=list(symptoms), status=status, effect=effect, source=source), days
    )


def test_provenance_alone():
    local, imported = _c("a"), _c("b", source="imported")
    assert trust_weights([local, imported]) == [1.0, 0.5]
    assert trust_weights([local, imported], imported_weight=1.0, contradiction_weight=0.0) == [1.0, 1.0]


def test_a_case_contradicted_by_later_local_verifications_loses_weight():
    claim = _c("claim", source="imported", days=0)
    later_no = [_c(f"n{i}", status="no_effect", effect=0.0, days=1 + i) for i in range(2)]
    later_yes = _c("y", days=5)
    w = trust_weights([claim, *later_no, later_yes])
    # provenance 0.5 x (1 + 1 agree) / (1 + 1 + 2 disagree) = 0.5 x 0.5
    assert w[0] == 0.25
    # n0: n1 later agrees, y later disagrees: 2 / 3; n1: only y, disagreeing: 1 / 2
    assert w[1] == 2 / 3 and w[2] == 0.5 and w[3] == 1.0


def test_earlier_imported_or_dissimilar_cases_do_not_count():
    claim = _c("claim", days=10)
    earlier = _c("old", status="worse", effect=-1.0, days=1)
    imported_later = _c("imp", status="worse", effect=-1.0, source="imported", days=20)
    other_symptoms = _c("other", status="worse", effect=-1.0, days=20, symptoms=("jerky_actions",))
    assert trust_weights([claim, earlier, imported_later, other_symptoms])[0] == 1.0
    assert not similar_signatures(claim, other_symptoms)


def test_failed_and_unverified_carry_no_outcome():
    assert outcome_sign(_c("f", status="failed", effect=None)) == 0
    assert outcome_sign(_c("u", status=None)) == 0
    assert outcome_sign(_c("w", status="worse", effect=-1.0)) == -1


def test_weighting_changes_the_offline_vote():
    wrong = _c("wrong", source="imported").model_copy(
        update={"diagnosis": Diagnosis(causes=[Cause(cause=RootCause.observation_scaling, confidence=0.9)])}
    )
    right = _c("right", days=1).model_copy(
        update={"diagnosis": Diagnosis(causes=[Cause(cause=RootCause.reward_misspecification, confidence=0.9)])}
    )
    ctx = DiagnosisContext(
        subject=right.subject, signature=right.signature, cases=(RetrievedCase(wrong, 0.95), RetrievedCase(right, 0.9))
    )
    # kernel ((s - 0.6) / 0.4)^2: wrong 0.766 vs right 0.5625 unweighted; wrong 0.383 once halved
    plain = OfflineDiagnoser(imported_weight=1.0, contradiction_weight=0.0, w_prior=0.0).diagnose(ctx)
    weighted = OfflineDiagnoser(w_prior=0.0).diagnose(ctx)
    assert plain.diagnosis.causes[0].cause == RootCause.observation_scaling
    assert weighted.diagnosis.causes[0].cause == RootCause.reward_misspecification
