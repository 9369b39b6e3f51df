"""The HTTP routes in process (FastAPI's TestClient): reads, imports, exports, errors, token roles."""

from __future__ import annotations

import json

import pytest

from remedy.cases.io import case_to_json, read_cases

from ..conftest import corpus_cases
from .conftest import serve


def _jsonl(cases) -> bytes:
    return "".join(case_to_json(c) + "\n" for c in cases).encode()


@pytest.fixture
def filled(served):
    """The service holding the five corpus cases."""
    r = served.client.post("/v1/cases/import", content=_jsonl(corpus_cases()), headers=served.auth("writer"))
    assert r.status_code == 200, r.text
    assert r.json()["added"] == 5
    return served


def test_health_needs_no_token_and_names_the_version(served):
    r = served.client.get("/health")
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["version"]


def test_query_ranks_the_matching_case_first_with_the_cli_json_shape(filled):
    r = filled.client.post(
        "/v1/query", json={"text": "the lander hovers and never lands", "k": 3}, headers=filled.auth("reader")
    )
    assert r.status_code == 200, r.text
    hits = r.json()
    assert hits[0]["case_id"] == "c-lander-hover" and hits[0]["rank"] == 1
    local = filled.service.kb.similar("the lander hovers and never lands", k=3)
    assert [{k: v for k, v in h.items() if k != "case"} for h in hits] == [
        json.loads(json.dumps(h.as_dict())) for h in local
    ]


def test_query_filters_and_full_cases(filled):
    r = filled.client.post(
        "/v1/query",
        json={"text": "falls over", "action_space": "continuous", "full": True},
        headers=filled.auth("reader"),
    )
    hits = r.json()
    assert hits and all(h["action_space"] == "continuous" for h in hits)
    assert all(h["case"]["case_id"] == h["case_id"] for h in hits)


def test_similar_by_signature(filled):
    sig = filled.service.kb.get("c-pendulum-jitter").signature.model_dump(mode="json")
    r = filled.client.post("/v1/similar", json={"signature": sig, "k": 2}, headers=filled.auth("reader"))
    assert r.status_code == 200, r.text
    assert r.json()[0]["case_id"] == "c-pendulum-jitter"


def test_case_get_and_unknown_id_suggests_close_ones(filled):
    r = filled.client.get("/v1/cases/c-walker-scale", headers=filled.auth("reader"))
    assert r.status_code == 200 and r.json()["subject"]["env_id"] == "BipedalWalker-v3"
    r = filled.client.get("/v1/cases/c-walker-scal", headers=filled.auth("reader"))
    assert r.status_code == 404 and "c-walker-scale" in r.json()["detail"]


def test_stats(filled):
    r = filled.client.get("/v1/stats", headers=filled.auth("reader"))
    body = r.json()
    assert body["store"]["total"] == 5 and body["index_rows"] == 5 and body["store"]["by_env"]["Pendulum-v1"] == 1


def test_import_export_round_trip_and_json_array(served, tmp_path):
    cases = corpus_cases()
    body = json.dumps([json.loads(case_to_json(c)) for c in cases]).encode()
    r = served.client.post("/v1/cases/import", content=body, headers=served.auth("writer"))
    assert r.json() == {"read": 5, "added": 5, "unchanged": 0, "skipped": 0, "problems": []}
    again = served.client.post("/v1/cases/import", content=_jsonl(cases), headers=served.auth("writer"))
    assert again.json()["unchanged"] == 5 and again.json()["added"] == 0
    out = tmp_path / "export.jsonl"
    out.write_bytes(served.client.get("/v1/cases", headers=served.auth("reader")).content)
    back, problems = read_cases(out)
    assert not problems
    assert sorted(case_to_json(c) for c in back) == sorted(case_to_json(c) for c in cases)


def test_invalid_case_imports_nothing_and_names_the_field(served):
    good, bad = (case_to_json(c) for c in corpus_cases()[:2])
    broken = json.loads(bad)
    broken["subject"]["env_id"] = 12
    body = f"{good}\n{json.dumps(broken)}\nnot json\n".encode()
    r = served.client.post("/v1/cases/import", content=body, headers=served.auth("writer"))
    assert r.status_code == 422
    problems = {p["line"]: p["message"] for p in r.json()["problems"]}
    assert "subject.env_id" in problems[2] and "not valid JSON" in problems[3]
    assert served.service.kb.count() == 0
    skipped = served.client.post("/v1/cases/import?skip_invalid=true", content=body, headers=served.auth("writer"))
    assert skipped.status_code == 200 and skipped.json()["added"] == 1 and skipped.json()["skipped"] == 2


