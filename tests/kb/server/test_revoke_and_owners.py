"""Token revocation through the running service (admin role) and job ownership (issue 29).

A leaked token must be revocable while `remedy serve` holds the KB, and it must
get 401 from the very next request; a writer may cancel only its own jobs.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from remedy.kb import client as client_module
from remedy.kb.cli import app as cli
from remedy.kb.client import RemedyClient

from .test_jobs import TINY, _upload

runner = CliRunner()


@pytest.fixture
def admin(served) -> str:
    """An admin token on the served KB."""
    return served.service.tokens.create("admin", "root")[1]


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_revoked_token_gets_401_at_its_next_request(served, admin):
    leaked = served.service.tokens.create("writer", "leaked")[1]
    assert served.client.get("/v1/stats", headers=_bearer(leaked)).status_code == 200
    by_writer = served.client.post("/v1/tokens/leaked/revoke", headers=served.auth("reviewer"))
    assert by_writer.status_code == 403 and "admin" in by_writer.json()["detail"]
    assert served.client.get("/v1/stats", headers=_bearer(leaked)).status_code == 200  # nothing changed
    r = served.client.post("/v1/tokens/leaked/revoke", headers=_bearer(admin))
    assert r.status_code == 200, r.text
    assert r.json()["name"] == "leaked" and r.json()["revoked_at"] is not None and "hash" not in r.json()
    after = served.client.get("/v1/stats", headers=_bearer(leaked))
    assert after.status_code == 401 and "revoked" in after.json()["detail"]
    assert served.client.post("/v1/tokens/leaked/revoke", headers=_bearer(admin)).status_code == 422  # already
    assert served.client.get("/v1/stats", headers=served.auth("writer")).status_code == 200  # others unaffected


def test_revoke_needs_a_token_even_with_public_read(kb_path, embedder):
    from .conftest import serve

    for s in serve(kb_path, embedder, run_jobs=False, public_read=True):
        assert s.client.get("/v1/stats").status_code == 200
        assert s.client.post("/v1/tokens/reader/revoke").status_code == 401
        assert s.client.get("/v1/stats", headers=s.auth("reader")).status_code == 200


def test_remedy_tokens_revoke_through_the_service(served, admin, monkeypatch):
    leaked = served.service.tokens.create("reader", "laptop")[1]
    monkeypatch.setattr(
        client_module, "RemedyClient", lambda url, token=None: RemedyClient(url, admin, http=served.client)
    )
    result = runner.invoke(cli, ["tokens", "revoke", "laptop", "--server", "http://testserver"])
    assert result.exit_code == 0, result.output
    assert "revoked reader token laptop" in result.output
    assert served.client.get("/v1/stats", headers=_bearer(leaked)).status_code == 401
    listed = {t.name: t for t in served.service.tokens.list()}
    assert not listed["laptop"].active and listed["writer"].active


def _submit(served, role_headers: dict[str, str]) -> dict:
    r = served.client.post("/v1/jobs/verify", json={**TINY, "run_id": _upload(served)}, headers=role_headers)
    assert r.status_code == 202, r.text
    return r.json()


def test_only_the_owner_or_an_admin_cancels_a_job(served, admin):
    other = served.service.tokens.create("writer", "other")[1]
    mine = _submit(served, served.auth("writer"))
    assert mine["owner"] == "writer"
    for headers in (_bearer(other), served.auth("reviewer")):  # another writer; a higher role is not enough
        r = served.client.post(f"/v1/jobs/{mine['job_id']}/cancel", headers=headers)
        assert r.status_code == 403 and "only its owner or an admin" in r.json()["detail"], r.text
    assert served.service.jobs.get(mine["job_id"]).state.value == "queued"  # nothing changed
    own = served.client.post(f"/v1/jobs/{mine['job_id']}/cancel", headers=served.auth("writer"))
    assert own.status_code == 200 and own.json()["state"] == "cancelled"
    theirs = _submit(served, _bearer(other))
    by_admin = served.client.post(f"/v1/jobs/{theirs['job_id']}/cancel", headers=_bearer(admin))
    assert by_admin.status_code == 200 and by_admin.json()["state"] == "cancelled"
    assert served.client.post(f"/v1/jobs/{theirs['job_id']}/cancel", headers=served.auth("reader")).status_code == 403


def test_a_same_named_token_does_not_own_anothers_job(served):
    twin = served.service.tokens.create("writer", "writer")[1]  # same name as the fixture's writer token
    job = _submit(served, served.auth("writer"))
    r = served.client.post(f"/v1/jobs/{job['job_id']}/cancel", headers=_bearer(twin))
    assert r.status_code == 403
    stored = served.service.jobs.get(job["job_id"])
    assert stored.owner_id is not None and json.dumps(stored.as_dict(), default=str)
