"""Verify and fix as jobs: a real tiny verify on the shipped quick checkpoint, cancellation, restart safety."""

from __future__ import annotations

import time
from importlib import resources
from pathlib import Path

import pytest

from remedy.kb.client import tar_run
from remedy.kb.server.jobs import INTERRUPTED

from .conftest import serve

QUICK = Path(str(resources.files("remedy.cases") / "scenarios" / "checkpoints" / "cartpole_undertrained"))
TINY = {
    "patch": {"kind": "hyperparameters", "changes": {"learning_rate": 0.001}},
    "seeds": 1,
    "budget": 256,
    "episodes": 3,
    "n_envs": 2,
}


def _upload(s) -> str:
    r = s.client.post("/v1/runs", content=tar_run(QUICK), headers=s.auth("writer"))
    assert r.status_code == 201, r.text
    return r.json()["run_id"]


def _submit(s, **overrides) -> dict:
    r = s.client.post("/v1/jobs/verify", json={**TINY, "run_id": _upload(s), **overrides}, headers=s.auth("writer"))
    assert r.status_code == 202, r.text
    return r.json()


def _wait(s, job_id: str, states: tuple[str, ...], polls: int = 3000) -> dict:
    for _ in range(polls):  # bounded: at most polls x 0.1 s
        job = s.client.get(f"/v1/jobs/{job_id}", headers=s.auth("reader")).json()
        if job["state"] in states:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} never reached {states}: {job}")


@pytest.mark.slow
def test_verify_job_runs_to_done_and_stores_the_case(kb_path, embedder):
    for s in serve(kb_path, embedder):
        job = _submit(s)
        assert job["state"] == "queued" and job["owner"] == "writer"
        done = _wait(s, job["job_id"], ("done", "failed", "cancelled"))
        assert done["state"] == "done", done
        result = done["result"]
        assert result["status"] == "inconclusive"  # one seed per arm: never a verdict
        assert s.service.kb.get(result["case_id"]).verification.seeds == 1
        assert done["progress"]["message"] and done["started_at"] and done["finished_at"]
        listed = s.client.get("/v1/jobs?state=done", headers=s.auth("reader")).json()
        assert [j["job_id"] for j in listed] == [job["job_id"]]


def test_bad_job_input_is_refused_before_queueing(served):
    run_id = _upload(served)
    bad = [
        ({**TINY, "run_id": "run-000000000000"}, "no uploaded run"),
        ({**TINY, "run_id": run_id, "patch": {"kind": "teleport"}}, "kind"),
        ({**TINY, "run_id": run_id, "seeds": 0}, "seeds"),
    ]
    for body, fragment in bad:
        r = served.client.post("/v1/jobs/verify", json=body, headers=served.auth("writer"))
        assert r.status_code == 422 and fragment in r.json()["detail"], r.text
    assert (
        served.client.post(
            "/v1/jobs/verify", json={**TINY, "run_id": run_id}, headers=served.auth("reader")
        ).status_code
        == 403
    )
    assert served.service.jobs.list() == []
    assert served.client.get("/v1/jobs/job-nope", headers=served.auth("reader")).status_code == 404


def test_cancel_a_queued_job(served):
    job = _submit(served)
    r = served.client.post(f"/v1/jobs/{job['job_id']}/cancel", headers=served.auth("writer"))
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    assert served.service.runner.run_one(job["job_id"]).state.value == "cancelled"  # the worker skips it
    again = served.client.post(f"/v1/jobs/{job['job_id']}/cancel", headers=served.auth("writer"))
    assert again.status_code == 422 and "already cancelled" in again.json()["detail"]


@pytest.mark.slow
def test_cancel_a_running_job_stops_it_at_its_next_step(kb_path, embedder):
    for s in serve(kb_path, embedder):
        job = _submit(s, seeds=3, budget=4096)
        _wait(s, job["job_id"], ("running",))
        r = s.client.post(f"/v1/jobs/{job['job_id']}/cancel", headers=s.auth("writer"))
        assert r.status_code == 200 and r.json()["cancel_requested"]
        end = _wait(s, job["job_id"], ("done", "failed", "cancelled"))
        assert end["state"] == "cancelled" and "cancelled" in end["error"], end
        assert s.service.kb.count() == 0  # stopped before the case was stored


def test_a_job_running_at_a_crash_is_failed_interrupted_after_restart(kb_path, embedder):
    for s in serve(kb_path, embedder, run_jobs=False):
        running, queued = _submit(s), _submit(s)
        s.service.jobs.start(running["job_id"])  # as if the worker had picked it up, then the process died
    for s in serve(kb_path, embedder, run_jobs=False):
        job = s.client.get(f"/v1/jobs/{running['job_id']}", headers=s.auth("reader")).json()
        assert job["state"] == "failed" and job["error"] == INTERRUPTED
        assert s.service.interrupted == [running["job_id"]]
        assert s.client.get(f"/v1/jobs/{queued['job_id']}", headers=s.auth("reader")).json()["state"] == "queued"
