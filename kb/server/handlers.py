"""What the routes and jobs call: one function per operation over the service's KB.

Kept apart from the routes so they stay a few lines each, and so the job
bodies (verify, fix) can be run and tested without HTTP.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pydantic_core
from fastapi import HTTPException

from remedy.cases.errors import ImportFileError, ValidationError
from remedy.cases.evidence.rundir import RunDir
from remedy.cases.io import case_to_json
from remedy.cases.model import Case
from remedy.cases.patches.spec import Patch
from remedy.kb.diagnose import diagnose_description, diagnose_run, diagnose_signature
from remedy.kb.fixloop import fix
from remedy.kb.verify import verify
from remedy.retrieval.describe import SymptomReader
from remedy.retrieval.diagnosis import Diagnoser, get_diagnoser, preflight

from .jobs import Handler, JobProgress, JobRecord
from .models import (
    DiagnoseIn,
    FixJobIn,
    Hit,
    ImportOut,
    ImportProblem,
    MineIn,
    MineOut,
    RequestBodyError,
    VerifyJobIn,
)
from .tokens import Role, TokenOut, TokenRecord
from .uploads import run_path

if TYPE_CHECKING:
    from remedy.kb.facade import SimilarCase
    from remedy.miners import Rule

    from .service import Service

__all__ = [
    "hits_out",
    "import_body",
    "diagnose",
    "job_handlers",
    "check_verify",
    "check_fix",
    "to_json_bytes",
    "review",
    "mine",
    "cancel_job",
    "revoke_token",
]


def to_json_bytes(data: Any) -> bytes:
    """JSON that survives NaN and inf (written as strings, as case files do)."""
    return pydantic_core.to_json(data, inf_nan_mode="strings")


def hits_out(hits: list[SimilarCase], full: bool) -> list[Hit]:
    """The API shape of similar cases (``remedy query --json``), with each full case when asked for."""
    out = []
    for h in hits:
        case = json.loads(case_to_json(h.case)) if full else None
        out.append(Hit(**h.as_dict(), case=case))
    return out


def _as_jsonl(body: bytes) -> bytes:
    """A JSON array body becomes JSONL (one record per line, numbered from 1); JSONL passes through."""
    text = body.lstrip()
    if not text.startswith(b"["):
        return body
    try:
        records = json.loads(body)
    except RecursionError:
        raise RequestBodyError("the JSON body is nested too deeply; send flat case records") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ImportFileError(
            f"the body starts like a JSON array but is not valid JSON ({err}); send a JSON array of cases or JSONL",
            [(0, str(err)[:240])],
        ) from None
    return b"\n".join(json.dumps(r, allow_nan=True).encode() for r in records) + b"\n"


#: a JSON escape of a UTF-16 surrogate (paired ones are how ``ensure_ascii`` JSON writes an emoji)
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _check_text(jsonl: bytes) -> None:
    """Refuse a body that is not UTF-8, or whose records hold lone surrogates (no store can write them)."""
    try:
        jsonl.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RequestBodyError(
            f"the body is not valid UTF-8 (byte {err.start:,}); send JSON or JSONL encoded as UTF-8"
        ) from None
    if not _SURROGATE.search(jsonl):
        return
    for n, line in enumerate(jsonl.splitlines(), start=1):
        if not _SURROGATE.search(line):
            continue
        try:
            json.dumps(json.loads(line), ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise RequestBodyError(
                f"record {n} holds text with a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape); "
                "fix that record's text encoding"
            ) from None
        except (ValueError, RecursionError):
            continue  # not valid JSON: the import reports it as an invalid record


def import_body(service: Service, body: bytes, skip_invalid: bool, mark_imported: bool = False) -> ImportOut:
    """Import the cases in a JSONL or JSON-array body: all or nothing unless ``skip_invalid``; ``mark_imported``
    files measured cases as another team's (as `remedy kb import --mark-imported`)."""
    if not body.strip():
        raise ValidationError("the body is empty; send cases as JSONL (one object per line) or a JSON array")
    with tempfile.TemporaryDirectory(prefix="remedy-import-") as tmp:
        path = Path(tmp) / "body.jsonl"
        jsonl = _as_jsonl(body)
        _check_text(jsonl)
        path.write_bytes(jsonl)
        try:
            with service.write_lock:
                report = service.kb.import_file(path, skip_invalid=skip_invalid, mark_imported=mark_imported)
        except ImportFileError as err:
            msg = str(err).replace(str(path), "request body").replace("--skip-invalid", "skip_invalid=true")
            raise ImportFileError(msg, err.problems) from None
    problems = [ImportProblem(line=n, message=m) for n, m in report.problems]
    return ImportOut(
        read=report.read, added=report.added, unchanged=report.unchanged, skipped=report.skipped, problems=problems
    )


def _backend(name: str) -> Diagnoser:
    backend = get_diagnoser(name)
    preflight(backend)  # an LM backend raises LMError now when the service has no REMEDY_LM
    return backend


#: the fields of a description, refused with a run or a signature (a run states its own subject)
_DESCRIBE_ONLY = ("env", "algo", "action_space", "tags")


def _check_source(req: DiagnoseIn) -> None:
    """Exactly one thing to diagnose (a run, a signature, a description); the description's fields only with it."""
    given = [
        name
        for name, there in (
            ("run_id", req.run_id is not None),
            ("subject/signature", req.subject is not None or req.signature is not None),
            ("describe", req.describe is not None),
        )
        if there
    ]
    if len(given) != 1:
        raise ValidationError(
            "send exactly one of: run_id (an uploaded run, POST /v1/runs), subject and signature, "
            "or describe (the failure in words)" + (f"; got {' and '.join(given)}" if given else "")
        )
    stray = [name for name in _DESCRIBE_ONLY if getattr(req, name) is not None]
    if req.describe is None and stray:
        raise ValidationError(
            f"{', '.join(stray)} only apply with describe; a run or a subject states its own env, "
            "algorithm and action space"
        )


