"""The FastAPI app around one KnowledgeBase: ``create_app(kb_path, ...)``.

The app is a thin layer: handlers parse, call one facade (or job) function and
return JSON. While it runs the service is the single owner of the KB: it holds
the DuckDB file open (other processes get a lock error that names the service,
read from ``serve.json``), keeps the embedding model loaded, and runs verify and
fix jobs one at a time in a worker thread.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pydantic
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from swagger_ui_bundle import swagger_ui_path

from remedy.cases import errors as E
from remedy.cases.io import format_validation_error
from remedy.cases.store import SERVE_MARKER

from .jobs import JobNotFoundError, JobRunner, JobStore
from .tokens import TokenStore
from .uploads import UploadTooLargeError

if TYPE_CHECKING:
    from remedy.retrieval import Embedder

__all__ = [
    "create_app",
    "Service",
    "ServiceSettings",
    "remedy_version",
    "write_marker",
    "MAX_BODY_BYTES",
    "MAX_UPLOAD_BYTES",
]

#: largest JSON or JSONL request body (imports included)
MAX_BODY_BYTES = 32 * 1024 * 1024
#: largest uploaded run archive, and the most it may unpack to
MAX_UPLOAD_BYTES = 64 * 1024 * 1024
UPLOAD_PATH = "/v1/runs"


def remedy_version() -> str:
    """The installed Remedy version."""
    try:
        return metadata.version("remedy")
    except metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class ServiceSettings:
    """How the service runs: who may read without a token, size limits, where it listens (for the marker)."""

    public_read: bool = False
    max_body_bytes: int = MAX_BODY_BYTES
    max_upload_bytes: int = MAX_UPLOAD_BYTES
    url: str | None = None  # written to serve.json so lock errors elsewhere can name the service
    run_jobs: bool = True  # False: jobs are recorded but no worker runs them (tests drive them by hand)


@dataclass
class Service:
    """What the handlers reach through ``request.app.state.service``."""

    kb: Any  # KnowledgeBase
    tokens: TokenStore
    jobs: JobStore
    runner: JobRunner
    settings: ServiceSettings
    interrupted: list[str] = field(default_factory=list)
    symptoms: Any = None  # the SymptomReader of described failures, built on the first one
    # DuckDB refuses concurrent transactions that touch the same rows: imports take turns.
    write_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def runs_dir(self) -> Path:
        """Where uploaded run directories are unpacked."""
        return self.kb.root / "runs"


def write_marker(kb_root: Path, url: str) -> Path:
    """Write ``serve.json`` (URL and PID of this service) into the KB directory."""
    path = kb_root / SERVE_MARKER
    path.write_text(json.dumps({"url": url, "pid": os.getpid()}))
    return path


def _open_service(kb_path: Path | str | None, settings: ServiceSettings, embedder: Embedder | None) -> Service:
    from remedy.kb.facade import KnowledgeBase

    from .handlers import job_handlers

    kb = KnowledgeBase.open(kb_path, create=True, embedder=embedder)
    runner = JobRunner(JobStore(kb.store), {})
    service = Service(kb, TokenStore(kb.store), runner.jobs, runner, settings)
    runner.handlers.update(job_handlers(service))
    return service


def create_app(
    kb_path: Path | str | None = None,
    *,
    public_read: bool = False,
    url: str | None = None,
    embedder: Embedder | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_upload_bytes: int = MAX_UPLOAD_BYTES,
    run_jobs: bool = True,
) -> FastAPI:
    """The HTTP app over the KB at ``kb_path`` (created if missing); the KB is opened when the app starts.

    ``public_read`` opens the read routes to requests without a token; ``url`` is written to
    the KB's ``serve.json`` while the app runs; ``embedder`` replaces the bundled MiniLM.
    """
    settings = ServiceSettings(public_read, max_body_bytes, max_upload_bytes, url, run_jobs)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service = _open_service(kb_path, settings, embedder)
        # Holding one connection for the whole run makes this process the file's owner: other
        # processes get a lock error (naming us via serve.json) instead of racing our writes.
        hold = service.kb.store.hold()
        marker = write_marker(service.kb.root, url) if url else None
        service.kb.embedder.encode(["warm up"])  # load the model now, not on the first query
        service.interrupted = service.runner.start() if run_jobs else service.jobs.recover()[0]
        app.state.service = service
        try:
            yield
        finally:
            service.runner.stop()
            if marker is not None:
                marker.unlink(missing_ok=True)
            hold.close()
            service.kb.close()

    app = FastAPI(
        title="Remedy",
        version=remedy_version(),
        lifespan=lifespan,
        description="Knowledge base of diagnose-fix-verify cases for trained RL agents. "
        "Send `Authorization: Bearer <token>` (see `remedy tokens create`).",
        docs_url=None,  # served by _install_docs from a package: FastAPI's own page loads from a CDN
        redoc_url=None,  # ReDoc has no self-hosted bundle here; /docs covers the same schema
    )
    app.add_middleware(BodyLimit, max_body=max_body_bytes, max_upload=max_upload_bytes)
    _install_docs(app)
    _install_error_handlers(app)
    from .routes import router

    app.include_router(router)
    return app


# -- API docs ----------------------------------------------------------------------------

#: where the Swagger UI assets of the ``swagger-ui-bundle`` package are served (no CDN: /docs works offline)
DOCS_ASSETS = "/docs-assets"


def _install_docs(app: FastAPI) -> None:
    """``/docs``: Swagger UI with its JS, CSS and icon served by this app from the installed package."""
    app.mount(DOCS_ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} - API docs",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon-32x32.png",
        )


# -- errors ------------------------------------------------------------------------------

_STATUS: list[tuple[type[Exception], int]] = [
    (E.CaseNotFoundError, 404),
    (E.RuleNotFoundError, 404),
    (E.MiningError, 409),
    (JobNotFoundError, 404),
    (UploadTooLargeError, 413),
    (E.KBLockedError, 503),
    (E.LMError, 503),
    (E.ValidationError, 422),
    (E.RunDirError, 422),
    (E.PatchError, 422),
    (E.EnvError, 422),
    (E.AlgorithmError, 422),
    (E.VerificationError, 422),
    (E.SandboxError, 422),
    (E.ScenarioError, 422),
]


def status_of(err: Exception) -> int:
    """The HTTP status for a RemedyError: 404 unknown id, 409 too few cases to mine, 413 too large,
    422 bad input, 503 unavailable, else 400."""
    return next((code for cls, code in _STATUS if isinstance(err, cls)), 400)


def _error(status: int, detail: str, err: str, problems: list[dict[str, Any]] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail, "error": err, "problems": problems or []}, status_code=status)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(E.RemedyError)
    async def remedy_error(request: Request, err: E.RemedyError) -> JSONResponse:
        problems = [{"line": n, "message": m} for n, m in getattr(err, "problems", [])]
        return _error(status_of(err), str(err), type(err).__name__, problems)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        response = _error(err.status_code, str(err.detail), "HTTPError")
        response.headers.update(err.headers or {})
        return response

    @app.exception_handler(pydantic.ValidationError)
    async def model_error(request: Request, err: pydantic.ValidationError) -> JSONResponse:
        return _error(422, format_validation_error(err), "ValidationError")

    @app.exception_handler(RequestValidationError)
    async def request_error(request: Request, err: RequestValidationError) -> JSONResponse:
        parts = []
        for e in err.errors():
            loc = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
            # pydantic prefixes a validator's own message with "Value error, "; the message is what matters
            parts.append(f"{loc}: {e.get('msg', 'invalid').removeprefix('Value error, ')}")
        return _error(422, "; ".join(parts)[:1000], "ValidationError")


# -- body size -------------------------------------------------------------------------------


class _TooLarge(Exception):
    pass


class BodyLimit:
    """Refuse request bodies over the limit with 413 before a handler sees them (uploads have their own limit)."""

    def __init__(self, app: Any, max_body: int, max_upload: int) -> None:
        self.app, self.max_body, self.max_upload = app, max_body, max_upload

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_upload if scope["path"].rstrip("/") == UPLOAD_PATH else self.max_body
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            await _send_413(send, limit)
            return
        seen, started = 0, False

        async def limited_receive() -> dict:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:  # a chunked body without Content-Length
                raise _TooLarge()
            return message

        async def tracking_send(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await _send_413(send, limit)


async def _send_413(send: Any, limit: int) -> None:
    body = json.dumps(
        {
            "detail": f"request body over the limit of {limit:,} bytes; send less (split an import, "
            "leave large logs out of a run archive)",
            "error": "PayloadTooLarge",
            "problems": [],
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
