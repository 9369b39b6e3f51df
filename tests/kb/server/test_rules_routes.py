"""Rules over HTTP: mining, listing, review with the reviewer token's name, and what an accepted rule changes.

The KB holds hand-built measured cases with one planted rule (continuous ∧ jerky_actions →
action smoothness, 5 of 6 improved) among noise; the real miner runs on them through the route.
"""

from __future__ import annotations

import pytest

from remedy.miners import mine

from ...miners.conftest import planted_cases
from .conftest import serve

#: a description the offline diagnoser reads with the planted rule's conditions (tags set, so no reading step decides)
JITTER = {
    "describe": "the torque chatters between its bounds every step",
    "env": "Pendulum-v1",
    "algo": "PPO",
    "action_space": "continuous",
    "tags": ["jerky_actions", "low_success"],
}


@pytest.fixture
def ruled(kb_path, embedder):
    """The service on a KB holding the planted cases (no rules mined yet)."""
    for s in serve(kb_path, embedder, run_jobs=False):
        s.service.kb.add_many(planted_cases())
        yield s


@pytest.fixture
def mined(ruled):
    """The same, after `POST /v1/mine`; returns (service, its answer)."""
    r = ruled.client.post("/v1/mine", headers=ruled.auth("writer"))
    assert r.status_code == 200, r.text
    return ruled, r.json()


def _planted_id(answer: dict) -> str:
    return next(r["id"] for r in answer["rules"] if r["family"] == "action_smoothness")


def test_mine_stores_what_the_miner_finds_and_re_mining_updates(mined):
    served, answer = mined
    local = mine(planted_cases())
    assert [r["id"] for r in answer["rules"]] == [r.id for r in local.rules]
    assert answer["attempts"] == local.n_attempts and answer["tested"] == local.n_tested
    assert answer["new"] == [r.id for r in local.rules] and not answer["updated"] and not answer["flagged"]
    planted = next(r for r in answer["rules"] if r["id"] == _planted_id(answer))
    assert planted["evidence"]["wins"] == 5 and planted["evidence"]["support"] == 6
    again = served.client.post("/v1/mine", json={"seed": 0}, headers=served.auth("writer")).json()
    assert again["new"] == [] and sorted(again["updated"]) == sorted(answer["new"])


def test_list_filters_by_status_and_show_gives_the_stored_rule(mined):
    served, answer = mined
    ids = [r["id"] for r in answer["rules"]]
    listed = served.client.get("/v1/rules", headers=served.auth("reader")).json()
    assert sorted(r["id"] for r in listed) == sorted(ids) and all(r["status"] == "proposed" for r in listed)
    assert served.client.get("/v1/rules?status=accepted", headers=served.auth("reader")).json() == []
    r = served.client.get(f"/v1/rules/{ids[0]}", headers=served.auth("reader"))
    assert r.status_code == 200 and r.json()["id"] == ids[0]
    stored = {x["id"]: x for x in listed}[ids[0]]
    assert r.json() == stored
    assert served.client.get("/v1/rules?status=maybe", headers=served.auth("reader")).status_code == 422


def test_unknown_rule_is_404_with_close_ids(mined):
    served, answer = mined
    rid = _planted_id(answer)
    for call in (
        lambda bad: served.client.get(f"/v1/rules/{bad}", headers=served.auth("reader")),
        lambda bad: served.client.post(f"/v1/rules/{bad}/accept", json={}, headers=served.auth("reviewer")),
        lambda bad: served.client.post(f"/v1/rules/{bad}/reject", json={"note": "no"}, headers=served.auth("reviewer")),
    ):
        r = call(rid[:-1] + "x")
        assert r.status_code == 404 and r.json()["error"] == "RuleNotFoundError"
        assert f"did you mean '{rid}'" in r.json()["detail"]


def test_only_a_reviewer_reviews_and_the_review_is_under_the_token_name(mined):
    served, answer = mined
    rid = _planted_id(answer)
    assert served.client.post(f"/v1/rules/{rid}/accept", json={}).status_code == 401
    for role in ("reader", "writer"):
        r = served.client.post(f"/v1/rules/{rid}/accept", json={"note": "x"}, headers=served.auth(role))
        assert r.status_code == 403 and "reviewer" in r.json()["detail"]
    # a client cannot name the reviewer: the body has no such field
    r = served.client.post(
        f"/v1/rules/{rid}/accept", json={"note": "x", "reviewer": "mallory"}, headers=served.auth("reviewer")
    )
    assert r.status_code == 422 and "reviewer" in r.json()["detail"]
    assert served.client.get(f"/v1/rules/{rid}", headers=served.auth("reader")).json()["reviews"] == []

    r = served.client.post(f"/v1/rules/{rid}/accept", json={"note": "seen it"}, headers=served.auth("reviewer"))
    assert r.status_code == 200, r.text
    (review,) = r.json()["reviews"]
    assert review["reviewer"] == "reviewer" and review["decision"] == "accepted" and review["note"] == "seen it"
    stored = served.client.get("/v1/rules?status=accepted", headers=served.auth("reader")).json()
    assert [x["id"] for x in stored] == [rid] and stored[0]["reviews"][0]["reviewer"] == "reviewer"