def _symptom_reader(service: Service) -> SymptomReader:
    """The service's one SymptomReader (its phrase table is embedded once, with the KB's embedder)."""
    if service.symptoms is None:
        service.symptoms = SymptomReader(service.kb.embedder)
    return service.symptoms


def diagnose(service: Service, req: DiagnoseIn) -> bytes:
    """A DiagnosisReport as JSON, for an uploaded run, a subject and signature, or a description."""
    _check_source(req)
    backend = _backend(req.diagnoser)
    if req.run_id is not None:
        report = diagnose_run(
            service.kb,
            run_path(service.runs_dir, req.run_id),
            diagnoser=backend,
            k=req.k,
            n_episodes=req.episodes,
            seed=req.seed,
        )
    elif req.describe is not None:
        report = diagnose_description(
            service.kb,
            req.describe,
            env_id=req.env,
            algo=req.algo,
            action_space=req.action_space,
            tags=req.tags,
            diagnoser=backend,
            k=req.k,
            reader=_symptom_reader(service),
        )
    elif req.subject is not None and req.signature is not None:
        report = diagnose_signature(service.kb, req.subject, req.signature, diagnoser=backend, k=req.k)
    else:
        raise ValidationError("send both subject and signature (`remedy signature RUN --json` prints a signature)")
    return to_json_bytes(report.model_dump(mode="python"))


# -- rules ------------------------------------------------------------------------------------


def review(service: Service, rule_id: str, decision: str, reviewer: str, note: str) -> Rule:
    """Record a review by ``reviewer`` (the caller's token name); reviews and mining take turns."""
    with service.write_lock:
        return service.kb.review(rule_id, decision, reviewer, note)


def mine(service: Service, req: MineIn) -> MineOut:
    """Mine the KB's cases and store the rules (the shape of `remedy mine --json`)."""
    with service.write_lock:
        return MineOut(**service.kb.mine(**req.model_dump()).model_dump())


# -- jobs -------------------------------------------------------------------------------------


def check_verify(service: Service, req: VerifyJobIn) -> dict[str, Any]:
    """Refuse a verify job that could never run (unknown run, bad patch, bad settings, no budget) before queueing it."""
    run = RunDir.load(run_path(service.runs_dir, req.run_id))
    Patch.from_data(req.patch)
    req.config().budget_for(run.config.train_steps)
    return req.model_dump()


def check_fix(service: Service, req: FixJobIn) -> dict[str, Any]:
    """Refuse a fix job that could never run before queueing it."""
    run = RunDir.load(run_path(service.runs_dir, req.run_id))
    _backend(req.diagnoser)
    req.race_settings()
    req.config().budget_for(run.config.train_steps)
    return req.model_dump()


def _store(service: Service) -> Callable[[Case], bool]:
    """Stores one case in the service's KB, taking turns with imports and reviews."""

    def add(case: Case) -> bool:
        with service.write_lock:
            return service.kb.add(case)

    return add


def _run_verify(service: Service, params: dict[str, Any], progress: JobProgress) -> dict[str, Any]:
    """`remedy verify`'s library call (screen, confirm, store) with the request's settings; its ``--json`` shape."""
    req = VerifyJobIn.model_validate(params)
    outcome = verify(
        run_path(service.runs_dir, req.run_id),
        Patch.from_data(req.patch),
        req,
        store=_store(service),
        control_cache=service.kb.root / "controls",
        progress=progress,
    )
    return json.loads(to_json_bytes(outcome.as_dict()))


def fixes_dir(service: Service, out: str | None) -> Path:
    """Where a fix job writes its winning patch and fixed agent: ``<kb>/fixes/<out>`` (``out`` is a checked
    relative folder name, :class:`FixJobIn`)."""
    root = (service.kb.root / "fixes").resolve()
    target = (root / out).resolve() if out else root
    if not target.is_relative_to(root):
        raise ValidationError("out must name a folder under the service's <kb>/fixes/")
    return target


def _run_fix(service: Service, params: dict[str, Any], progress: JobProgress) -> dict[str, Any]:
    """The fix loop with the request's settings (every option of `remedy fix`); its ``--json`` shape."""
    req = FixJobIn.model_validate(params)
    result = fix(
        service.kb,
        run_path(service.runs_dir, req.run_id),
        store=service.kb,
        diagnoser=_backend(req.diagnoser),
        out_dir=fixes_dir(service, req.out),
        progress=progress,
        **req.loop_kwargs(),
    )
    return json.loads(to_json_bytes(result.as_dict()))


def job_handlers(service: Service) -> dict[str, Handler]:
    """The job kinds this service runs: ``verify`` and ``fix``."""
    return {
        "verify": lambda params, progress: _run_verify(service, params, progress),
        "fix": lambda params, progress: _run_fix(service, params, progress),
    }


def cancel_job(service: Service, job_id: str, token: TokenRecord) -> JobRecord:
    """Cancel a job for ``token``: its owner or an admin may; anyone else gets 403 and nothing changes."""
    job = service.jobs.get(job_id)
    if not (token.role is Role.admin or job.owned_by(token.token_id, token.name)):
        raise HTTPException(403, f"job {job_id} belongs to {job.owner!r}; only its owner or an admin may cancel it")
    return service.jobs.request_cancel(job_id)


def revoke_token(service: Service, id_or_name: str) -> TokenOut:
    """Revoke a token by id or name; it gets 401 from the next request on."""
    return TokenOut.of(service.tokens.revoke(id_or_name))
