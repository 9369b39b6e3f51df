"""The HTTP routes: each parses its input, checks the caller's role, calls one function, returns JSON.

Every route but ``/health`` needs ``Authorization: Bearer <token>``: ``reader`` for
reads (open to anyone with ``--public-read``), ``writer`` for imports, uploads,
jobs and mining, ``reviewer`` for accepting and rejecting rules (the review is
recorded under the token's name), ``admin`` for revoking tokens. A job may be
cancelled by the token that submitted it or an admin. Wrong, revoked or missing
token: 401 (checked against the store on every request); a role too low: 403;
nothing is written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, HTTPException, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from remedy.cases.evidence.rundir import RunDir
from remedy.cases.io import case_to_json
from remedy.miners.model import Rule, RuleStatus
from remedy.retrieval.diagnosis import DiagnosisReport

from . import handlers
from .jobs import JobState
from .models import (
    CaseSimilarIn,
    DiagnoseIn,
    ErrorOut,
    FixJobIn,
    Health,
    Hit,
    ImportOut,
    JobOut,
    MineIn,
    MineOut,
    QueryIn,
    RejectIn,
    ReviewIn,
    RunOut,
    SimilarIn,
    StatsOut,
    VerifyJobIn,
)
from .service import Service, remedy_version
from .tokens import Role, TokenOut, TokenRecord

__all__ = ["router"]

_bearer = HTTPBearer(auto_error=False, description="A token from `remedy tokens create`.")
_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorOut} for code in (401, 403, 404, 413, 422)}
router = APIRouter(responses=_ERRORS)


def _service(request: Request) -> Service:
    return request.app.state.service


def _require(role: Role) -> Callable[..., TokenRecord | None]:
    def check(
        request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
    ) -> TokenRecord | None:
        service = _service(request)
        if creds is None:
            if role is Role.reader and service.settings.public_read:
                return None
            raise HTTPException(
                401,
                "missing token: send `Authorization: Bearer <token>` (set REMEDY_TOKEN)",
                headers={"WWW-Authenticate": "Bearer"},
            )
        token = service.tokens.authenticate(creds.credentials)
        if token is None:
            raise HTTPException(
                401,
                "unknown or revoked token; ask for one made with `remedy tokens create`",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not token.role.allows(role):
            raise HTTPException(403, f"token {token.name!r} is a {token.role.value}; this needs a {role.value} token")
        return token

    return check


Svc = Annotated[Service, Depends(_service)]
#: a case, rule or job id in a path (ids are short; an error never echoes a megabyte of one)
Id = Annotated[str, Path(max_length=200)]
Reader = Annotated[TokenRecord | None, Depends(_require(Role.reader))]
Writer = Annotated[TokenRecord | None, Depends(_require(Role.writer))]


def _reviewer(token: Annotated[TokenRecord | None, Depends(_require(Role.reviewer))]) -> TokenRecord:
    """The reviewer's token: its name is who the review is recorded under."""
    if token is None:  # only reads are ever open without a token; kept so a review always has a name
        raise HTTPException(401, "a review needs a reviewer token", headers={"WWW-Authenticate": "Bearer"})
    return token


Reviewer = Annotated[TokenRecord, Depends(_reviewer)]


def _named(role: Role) -> Callable[..., TokenRecord]:
    """A dependency for routes that act as a token (never open without one, even with ``--public-read``)."""

    # the dependency as a default, not in the annotation: annotations are strings here, resolved at module level
    def named(token: TokenRecord | None = Depends(_require(role))) -> TokenRecord:
        if token is None:
            raise HTTPException(401, f"this needs a {role.value} token", headers={"WWW-Authenticate": "Bearer"})
        return token

    return named


WriterToken = Annotated[TokenRecord, Depends(_named(Role.writer))]
Admin = Annotated[TokenRecord, Depends(_named(Role.admin))]


@router.get("/health", response_model=Health, tags=["service"])
async def health() -> Health:
    """The service is up (no token needed). Answered on the event loop, not a worker thread: it stays
    quick while CPU work (a diagnosis's rollouts, a job's evidence) holds the worker threads."""
    return Health(version=remedy_version())


@router.post("/v1/query", response_model=list[Hit], tags=["cases"])
def query(req: QueryIn, service: Svc, _: Reader) -> list[Hit]:
    """What fixed similar failures: the nearest stored cases to a text, with the filters of `remedy query`."""
    return handlers.hits_out(service.kb.similar(req.text, **req.search_kwargs()), req.full)