def test_reviewer_is_the_name_of_whichever_token_calls(mined):
    served, answer = mined
    rid = _planted_id(answer)
    _, secret = served.service.tokens.create("reviewer", "ada")
    r = served.client.post(f"/v1/rules/{rid}/accept", headers={"Authorization": f"Bearer {secret}"})
    assert r.status_code == 200 and r.json()["reviews"][-1]["reviewer"] == "ada"


def test_reject_needs_a_note_and_keeps_the_rule(mined):
    served, answer = mined
    rid = _planted_id(answer)
    for body, says in (({}, "note: Field required"), ({"note": "   "}, "note: say why the rule is rejected")):
        r = served.client.post(f"/v1/rules/{rid}/reject", json=body, headers=served.auth("reviewer"))
        assert r.status_code == 422 and r.json()["detail"].startswith(says), r.json()
    assert served.client.get(f"/v1/rules/{rid}", headers=served.auth("reader")).json()["status"] == "proposed"
    r = served.client.post(f"/v1/rules/{rid}/reject", json={"note": "pendulum only"}, headers=served.auth("reviewer"))
    assert r.status_code == 200 and r.json()["status"] == "rejected"
    assert r.json()["reviews"][-1] == {**r.json()["reviews"][-1], "reviewer": "reviewer", "note": "pendulum only"}


def test_accepting_over_http_changes_the_diagnosis_and_rejecting_undoes_it(mined):
    served, answer = mined
    rid = _planted_id(answer)

    def diagnose() -> dict:
        r = served.client.post("/v1/diagnose", json=JITTER, headers=served.auth("reader"))
        assert r.status_code == 200, r.text
        return r.json()

    before = diagnose()
    assert rid not in before["diagnosis"]["cited_rules"]  # proposed rules do not vote
    served.client.post(f"/v1/rules/{rid}/accept", headers=served.auth("reviewer"))
    assert rid in diagnose()["diagnosis"]["cited_rules"]
    served.client.post(f"/v1/rules/{rid}/reject", json={"note": "no"}, headers=served.auth("reviewer"))
    after = diagnose()
    assert after["diagnosis"] == before["diagnosis"] and after["candidates"] == before["candidates"]


def test_mining_needs_a_writer_and_a_refusal_stores_nothing(ruled):
    r = ruled.client.post("/v1/mine", headers=ruled.auth("reader"))
    assert r.status_code == 403 and "writer" in r.json()["detail"]
    assert ruled.client.get("/v1/rules", headers=ruled.auth("reader")).json() == []
    assert ruled.client.post("/v1/mine", headers=ruled.auth("reviewer")).status_code == 200


@pytest.mark.parametrize(
    "body,field", [({"fdr": 0}, "fdr"), ({"max_conditions": 4}, "max_conditions"), ({"min_suport": 3}, "min_suport")]
)
def test_bad_mining_parameters_are_422_and_named(ruled, body, field):
    r = ruled.client.post("/v1/mine", json=body, headers=ruled.auth("writer"))
    assert r.status_code == 422 and field in r.json()["detail"]


def test_too_few_cases_to_mine_is_409_saying_how_many(served):
    served.service.kb.add_many(planted_cases()[:4])
    r = served.client.post("/v1/mine", headers=served.auth("writer"))
    assert r.status_code == 409 and r.json()["error"] == "TooFewCasesError"
    assert "need at least 10" in r.json()["detail"] and "has 4" in r.json()["detail"]
    assert served.client.get("/v1/rules", headers=served.auth("reader")).json() == []


def test_rule_routes_are_documented_with_their_models(served):
    spec = served.client.get("/openapi.json").json()
    paths = spec["paths"]
    assert {"/v1/rules", "/v1/rules/{rule_id}", "/v1/rules/{rule_id}/accept", "/v1/rules/{rule_id}/reject"} <= set(
        paths
    )
    ok = paths["/v1/rules/{rule_id}/accept"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/Rule"}
    assert paths["/v1/mine"]["post"]["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/MineOut"
    }
    report = paths["/v1/diagnose"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert report == {"$ref": "#/components/schemas/DiagnosisReport"}
    assert "describe" in spec["components"]["schemas"]["DiagnoseIn"]["properties"]