@pytest.mark.parametrize("body", [b"{not json", b"[]", b"", b"   "])
def test_malformed_bodies_are_422(served, body):
    r = served.client.post(
        "/v1/query", content=body, headers={**served.auth("reader"), "Content-Type": "application/json"}
    )
    assert r.status_code == 422, r.text
    r = served.client.post("/v1/cases/import", content=body, headers=served.auth("writer"))
    assert r.status_code in (200, 422) and r.status_code != 500
    assert served.service.kb.count() == 0


def test_bad_query_fields_are_named(served):
    r = served.client.post(
        "/v1/query", json={"text": "x", "k": 0, "mode": "fuzzy", "envv": "a"}, headers=served.auth("reader")
    )
    detail = r.json()["detail"]
    assert r.status_code == 422 and "k:" in detail and "mode:" in detail and "envv:" in detail


def test_oversized_body_is_413_and_writes_nothing(kb_path, embedder):
    for s in serve(kb_path, embedder, run_jobs=False, max_body_bytes=2_000):
        r = s.client.post("/v1/cases/import", content=_jsonl(corpus_cases()), headers=s.auth("writer"))
        assert r.status_code == 413 and "limit" in r.json()["detail"]
        assert s.service.kb.count() == 0


# -- tokens and roles -------------------------------------------------------------------------


READS = [
    ("post", "/v1/query", {"json": {"text": "hovering"}}),
    ("get", "/v1/stats", {}),
    ("get", "/v1/cases/c-lander-hover", {}),
    ("get", "/v1/cases", {}),
    ("get", "/v1/jobs", {}),
]


@pytest.mark.parametrize("method,path,kw", READS)
def test_reads_need_a_token(filled, method, path, kw):
    call = getattr(filled.client, method)
    assert call(path, **kw).status_code == 401
    assert call(path, headers={"Authorization": "Bearer rmd_wrong"}, **kw).status_code == 401
    for role in ("reader", "writer", "reviewer"):
        assert call(path, headers=filled.auth(role), **kw).status_code == 200


def test_writes_need_a_writer_and_a_refusal_writes_nothing(served):
    body = _jsonl(corpus_cases())
    assert served.client.post("/v1/cases/import", content=body).status_code == 401
    r = served.client.post("/v1/cases/import", content=body, headers=served.auth("reader"))
    assert r.status_code == 403 and "reader" in r.json()["detail"]
    r = served.client.post("/v1/runs", content=b"x", headers=served.auth("reader"))
    assert r.status_code == 403
    assert served.service.kb.count() == 0 and not (served.service.runs_dir).exists()
    assert served.client.post("/v1/cases/import", content=body, headers=served.auth("reviewer")).status_code == 200


def test_revoked_token_is_refused(served):
    service = served.service
    assert served.client.get("/v1/stats", headers=served.auth("reader")).status_code == 200
    service.tokens.revoke("reader")
    assert served.client.get("/v1/stats", headers=served.auth("reader")).status_code == 401


def test_only_hashes_are_stored(served):
    with served.service.kb.store.connection() as con:
        stored = " ".join(str(v) for row in con.execute("SELECT * FROM api_tokens").fetchall() for v in row)
    assert all(secret not in stored for secret in served.tokens.values())


def test_public_read_opens_reads_not_writes(kb_path, embedder):
    for s in serve(kb_path, embedder, run_jobs=False, public_read=True):
        assert s.client.get("/v1/stats").status_code == 200
        assert s.client.post("/v1/query", json={"text": "hovering"}).status_code == 200
        assert s.client.post("/v1/cases/import", content=_jsonl(corpus_cases())).status_code == 401
        assert s.service.kb.count() == 0


def test_openapi_docs_are_served(served):
    assert served.client.get("/docs").status_code == 200
    paths = served.client.get("/openapi.json").json()["paths"]
    assert {"/v1/query", "/v1/cases/import", "/v1/runs", "/v1/jobs/verify"} <= set(paths)
