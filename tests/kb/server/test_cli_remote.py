"""The CLI's --server path in process: verify as a job, `remedy jobs`, import through the service.

The CLI's client is pointed at the app's TestClient (an httpx client), so the
commands, the routes and the job worker all run for real without a port.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from remedy.kb.cli import app as cli
from remedy.kb.client import RemedyClient

from .conftest import serve

QUICK = Path(str(resources.files("remedy.cases") / "scenarios" / "checkpoints" / "cartpole_undertrained"))
runner = CliRunner()


@pytest.fixture
def remote(kb_path, embedder, monkeypatch):
    """The service with its job worker, and the CLI's --server client routed to it with a writer token."""
    for s in serve(kb_path, embedder):
        from remedy.kb.cli import connect

        monkeypatch.setattr(
            connect, "client", lambda server, s=s: RemedyClient(server, s.tokens["writer"], http=s.client)
        )
        yield s


def _ok(*args):
    result = runner.invoke(cli, [str(a) for a in args])
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


@pytest.mark.slow
def test_verify_through_the_service_runs_a_job_and_stores_the_case(remote, tmp_path):
    patch = tmp_path / "lr.yaml"
    patch.write_text(yaml.safe_dump({"kind": "hyperparameters", "changes": {"learning_rate": 0.001}}))
    out = _ok(
        "verify",
        QUICK,
        "--patch",
        patch,
        "--seeds",
        "1",
        "--budget",
        "256",
        "--episodes",
        "3",
        "--server",
        "http://testserver",
        "--json",
    )
    result = json.loads(out)
    assert remote.service.kb.get(result["case_id"]).status == result["status"]
    jobs = json.loads(_ok("jobs", "list", "--server", "http://testserver", "--json"))
    assert [j["state"] for j in jobs] == ["done"] and jobs[0]["result"]["case_id"] == result["case_id"]
    shown = _ok("jobs", "show", jobs[0]["job_id"], "--server", "http://testserver")
    assert "done" in shown


def test_verify_no_wait_then_cancel(remote, tmp_path):
    remote.service.runner.stop()  # keep the job queued
    patch = tmp_path / "lr.yaml"
    patch.write_text(yaml.safe_dump({"kind": "hyperparameters", "changes": {"learning_rate": 0.001}}))
    job = json.loads(_ok("verify", QUICK, "--patch", patch, "--server", "http://testserver", "--no-wait", "--json"))
    assert job["state"] == "queued"
    assert "cancelled" in _ok("jobs", "cancel", job["job_id"], "--server", "http://testserver")


def test_import_and_stats_through_the_service(remote, corpus_file):
    assert "5 added" in _ok("kb", "import", corpus_file, "--server", "http://testserver")
    stats = json.loads(_ok("kb", "stats", "--server", "http://testserver", "--json"))
    assert stats["store"]["total"] == 5 and remote.service.kb.count() == 5


def test_jobs_without_a_server_is_one_clear_error():
    result = runner.invoke(cli, ["jobs", "list"])
    assert result.exit_code != 0 and "--server" in str(result.exception)
