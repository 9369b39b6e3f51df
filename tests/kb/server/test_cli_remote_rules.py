"""`remedy mine`, `remedy rules ...` and `remedy diagnose` with --server, in process.

As in test_cli_remote, the CLI's client is pointed at the app's TestClient, so the commands,
the routes and the real miner and diagnoser run without a port. The token is chosen per test.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
from typer.testing import CliRunner

from remedy.kb.cli import app as cli
from remedy.kb.client import RemedyClient, ServiceError

from ...miners.conftest import planted_cases
from .conftest import serve

QUICK = Path(str(resources.files("remedy.cases") / "scenarios" / "checkpoints" / "cartpole_undertrained"))
URL = "http://testserver"
runner = CliRunner()


@pytest.fixture
def remote(kb_path, embedder, monkeypatch):
    """The service on a KB with the planted cases; ``remote.role`` picks the token the CLI sends (reviewer)."""
    from remedy.kb.cli import common, connect

    monkeypatch.setattr(common.console, "width", 200)
    for s in serve(kb_path, embedder, run_jobs=False):
        s.service.kb.add_many(planted_cases())
        s.role = "reviewer"
        monkeypatch.setattr(
            connect, "client", lambda server, s=s: RemedyClient(server, s.tokens[s.role], http=s.client)
        )
        yield s


def _ok(*args) -> str:
    result = runner.invoke(cli, [str(a) for a in args])
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


def _fails(*args) -> str:
    result = runner.invoke(cli, [str(a) for a in args])
    assert result.exit_code != 0 and result.exception is not None, result.output
    return str(result.exception)


def _planted(mined: dict) -> str:
    return next(r["id"] for r in mined["rules"] if r["family"] == "action_smoothness")


def test_mine_list_show_accept_through_the_service(remote):
    remote.role = "writer"
    mined = json.loads(_ok("mine", "--server", URL, "--json"))
    assert set(mined) == {"attempts", "tested", "rules", "new", "updated", "flagged"} and mined["new"]
    rid = _planted(mined)
    assert "new 0 / updated" in _ok("mine", "--server", URL)  # the table form, re-mined
    listed = json.loads(_ok("rules", "list", "--server", URL, "--json"))
    assert sorted(r["id"] for r in listed) == sorted(mined["new"])
    shown = _ok("rules", "show", rid, "--server", URL)
    assert "supporting cases" in shown and "review   none yet" in shown

    remote.role = "reviewer"
    out = _ok("rules", "accept", rid, "--note", "seen it", "--server", URL)
    assert f"accepted {rid}" in out and "by reviewer" in out
    (review,) = _stored_reviews(remote, rid)
    assert review.reviewer == "reviewer" and review.note == "seen it"
    assert rid in _ok("rules", "list", "--status", "accepted", "--server", URL)
    assert "review   accepted by reviewer" in _ok("rules", "show", rid, "--server", URL)
    assert f"rejected {rid}" in _ok("rules", "reject", rid, "--note", "pendulum only", "--server", URL)


def _stored_reviews(remote, rid: str):
    from remedy.miners import RuleStore

    return RuleStore(remote.service.kb.store).get(rid).reviews


def test_review_errors_through_the_service(remote):
    _ok("mine", "--server", URL)
    rid = json.loads(_ok("rules", "list", "--server", URL, "--json"))[0]["id"]
    assert "--reviewer does not apply with --server" in _fails(
        "rules", "accept", rid, "--reviewer", "mallory", "--server", URL
    )
    assert f"did you mean '{rid}'" in _fails("rules", "accept", rid[:-1] + "x", "--server", URL)
    remote.role = "reader"
    err = _fails("rules", "accept", rid, "--server", URL)
    assert "403" in err and "reviewer token" in err
    assert _stored_reviews(remote, rid) == []


def test_diagnose_describe_through_the_service_is_the_served_report(remote, tmp_path):
    remote.role = "reader"
    args = ["--describe", "the torque chatters between its bounds", "--env", "Pendulum-v1", "--tags", "jerky_actions"]
    out = json.loads(_ok("diagnose", *args, "--server", URL, "--json", "--write-patches", tmp_path / "p"))
    body = {"describe": args[1], "env": "Pendulum-v1", "tags": ["jerky_actions"]}
    served = remote.client.post("/v1/diagnose", json=body, headers=remote.auth("reader")).json()
    files = out.pop("patch_files")
    assert out == served
    assert len(files) == len(served["candidates"]) and all(Path(f).is_file() for f in files)
    table = _ok("diagnose", *args, "--server", URL)
    assert "read as: jerky_actions (set by --tags)" in table and "Root causes (offline" in table


def test_diagnose_a_run_through_the_service_uploads_it(remote):
    remote.role = "writer"
    out = json.loads(_ok("diagnose", QUICK, "--episodes", "3", "--k", "3", "--server", URL, "--json"))
    assert out["diagnosis"]["causes"] and out["signature"]["summary"]
    assert len(list(remote.service.runs_dir.iterdir())) == 1
    assert "--exclude-scenario" in _fails("diagnose", QUICK, "--exclude-scenario", "x", "--server", URL)


def test_an_unreachable_service_is_one_clear_error():
    result = runner.invoke(cli, ["rules", "list", "--server", "http://127.0.0.1:9"])
    assert isinstance(result.exception, ServiceError) and "cannot reach" in str(result.exception)