@router.post("/v1/similar", response_model=list[Hit], tags=["cases"])
def similar(req: SimilarIn, service: Svc, _: Reader) -> list[Hit]:
    """The stored cases nearest to a failure signature (from `remedy signature --json`)."""
    return handlers.hits_out(service.kb.similar(req.signature, **req.search_kwargs()), req.full)


@router.get("/v1/cases/{case_id}", tags=["cases"], responses={200: {"description": "The case as JSON."}})
def get_case(case_id: Id, service: Svc, _: Reader) -> Response:
    """One stored case in full (404 with close ids when unknown)."""
    return Response(case_to_json(service.kb.get(case_id)), media_type="application/json")


@router.post("/v1/cases/{case_id}/similar", response_model=list[Hit], tags=["cases"])
def similar_to_case(
    case_id: Id, service: Svc, _: Reader, req: Annotated[CaseSimilarIn | None, Body()] = None
) -> list[Hit]:
    """The stored cases nearest to a stored case, itself excluded (`remedy case similar`)."""
    req = req or CaseSimilarIn()
    return handlers.hits_out(service.kb.similar(service.kb.get(case_id), **req.search_kwargs()), req.full)


_IMPORT_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/x-ndjson": {"schema": {"type": "string"}},
            "application/json": {"schema": {"type": "array", "items": {"type": "object"}}},
        },
    }
}


@router.post("/v1/cases/import", response_model=ImportOut, tags=["cases"], openapi_extra=_IMPORT_BODY)
async def import_cases(
    request: Request,
    service: Svc,
    _: Writer,
    skip_invalid: Annotated[bool, Query(description="Import the valid records, skip the others.")] = False,
    mark_imported: Annotated[
        bool, Query(description="File verified/bench cases as 'imported' (another team's): they weigh less.")
    ] = False,
) -> ImportOut:
    """Import cases sent as JSONL or a JSON array; a body with an invalid record imports nothing (422)."""
    body = await request.body()
    return await run_in_threadpool(handlers.import_body, service, body, skip_invalid, mark_imported)


@router.get("/v1/cases", tags=["cases"], responses={200: {"content": {"application/x-ndjson": {}}}})
def export_cases(service: Svc, _: Reader) -> StreamingResponse:
    """Every case as JSONL (what `remedy kb export` writes), streamed."""

    def lines() -> Iterator[str]:
        for case in service.kb.cases():
            yield case_to_json(case) + "\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")


@router.get("/v1/stats", response_model=StatsOut, tags=["cases"])
def stats(
    service: Svc,
    _: Reader,
    index: Annotated[bool, Query(description="Also count the index rows and check them against the store.")] = True,
) -> StatsOut:
    """Case counts by source, status, env and root cause; schema version and index size (`remedy kb stats`)."""
    return StatsOut.of(service.kb.stats(index=index))


_UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/gzip": {"schema": {"type": "string", "format": "binary"}}},
    }
}


@router.post("/v1/runs", response_model=RunOut, status_code=201, tags=["runs"], openapi_extra=_UPLOAD_BODY)
async def upload_run(request: Request, service: Svc, token: Writer) -> RunOut:
    """Upload a run directory as a .tar.gz (`tar czf run.tgz -C PARENT RUN`); refer to it by run_id.
    Counted against the token's upload quota (413 past it); removed after the service's time to live."""
    body = await request.body()
    return await run_in_threadpool(_unpack, service, body, _owner(token))


def _unpack(service: Service, body: bytes, owner: str | None) -> RunOut:
    # validated on acceptance through RunDir.load, as every later use loads it; an unusable run is not kept
    run_id, cfg = service.uploads.accept(body, owner, lambda path: RunDir.load(path).config)
    return RunOut(run_id=run_id, env_id=cfg.env_id, algo=cfg.algo)


# The report is sent as written (NaN features as "NaN" strings, as case files do); the model documents it.
_REPORT: dict[int | str, dict[str, Any]] = {
    200: {"model": DiagnosisReport, "description": "A DiagnosisReport (what `remedy diagnose --json` prints)."}
}


@router.post("/v1/diagnose", tags=["diagnosis"], responses=_REPORT)
def diagnose(req: DiagnoseIn, service: Svc, _: Reader) -> Response:
    """Root causes and candidate patches for exactly one of: an uploaded run, a subject and signature,
    or a failure described in words (``describe``, as `remedy diagnose --describe`)."""
    return Response(handlers.diagnose(service, req), media_type="application/json")


