"""Hostile request bodies (issue 29): bounded fields, a body limit per route (413, declared or streamed),
and bodies that are not usable JSON answered 400 with one clear message, never a 500."""

from __future__ import annotations

import json

import pytest

from remedy.cases.io import case_to_json

from ..conftest import corpus_cases

DEEP = "[" * 100_000 + "]" * 100_000


def _signature(summary: str = "the lander hovers", **extra) -> dict:
    return {"features": {"return_iqm": 1.0}, "symptoms": ["hovering"], "summary": summary, **extra}


def test_a_huge_signature_summary_is_refused_before_the_index(served):
    """The 28 MB summary that made Lance allocate 32 GB: over the request limit, 413 (here 2 MB)."""
    r = served.client.post(
        "/v1/similar", json={"signature": _signature("x" * 2_000_000)}, headers=served.auth("reader")
    )
    assert r.status_code == 413 and r.json()["error"] == "PayloadTooLarge", r.text[:300]
    r = served.client.post("/v1/similar", json={"signature": _signature("x" * 5_000)}, headers=served.auth("reader"))
    assert r.status_code == 422 and "signature.summary" in r.json()["detail"], r.text[:300]
    assert len(r.content) < 2_000
    r = served.client.post("/v1/similar", json={"signature": _signature()}, headers=served.auth("reader"))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/similar", {"signature": _signature(symptoms=["x" * 500])}, "signature.symptoms"),
        ("/v1/similar", {"signature": _signature(features={"f" * 500: 1.0})}, "signature.features"),
        ("/v1/similar", {"signature": _signature(symptoms=["hovering"] * 100)}, "signature.symptoms"),
        ("/v1/query", {"text": "x" * 5_000}, "text"),
        ("/v1/query", {"text": "hovers", "env": "e" * 500}, "env"),
        ("/v1/diagnose", {"describe": "it hovers", "tags": ["t" * 500]}, "tags"),
        ("/v1/diagnose", {"describe": "it hovers", "tags": ["hovering"] * 100}, "tags"),
        ("/v1/diagnose", {"run_id": "r" * 500}, "run_id"),
    ],
)
def test_every_string_and_list_is_bounded(served, path, body, field):
    r = served.client.post(path, json=body, headers=served.auth("reader"))
    assert r.status_code == 422 and field in r.json()["detail"], r.text[:300]


def test_a_subject_is_bounded(served):
    case = corpus_cases()[0]
    subject = case.subject.model_dump(mode="json")
    body = {"subject": {**subject, "env_id": "E" * 500}, "signature": _signature()}
    r = served.client.post("/v1/diagnose", json=body, headers=served.auth("reader"))
    assert r.status_code == 422 and "subject.env_id" in r.json()["detail"], r.text[:300]
    body = {"subject": {**subject, "hyperparams": {"blob": "y" * 100_000}}, "signature": _signature()}
    r = served.client.post("/v1/diagnose", json=body, headers=served.auth("reader"))
    assert r.status_code == 422 and "hyperparams" in r.json()["detail"], r.text[:300]
    r = served.client.post(
        "/v1/diagnose", json={"subject": subject, "signature": _signature()}, headers=served.auth("reader")
    )
    assert r.status_code == 200, r.text[:300]


def test_a_verify_patch_is_bounded(served):
    body = {"run_id": "run-0123456789ab", "patch": {"kind": "reward_shaping", "code": "x" * 100_000}}
    r = served.client.post("/v1/jobs/verify", json=body, headers=served.auth("writer"))
    assert r.status_code == 422 and "patch" in r.json()["detail"], r.text[:300]


def test_path_ids_are_bounded(served):
    r = served.client.get("/v1/cases/" + "c" * 5_000, headers=served.auth("reader"))
    assert r.status_code == 422 and len(r.content) < 2_000
    r = served.client.get("/v1/cases/nope", headers=served.auth("reader"))
    assert r.status_code == 404


def test_a_streamed_body_over_the_limit_is_413(served):
    """No Content-Length (chunked): the limit is counted as the body arrives."""

    def chunks():
        yield b'{"text": "'
        for _ in range(40):
            yield b"x" * 65_536
        yield b'"}'

    r = served.client.post(
        "/v1/query", content=chunks(), headers={**served.auth("reader"), "content-type": "application/json"}
    )
    assert r.status_code == 413 and r.json()["error"] == "PayloadTooLarge", r.text[:300]


def test_deeply_nested_json_is_400_with_one_message(served):
    headers = {**served.auth("writer"), "content-type": "application/json"}
    r = served.client.post("/v1/query", content='{"text": ' + DEEP + "}", headers=headers)
    assert r.status_code == 400 and "nested too deeply" in r.json()["detail"], r.text[:300]
    r = served.client.post("/v1/cases/import", content=DEEP, headers=headers)
    assert r.status_code == 400 and "nested too deeply" in r.json()["detail"], r.text[:300]
    r = served.client.post("/v1/cases/import", content='{"a": ' + DEEP + "}\n", headers=headers)
    assert r.status_code == 422 and "1 invalid record" in r.json()["detail"], r.text[:300]  # JSONL: that record
    assert served.service.kb.stats().store.total == 0


def _record(summary: str) -> dict:
    rec = json.loads(case_to_json(corpus_cases()[0]))
    rec["signature"]["summary"] = summary
    return rec


def test_a_lone_surrogate_in_a_record_is_400_and_imports_nothing(served):
    headers = served.auth("writer")
    good = json.dumps(_record("the lander hovers \U0001f680"))  # a paired surrogate escape is fine
    bad = json.dumps({**_record("hovers \ud800 forever"), "case_id": "c-other"})
    r = served.client.post("/v1/cases/import", content=f"{good}\n{bad}\n", headers=headers)
    assert r.status_code == 400 and r.json()["error"] == "RequestBodyError", r.text[:300]
    assert "record 2" in r.json()["detail"] and "surrogate" in r.json()["detail"]
    r = served.client.post("/v1/cases/import", content=f"[{bad}]", headers=headers)
    assert r.status_code == 400 and "record 1" in r.json()["detail"], r.text[:300]
    r = served.client.post("/v1/cases/import", content=b'{"case_id": "\xed\xa0\x80"}\n', headers=headers)
    assert r.status_code == 400 and "not valid UTF-8" in r.json()["detail"], r.text[:300]
    assert served.service.kb.stats().store.total == 0
    r = served.client.post("/v1/cases/import", content=good + "\n", headers=headers)
    assert r.status_code == 200 and r.json()["added"] == 1, r.text[:300]


def test_an_oversized_import_is_413_and_the_import_limit_stays_separate(kb_path, embedder):
    from .conftest import serve

    line = case_to_json(corpus_cases()[0]) + "\n"
    for s in serve(kb_path, embedder, run_jobs=False, max_request_bytes=1_000, max_body_bytes=len(line) * 2):
        r = s.client.post("/v1/cases/import", content=line, headers=s.auth("writer"))
        assert r.status_code == 200, r.text[:300]  # an import has its own, larger limit
        r = s.client.post("/v1/cases/import", content=line * 3, headers=s.auth("writer"))
        assert r.status_code == 413
        r = s.client.post("/v1/query", json={"text": "hovers " * 200}, headers=s.auth("reader"))
        assert r.status_code == 413
