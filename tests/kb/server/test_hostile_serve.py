"""`remedy serve` answers /health and stops on SIGTERM while a verify job runs (issue 29).

A real uvicorn process: the job's fine-tunes run in limited children, its evidence in the service;
SIGTERM must end the service (the running job is marked interrupted at the next start).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

import httpx
import pytest

from remedy.cases.store import CaseStore
from remedy.kb.client import tar_run
from remedy.kb.server.jobs import INTERRUPTED
from remedy.kb.server.tokens import TokenStore

from .test_serve_e2e import _free_port

REMEDY = Path(sys.executable).parent / "remedy"
QUICK = Path(str(resources.files("remedy.cases") / "scenarios" / "checkpoints" / "cartpole_undertrained"))


def _start(kb: Path) -> tuple[subprocess.Popen, str]:
    url = f"http://127.0.0.1:{_free_port()}"
    proc = subprocess.Popen(
        [str(REMEDY), "serve", "--kb", str(kb), "--port", url.rsplit(":", 1)[1]],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    for _ in range(600):  # bounded wait for start-up (model and checkpoint loader warm-up)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("remedy serve never answered /health")


@pytest.mark.slow
def test_health_answers_and_sigterm_stops_the_service_while_a_job_runs(tmp_path):
    kb = tmp_path / "kb"
    kb.mkdir()
    _, token = TokenStore(CaseStore(kb / "remedy.duckdb")).create("writer", "t")
    proc, url = _start(kb)
    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
            run_id = http.post("/v1/runs", content=tar_run(QUICK)).json()["run_id"]
            body = {
                "run_id": run_id,
                "patch": {"kind": "hyperparameters", "changes": {"learning_rate": 0.001}},
                "seeds": 2,
                "budget": 50_000,  # far longer than the test: the job is still running at SIGTERM
                "episodes": 3,
                "n_envs": 2,
                "confirm": False,
            }
            job_id = http.post("/v1/jobs/verify", json=body).json()["job_id"]
            for _ in range(600):
                if http.get(f"/v1/jobs/{job_id}").json()["state"] == "running":
                    break
                time.sleep(0.1)
            assert http.get(f"/v1/jobs/{job_id}").json()["state"] == "running"
            for _ in range(5):
                assert http.get("/health", timeout=30).json()["status"] == "ok"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) is not None  # raises TimeoutExpired if SIGTERM were ignored
    finally:
        if proc.poll() is None:
            proc.kill()
    proc, url = _start(kb)  # the next start marks the job interrupted, never silently lost
    try:
        job = httpx.get(f"{url}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"}).json()
        assert job["state"] == "failed" and job["error"] == INTERRUPTED
    finally:
        proc.terminate()
        proc.wait(timeout=60)
