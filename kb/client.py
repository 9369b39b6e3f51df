"""The knowledge base through a running `remedy serve`: the same calls as ``KnowledgeBase``, over HTTP.

One interface, two transports: :class:`RemedyClient` answers the calls of
:class:`~remedy.kb.facade.KnowledgeBase` that make sense remotely (``similar``, ``similar_to_run``,
``get``, ``cases``, ``export``, ``stats``, ``import_file``, ``rules``, ``rule``, ``review``,
``mine``) with the same typed values, so a CLI command is written once against :class:`KBCalls`
and renders one result whichever transport answered. The bodies on the wire are the server's
pydantic models (:mod:`remedy.kb.server.models`), parsed here. The service's own calls (uploads,
diagnoses, jobs, tokens) return those models.

Every failure becomes a :class:`ServiceError` carrying the service's one-line message, so the CLI
prints it as it prints any other RemedyError. The token is ``$REMEDY_TOKEN`` unless given.

A new call with a route (``remedy case similar`` is one): the ``KnowledgeBase`` method, a route in
``kb/server/routes.py`` answering it (a body model in ``models.py`` if it takes one), the method here
(and in :class:`KBCalls`), one command over ``open_kb`` in ``kb/cli`` registered in
``kb/cli/__init__.py``, and its case in ``tests/kb/server/test_local_equals_served.py``.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter

from remedy.cases.errors import ImportFileError, RemedyError, ServiceError, ValidationError
from remedy.cases.io import ImportLimits, case_from_json, case_to_json, read_cases, write_cases
from remedy.cases.model import Case, Signature
from remedy.cases.store import StoreStats
from remedy.kb.facade import ImportReport, KBStats, MineReport, Progress, SimilarCase
from remedy.kb.server.models import (
    FixJobIn,
    Health,
    Hit,
    ImportOut,
    JobOut,
    MineOut,
    RunOut,
    StatsOut,
    VerifyJobIn,
)
from remedy.kb.server.tokens import TokenOut
from remedy.miners.model import Rule, RuleStatus
from remedy.retrieval.diagnosis import DiagnosisReport

if TYPE_CHECKING:
    from remedy.cases.evidence.signature import RunSignature

__all__ = ["KBCalls", "RemedyClient", "ServiceError", "TOKEN_ENV", "SERVER_ENV", "tar_run"]

TOKEN_ENV = "REMEDY_TOKEN"
SERVER_ENV = "REMEDY_SERVER"
#: job states after which nothing changes
FINAL_STATES = ("done", "failed", "cancelled")

_HITS = TypeAdapter(list[Hit])
_RULES = TypeAdapter(list[Rule])
_JOBS = TypeAdapter(list[JobOut])


class KBCalls(Protocol):
    """What a CLI command asks of a knowledge base: answered by ``KnowledgeBase`` (local) and
    :class:`RemedyClient` (served) alike, with the same types."""

    def similar(
        self,
        query: str | Signature | Case,
        k: int = 10,
        *,
        env_id: str | None = None,
        action_space: str | None = None,
        algo: str | None = None,
        only_improved: bool = False,
        min_effect: float | None = None,
        mode: str = "hybrid",
    ) -> list[SimilarCase]: ...

    def similar_to_run(
        self,
        run_dir: Path | str,
        k: int = 10,
        *,
        n_episodes: int = 10,
        seed: int = 0,
        same_action_space: bool = True,
        trust: bool = False,
        only_improved: bool = False,
    ) -> tuple[RunSignature, list[SimilarCase]]: ...

    def get(self, case_id: str) -> Case: ...

    def export(self, path: Path | str) -> int: ...

    def stats(self, index: bool = True) -> KBStats: ...

    def import_file(
        self,
        path: Path | str,
        skip_invalid: bool = False,
        progress: Progress | None = None,
        limits: ImportLimits | None = None,
        mark_imported: bool = False,
        replace: bool = False,
    ) -> ImportReport: ...

    def rules(self, status: RuleStatus | str | None = None) -> list[Rule]: ...

    def rule(self, rule_id: str) -> Rule: ...

    def review(self, rule_id: str, decision: RuleStatus | str, reviewer: str | None = None, note: str = "") -> Rule: ...

    def mine(self, *, min_support: int = 3, fdr: float = 0.1, max_conditions: int = 2, seed: int = 0) -> MineReport: ...

    def __enter__(self) -> KBCalls: ...

    def __exit__(self, *exc: object) -> None: ...


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

    def __repr__(self) -> str:
        return f"RemedyClient({self.url!r})"

    def _request(self, method: str, path: str, body: BaseModel | None = None, **kw: object) -> httpx.Response:
        if body is not None:  # the model's own JSON: NaN and inf as the strings the service reads back
            kw["content"] = body.model_dump_json()
            kw["headers"] = {"Content-Type": "application/json"}
        try:
            response = self._http.request(method, path, **kw)  # type: ignore[arg-type]
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

    def health(self) -> Health:
        """The service is up, and its Remedy version."""
        return Health.model_validate_json(self._request("GET", "/health").content)

    # -- the calls of KnowledgeBase ---------------------------------------------------------

    def similar(
        self,
        query: str | Signature | Case,
        k: int = 10,
        *,
        env_id: str | None = None,
        action_space: str | None = None,
        algo: str | None = None,
        only_improved: bool = False,
        min_effect: float | None = None,
        mode: str = "hybrid",
    ) -> list[SimilarCase]:
        """Stored cases most similar to a text (``POST /v1/query``), a signature (``POST /v1/similar``) or a
        stored case, itself excluded (``POST /v1/cases/{id}/similar``)."""
        filters: dict[str, object] = {"k": k, "env": env_id, "action_space": action_space, "algo": algo}
        filters |= {"mode": mode, "only_improved": only_improved, "min_effect": min_effect, "full": True}
        body: dict[str, object]
        if isinstance(query, str):
            path, body = "/v1/query", {"text": query}
        elif isinstance(query, Case):
            path, body = f"/v1/cases/{_quote(query.case_id)}/similar", {}
        else:  # the signature's own JSON keeps NaN features as strings, which the service reads back
            path, body = "/v1/similar", {"signature": json.loads(query.model_dump_json())}
        hits = _HITS.validate_json(self._request("POST", path, json=_given(body | filters)).content)
        return [SimilarCase(_case(h), h.similarity, h.rank) for h in hits]

    def similar_to_run(
        self,
        run_dir: Path | str,
        k: int = 10,
        *,
        n_episodes: int = 10,
        seed: int = 0,
        same_action_space: bool = True,
        trust: bool = False,
        only_improved: bool = False,
    ) -> tuple[RunSignature, list[SimilarCase]]:
        """The run's signature, rolled out on this machine, and the served cases similar to it."""
        # SB3, gymnasium and torch: loaded only by a command that rolls an agent out
        from remedy.cases.evidence.signature import signature_of_run

        run = signature_of_run(Path(run_dir).resolve(), n_episodes=n_episodes, seed=seed, trust=trust)
        space = run.subject.traits.action_space.value if same_action_space else None
        return run, self.similar(run.signature, k=k, action_space=space, only_improved=only_improved)

    def get(self, case_id: str) -> Case:
        """The stored case with this id (the service's 404 names close ids)."""
        return case_from_json(self._request("GET", f"/v1/cases/{_quote(case_id)}").text)

    def cases(self) -> Iterator[Case]:
        """Every stored case, in id order."""
        for line in self._request("GET", "/v1/cases").text.splitlines():
            yield case_from_json(line)

    def export(self, path: Path | str) -> int:
        """Write every served case to ``.jsonl`` or ``.parquet`` here; returns the count."""
        return write_cases(path, self.cases())

    def stats(self, index: bool = True) -> KBStats:
        """Case counts, schema version, and (with ``index``) the index's size and state."""
        out = StatsOut.model_validate_json(self._request("GET", "/v1/stats", params={"index": index}).content)
        store = StoreStats(**out.store.model_dump())
        return KBStats(path=Path(out.path), store=store, **out.model_dump(exclude={"path", "store"}))

    def import_file(
        self,
        path: Path | str,
        skip_invalid: bool = False,
        progress: Progress | None = None,
        limits: ImportLimits | None = None,
        mark_imported: bool = False,
        replace: bool = False,
    ) -> ImportReport:
        """Send a case file to the service: JSONL as it is (the service validates it against its own
        limits), Parquet and JSON read here with ``limits`` and sent as JSONL. ``progress`` is not
        reported (one request); ``replace`` is refused (a served KB is shared)."""
        if replace:
            raise ValidationError("--replace is not available through --server; drop it, or import with --kb")
        params = {"skip_invalid": skip_invalid, "mark_imported": mark_imported}
        headers = {"Content-Type": "application/x-ndjson"}
        body = _jsonl_bytes(Path(path), skip_invalid, limits)
        out = ImportOut.model_validate_json(
            self._request("POST", "/v1/cases/import", content=body, params=params, headers=headers).content
        )
        problems = tuple((p.line, p.message) for p in out.problems)
        return ImportReport(Path(path), out.read, out.added, out.unchanged, problems)

    def rules(self, status: RuleStatus | str | None = None) -> list[Rule]:
        """Stored rules (only those in review state ``status`` when given)."""
        wanted = RuleStatus(status).value if status is not None else None
        return _RULES.validate_json(self._request("GET", "/v1/rules", params=_given({"status": wanted})).content)

    def rule(self, rule_id: str) -> Rule:
        """One stored rule (the service's 404 names close ids)."""
        return Rule.model_validate_json(self._request("GET", f"/v1/rules/{_quote(rule_id)}").content)

    def review(self, rule_id: str, decision: RuleStatus | str, reviewer: str | None = None, note: str = "") -> Rule:
        """Accept or reject a rule; the service records the review under the token's name, never ``reviewer``."""
        if reviewer is not None:
            raise ValidationError(
                "--reviewer does not apply with --server: the service records the name of the token in $REMEDY_TOKEN"
            )
        verb = {RuleStatus.accepted: "accept", RuleStatus.rejected: "reject"}.get(RuleStatus(decision))
        if verb is None:
            raise ValidationError("a review decides: 'accepted' or 'rejected'")
        path = f"/v1/rules/{_quote(rule_id)}/{verb}"
        return Rule.model_validate_json(self._request("POST", path, json={"note": note}).content)

    def mine(self, *, min_support: int = 3, fdr: float = 0.1, max_conditions: int = 2, seed: int = 0) -> MineReport:
        """Mine the served KB's cases and store the rules there."""
        params = {"min_support": min_support, "fdr": fdr, "max_conditions": max_conditions, "seed": seed}
        return MineOut.model_validate_json(self._request("POST", "/v1/mine", json=params).content)

    # -- the service's own calls --------------------------------------------------------------

    def upload_run(self, run_dir: Path | str) -> RunOut:
        """Send a run directory as a .tar.gz; later calls refer to it by ``run_id``."""
        headers = {"Content-Type": "application/gzip"}
        return RunOut.model_validate_json(
            self._request("POST", "/v1/runs", content=tar_run(Path(run_dir)), headers=headers).content
        )

    def diagnose(self, run_dir: Path | str | None = None, **fields: object) -> DiagnosisReport:
        """A diagnosis by the service: of ``run_dir`` (uploaded first), or of the fields of ``POST /v1/diagnose``
        (``describe=...`` with ``env``, ``algo``, ``action_space``, ``tags``; ``diagnoser``, ``k``, ...)."""
        body = _given(fields)
        if run_dir is not None:
            body["run_id"] = self.upload_run(run_dir).run_id
        return DiagnosisReport.model_validate_json(self._request("POST", "/v1/diagnose", json=body).content)

    def submit(self, job: VerifyJobIn | FixJobIn) -> JobOut:
        """Queue a verify or fix job on an uploaded run; returns it queued."""
        kind = "verify" if isinstance(job, VerifyJobIn) else "fix"
        return JobOut.model_validate_json(self._request("POST", f"/v1/jobs/{kind}", body=job).content)

    def job(self, job_id: str) -> JobOut:
        """One job: state, progress, result or error."""
        return JobOut.model_validate_json(self._request("GET", f"/v1/jobs/{_quote(job_id)}").content)

    def jobs(self, state: str | None = None) -> list[JobOut]:
        """Recent jobs, newest first."""
        return _JOBS.validate_json(self._request("GET", "/v1/jobs", params=_given({"state": state})).content)

    def cancel(self, job_id: str) -> JobOut:
        """Cancel a job (its owner or an admin)."""
        return JobOut.model_validate_json(self._request("POST", f"/v1/jobs/{_quote(job_id)}/cancel").content)

    def revoke_token(self, id_or_name: str) -> TokenOut:
        """Revoke a token by id or name (needs an admin token)."""
        return TokenOut.model_validate_json(self._request("POST", f"/v1/tokens/{_quote(id_or_name)}/revoke").content)

    def wait(
        self,
        job_id: str,
        poll_s: float = 1.0,
        timeout_s: float = 24 * 3600,
        progress: Callable[[JobOut], None] | None = None,
    ) -> JobOut:
        """Poll a job until it is done, failed or cancelled (or ``timeout_s`` passes); returns it."""
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.job(job_id)
            if progress is not None:
                progress(job)
            if job.state in FINAL_STATES or time.monotonic() > deadline:
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


def _jsonl_bytes(file: Path, skip_invalid: bool, limits: ImportLimits | None) -> bytes:
    """A case file as JSONL bytes: a .jsonl file as it is, any other format read (and validated) here."""
    if file.suffix.lower() == ".jsonl":
        if not file.is_file():
            raise ImportFileError(f"{file}: no such file", [(0, "no such file")])
        return file.read_bytes()
    cases, _ = read_cases(file, skip_invalid=skip_invalid, limits=limits)
    return "".join(case_to_json(c) + "\n" for c in cases).encode()


def _case(hit: Hit) -> Case:
    if hit.case is None:  # asked for with full=True: a service that drops it is not this one
        raise ServiceError(f"the service answered case {hit.case_id} without its body; is it a Remedy service?")
    return Case.model_validate(hit.case)


def _given(params: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in params.items() if v is not None}


def _quote(part: str) -> str:
    return quote(part, safe="")