# -- rules --------------------------------------------------------------------------------------


@router.get("/v1/rules", response_model=list[Rule], tags=["rules"])
def list_rules(
    service: Svc,
    _: Reader,
    status: Annotated[RuleStatus | None, Query(description="Only rules in this review state.")] = None,
) -> list[Rule]:
    """Stored rules with their evidence and review state, by id (`remedy rules list`)."""
    return service.kb.rules(status)


@router.get("/v1/rules/{rule_id}", response_model=Rule, tags=["rules"])
def get_rule(rule_id: Id, service: Svc, _: Reader) -> Rule:
    """One rule: condition, remedy, evidence, supporting and counter cases, reviews (404 with close ids)."""
    return service.kb.rule(rule_id)


@router.post("/v1/rules/{rule_id}/accept", response_model=Rule, tags=["rules"])
def accept_rule(rule_id: Id, service: Svc, token: Reviewer, req: Annotated[ReviewIn | None, Body()] = None) -> Rule:
    """Accept a rule (reviewer token): from now on it votes in diagnoses when its conditions hold."""
    return handlers.review(service, rule_id, "accepted", token.name, (req or ReviewIn()).note)


@router.post("/v1/rules/{rule_id}/reject", response_model=Rule, tags=["rules"])
def reject_rule(rule_id: Id, req: RejectIn, service: Svc, token: Reviewer) -> Rule:
    """Reject a rule with a note (reviewer token); it is kept, so re-mining does not propose it as new."""
    return handlers.review(service, rule_id, "rejected", token.name, req.note)


@router.post("/v1/mine", response_model=MineOut, tags=["rules"], responses={409: {"model": ErrorOut}})
def mine(service: Svc, _: Writer, req: Annotated[MineIn | None, Body()] = None) -> MineOut:
    """Mine rules from the KB's measured cases and store them as proposed (`remedy mine`); seconds, so
    answered directly. Too few measured cases: 409, saying how many are needed."""
    return handlers.mine(service, req or MineIn())


@router.post("/v1/jobs/verify", response_model=JobOut, status_code=202, tags=["jobs"])
def submit_verify(req: VerifyJobIn, service: Svc, token: Writer) -> JobOut:
    """Queue a verification (treatment vs control fine-tunes); the case is stored when it is done."""
    params = handlers.check_verify(service, req)
    return JobOut(**service.runner.submit("verify", params, _owner(token), _owner_id(token)).as_dict())


@router.post("/v1/jobs/fix", response_model=JobOut, status_code=202, tags=["jobs"])
def submit_fix(req: FixJobIn, service: Svc, token: Writer) -> JobOut:
    """Queue the closed fix loop on an uploaded run; every attempt is stored."""
    params = handlers.check_fix(service, req)
    return JobOut(**service.runner.submit("fix", params, _owner(token), _owner_id(token)).as_dict())


@router.get("/v1/jobs", response_model=list[JobOut], tags=["jobs"])
def list_jobs(
    service: Svc, _: Reader, state: JobState | None = None, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> list[JobOut]:
    """Jobs, newest first."""
    return [JobOut(**j.as_dict()) for j in service.jobs.list(state, limit)]


@router.get("/v1/jobs/{job_id}", response_model=JobOut, tags=["jobs"])
def get_job(job_id: Id, service: Svc, _: Reader) -> JobOut:
    """One job: state, progress, result or error."""
    return JobOut(**service.jobs.get(job_id).as_dict())


@router.post("/v1/jobs/{job_id}/cancel", response_model=JobOut, tags=["jobs"])
def cancel_job(job_id: Id, service: Svc, token: WriterToken) -> JobOut:
    """Cancel a job (its owner's token or an admin's; 403 otherwise): a queued one at once, a running one
    at its next step."""
    return JobOut(**handlers.cancel_job(service, job_id, token).as_dict())


def _owner(token: TokenRecord | None) -> str | None:
    return token.name if token is not None else None


def _owner_id(token: TokenRecord | None) -> str | None:
    return token.token_id if token is not None else None


@router.post("/v1/tokens/{token}/revoke", response_model=TokenOut, tags=["service"])
def revoke_token(token: Id, service: Svc, _: Admin) -> TokenOut:
    """Revoke a token by id or name (admin token): from the next request on it gets 401."""
    return handlers.revoke_token(service, token)
