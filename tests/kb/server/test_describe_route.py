"""`POST /v1/diagnose` with ``describe``: the same report as the in-process facade, and exactly one source."""

from __future__ import annotations

import json

import pytest

from remedy.kb.diagnose import diagnose_description
from remedy.kb.server.handlers import to_json_bytes
from remedy.retrieval.describe import SymptomReader

from ..conftest import corpus_cases

HOVER = "The lander hovers above the pad until the time limit and never lands."


@pytest.fixture
def filled(served):
    """The service holding the five corpus cases."""
    served.service.kb.add_many(corpus_cases())
    return served


def _local(served, text: str, **kw) -> dict:
    report = diagnose_description(served.service.kb, text, reader=SymptomReader(served.service.kb.embedder), **kw)
    return json.loads(to_json_bytes(report.model_dump(mode="python")))


@pytest.mark.parametrize(
    "body,kw",
    [
        ({"describe": HOVER}, {}),
        (
            {"describe": "torque chatters", "env": "Pendulum-v1", "algo": "SAC", "k": 3, "tags": ["jerky_actions"]},
            {"env_id": "Pendulum-v1", "algo": "SAC", "k": 3, "tags": ["jerky_actions"]},
        ),
        ({"describe": "the agent never reaches the flag", "action_space": "discrete"}, {"action_space": "discrete"}),
    ],
)
def test_a_description_gets_the_facade_report(filled, body, kw):
    r = filled.client.post("/v1/diagnose", json=body, headers=filled.auth("reader"))
    assert r.status_code == 200, r.text
    assert r.json() == _local(filled, body["describe"], **kw)


def test_the_report_reads_the_text_and_cites_the_matching_case(filled):
    report = filled.client.post("/v1/diagnose", json={"describe": HOVER}, headers=filled.auth("reader")).json()
    assert "hovering" in [r["tag"] for r in report["reading"]]
    assert "c-lander-hover" in report["diagnosis"]["cited_cases"]
    assert report["candidates"] and report["families"]


@pytest.mark.parametrize(
    "body,words",
    [
        ({"describe": HOVER, "run_id": "abc"}, ["exactly one", "run_id and describe"]),
        ({"describe": HOVER, "signature": {"summary": "x"}}, ["exactly one", "subject/signature and describe"]),
        ({"k": 3}, ["exactly one", "describe"]),
        ({"run_id": "abc", "env": "Pendulum-v1", "tags": ["hovering"]}, ["env, tags only apply with describe"]),
        ({"describe": HOVER, "tags": ["hoverin"]}, ["did you mean 'hovering'"]),
        ({"describe": HOVER, "action_space": "both"}, ["action_space"]),
        ({"describe": ""}, ["describe"]),
    ],
)
def test_bad_description_requests_are_422_and_say_why(filled, body, words):
    r = filled.client.post("/v1/diagnose", json=body, headers=filled.auth("reader"))
    assert r.status_code == 422, r.text
    assert all(w in r.json()["detail"] for w in words), r.json()["detail"]


def test_describing_needs_a_token(filled):
    assert filled.client.post("/v1/diagnose", json={"describe": HOVER}).status_code == 401
