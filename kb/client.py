"""A small HTTP client for `remedy serve`, used by the CLI's ``--server URL`` (or ``$REMEDY_SERVER``).

Every call returns the service's JSON (the same shapes as the CLI's ``--json``);
every failure becomes a :class:`ServiceError` carrying the service's one-line
message, so the CLI prints it as it prints any other RemedyError.
"""

from __future__ import annotations

import io
import os
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from remedy.cases.errors import RemedyError

__all__ = ["RemedyClient", "ServiceError", "TOKEN_ENV", "SERVER_ENV"]

TOKEN_ENV = "REMEDY_TOKEN"
SERVER_ENV = "REMEDY_SERVER"


class ServiceError(RemedyError):
    """The service refused a request or could not be reached; ``status`` is the HTTP status (0: unreachable)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class RemedyClient:
    """Calls to one Remedy service with one token (``$REMEDY_TOKEN`` by default)."""

    def __init__(
        self, url: str, token: str | None = None, timeout: float = 120.0, http: httpx.Client | None = None
    ) -> None:
        """``http``: an httpx client to send through (FastAPI's TestClient in tests); default a new one."""
        self.url = url.rstrip("/")
        token = token if token is not None else os.environ.get(TOKEN_ENV, "")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._owned = http is None
        self._http = http or httpx.Client(base_url=self.url, timeout=timeout)
        self._http.headers.update(headers)

    def close(self) -> None:
        """Close the connection pool (not one passed in by the caller)."""
        if self._owned:
            self._http.close()

    def __enter__(self) -> RemedyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kw)
        except httpx.HTTPError as err:
            raise ServiceError(
                f"cannot reach the Remedy service at {self.url} ({err}); start it with `remedy serve` "
                f"or fix --server / {SERVER_ENV}"
            ) from None
        if response.status_code >= 400:
            raise ServiceError(self._message(response), response.status_code)
        return response

    def _message(self, response: httpx.Response) -> str:
        try:
            detail = response.json().get("detail")
        except (ValueError, AttributeError):
            detail = None
        detail = detail if isinstance(detail, str) else response.text[:300]
        if response.status_code == 401:
            detail += f" (the CLI sends ${TOKEN_ENV})"
        return f"{self.url} answered {response.status_code}: {detail}"

    # -- reads ------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``{"status": "ok", "version": ...}``."""
        return self._request("GET", "/health").json()

    def query(self, text: str, **filters: Any) -> list[dict[str, Any]]:
        """Similar cases to a text; ``filters`` are those of ``POST /v1/query`` (k, env, algo, full, ...)."""
        return self._request("POST", "/v1/query", json={"text": text, **_given(filters)}).json()

    def similar(self, signature: dict[str, Any], **filters: Any) -> list[dict[str, Any]]:
        """Similar cases to a signature (its JSON)."""
        return self._request("POST", "/v1/similar", json={"signature": signature, **_given(filters)}).json()

    def case(self, case_id: str) -> dict[str, Any]:
        """One case's JSON."""
        return self._request("GET", f"/v1/cases/{_quote(case_id)}").json()

    def stats(self) -> dict[str, Any]:
        """The ``remedy kb stats --json`` shape."""
        return self._request("GET", "/v1/stats").json()

    def export_lines(self) -> Iterator[str]:
        """Every case as one JSON line each."""
        yield from self._request("GET", "/v1/cases").text.splitlines()

    # -- writes -----------------------------------------------------------------------------

    def import_jsonl(self, body: bytes, skip_invalid: bool = False) -> dict[str, Any]:
        """Import JSONL (or a JSON array) of cases; returns read/added/unchanged/skipped/problems."""
        params = {"skip_invalid": "true"} if skip_invalid else {}
        return self._request(
            "POST", "/v1/cases/import", content=body, params=params, headers={"Content-Type": "application/x-ndjson"}
        ).json()

    def upload_run(self, run_dir: Path | str) -> dict[str, Any]:
        """Send a run directory as a .tar.gz; returns ``{"run_id", "env_id", "algo"}``."""
        return self._request(
            "POST", "/v1/runs", content=tar_run(Path(run_dir)), headers={"Content-Type": "application/gzip"}
        ).json()

    def diagnose(self, **body: Any) -> dict[str, Any]:
        """A DiagnosisReport's JSON for ``run_id=...``, ``subject=..., signature=...`` or ``describe=...``."""
        return self._request("POST", "/v1/diagnose", json=_given(body)).json()

    # -- rules ------------------------------------------------------------------------------

    def rules(self, status: str | None = None) -> list[dict[str, Any]]:
        """Stored rules (only those in review state ``status`` when given), each as `remedy rules show --json`."""
        return self._request("GET", "/v1/rules", params=_given({"status": status})).json()

    def rule(self, rule_id: str) -> dict[str, Any]:
        """One rule's JSON."""
        return self._request("GET", f"/v1/rules/{_quote(rule_id)}").json()

    def review(self, rule_id: str, decision: str, note: str = "") -> dict[str, Any]:
        """Accept or reject a rule (``decision``: "accept" or "reject"); the service records the token's name."""
        return self._request("POST", f"/v1/rules/{_quote(rule_id)}/{decision}", json={"note": note}).json()

    def mine(self, **params: Any) -> dict[str, Any]:
        """Mine and store rules (min_support, fdr, max_conditions, seed); the shape of `remedy mine --json`."""
        return self._request("POST", "/v1/mine", json=_given(params)).json()

    def submit(self, kind: str, **params: Any) -> dict[str, Any]:
        """Queue a ``verify`` or ``fix`` job; returns the job."""
        return self._request("POST", f"/v1/jobs/{kind}", json=_given(params)).json()

    def job(self, job_id: str) -> dict[str, Any]:
        """One job."""
        return self._request("GET", f"/v1/jobs/{_quote(job_id)}").json()

    def jobs(self, state: str | None = None) -> list[dict[str, Any]]:
        """Recent jobs, newest first."""
        return self._request("GET", "/v1/jobs", params=_given({"state": state})).json()

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a job."""
        return self._request("POST", f"/v1/jobs/{_quote(job_id)}/cancel").json()

    def revoke_token(self, id_or_name: str) -> dict[str, Any]:
        """Revoke a token by id or name (needs an admin token)."""
        return self._request("POST", f"/v1/tokens/{_quote(id_or_name)}/revoke").json()

    def wait(
        self,
        job_id: str,
        poll_s: float = 1.0,
        timeout_s: float = 24 * 3600,
        progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Poll a job until it is done, failed or cancelled (or ``timeout_s`` passes); returns it."""
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.job(job_id)
            if progress is not None:
                progress(job)
            if job["state"] in ("done", "failed", "cancelled") or time.monotonic() > deadline:
                return job
            time.sleep(poll_s)


def tar_run(run_dir: Path) -> bytes:
    """A run directory as gzipped tar bytes, its files under the directory's name (links followed)."""
    if not (run_dir / "run.yaml").is_file():
        raise RemedyError(f"{run_dir} is not a run directory (no run.yaml); pass the folder holding run.yaml")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", dereference=True) as tar:
        tar.add(run_dir, arcname=run_dir.resolve().name)
    return buf.getvalue()


def _given(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None}


def _quote(part: str) -> str:
    from urllib.parse import quote

    return quote(part, safe="")
