"""The FastAPI app around one KnowledgeBase: ``create_app(kb_path, ...)``.

The app is a thin layer: handlers parse, call one facade (or job) function and
return JSON. While it runs the service is the single owner of the KB: it holds
the DuckDB file open (other processes get a lock error that names the service,
read from ``serve.json``), keeps the embedding model loaded, and runs verify and
fix jobs one at a time in a worker thread.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path

import fastapi_offline
import pydantic
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from remedy.cases import errors as E
from remedy.cases.evidence.rundir import RunDir
from remedy.cases.io import format_validation_error
from remedy.cases.store import SERVE_MARKER
from remedy.kb.facade import KnowledgeBase
from remedy.retrieval.batching import BatchingEmbedder, keep_freed_memory
from remedy.retrieval.embedder import Embedder, default_embedder
from remedy.retrieval.light_embedder import LightMiniLMEmbedder

from .handlers import job_handlers
from .jobs import JobNotFoundError, JobRunner, JobStore
from .models import ErrorOut, ImportProblem, RequestBodyError
from .routes import router
from .service import (
    MAX_BODY_BYTES,
    MAX_REQUEST_BYTES,
    MAX_UPLOAD_BYTES,
    UPLOAD_QUOTA_BYTES,
    UPLOAD_TTL_HOURS,
    Service,
    ServiceSettings,
    remedy_version,
)
from .tokens import TokenStore
from .uploads import UploadTooLargeError

__all__ = [
    "create_app",
    "Service",
    "ServiceSettings",
    "remedy_version",
    "write_marker",
    "MAX_BODY_BYTES",
    "MAX_REQUEST_BYTES",
    "MAX_UPLOAD_BYTES",
    "UPLOAD_QUOTA_BYTES",
    "UPLOAD_TTL_HOURS",
]

log = logging.getLogger(__name__)
UPLOAD_PATH = "/v1/runs"
IMPORT_PATH = "/v1/cases/import"
#: longest error message sent back (a message never echoes a whole hostile input)
MAX_DETAIL_CHARS = 2_000


class _Sweeper:
    """Calls ``sweep`` every ``seconds`` in a daemon thread until stopped (uploads' expiry)."""

    def __init__(self, sweep: Callable[[], object], seconds: float) -> None:
        self._stop = threading.Event()
        self._sweep, self._seconds = sweep, seconds
        self._thread = threading.Thread(target=self._loop, name="remedy-uploads-expiry", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._seconds):
            try:
                self._sweep()
            except Exception:  # a failed sweep (a file in use, a full disk) is tried again next time
                log.warning("expiring old uploads failed; will retry", exc_info=True)

    def stop(self) -> None:
        """Stop sweeping (waits for a sweep under way)."""
        self._stop.set()
        self._thread.join(timeout=10)


def _preload() -> None:
    """Load the shipped CartPole checkpoint once at start-up, as a job or a run diagnosis would.

    Loading a first checkpoint imports SB3, gymnasium and torch's lazy parts (dynamo, sympy):
    800 modules, seconds of module initialisation that hold the GIL in long stretches. Done by
    the first job while the service answers requests, it stalled /health for over a second.
    """
    shipped = resources.files("remedy.cases") / "scenarios" / "checkpoints" / "cartpole_undertrained"
    try:
        RunDir.load(Path(str(shipped))).load_model()
    except Exception:  # a warm-up only: the first job pays instead
        log.warning("warming up the checkpoint loader failed", exc_info=True)


def write_marker(kb_root: Path, url: str) -> Path:
    """Write ``serve.json`` (URL and PID of this service) into the KB directory."""
    path = kb_root / SERVE_MARKER
    path.write_text(json.dumps({"url": url, "pid": os.getpid()}))
    return path


def _open_service(kb_path: Path | str | None, settings: ServiceSettings, embedder: Embedder | None) -> Service:
    # Queries arrive on worker threads; concurrent ones share one encoder call.
    inner = embedder if embedder is not None else default_embedder("onnx")  # twice numpy's speed, once loaded
    if isinstance(inner, LightMiniLMEmbedder):
        inner.use_all_cores()  # the service owns its cores: every query encodes on all of them
    shared = BatchingEmbedder(inner)
    kb = KnowledgeBase.open(kb_path, create=True, embedder=shared)
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
    max_request_bytes: int = MAX_REQUEST_BYTES,
    upload_quota_bytes: int | None = UPLOAD_QUOTA_BYTES,
    upload_ttl_hours: float | None = UPLOAD_TTL_HOURS,
) -> FastAPI:
    """The HTTP app over the KB at ``kb_path`` (created if missing); the KB is opened when the app starts.

    ``public_read`` opens the read routes to requests without a token; ``url`` is written to
    the KB's ``serve.json`` while the app runs; ``embedder`` replaces the bundled MiniLM.
    Size limits: ``max_body_bytes`` for imports, ``max_upload_bytes`` for a run archive (and
    what it unpacks to), ``max_request_bytes`` for every other body; ``upload_quota_bytes`` of
    stored uploads per token and ``upload_ttl_hours`` before an upload is removed (``None``: no
    quota, kept forever).
    """
    settings = ServiceSettings(
        public_read,
        max_body_bytes,
        max_upload_bytes,
        url,
        run_jobs,
        max_request_bytes=max_request_bytes,
        upload_quota_bytes=upload_quota_bytes,
        upload_ttl_hours=upload_ttl_hours,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service = _open_service(kb_path, settings, embedder)
        # Holding one connection for the whole run makes this process the file's owner: other
        # processes get a lock error (naming us via serve.json) instead of racing our writes.
        hold = service.kb.store.hold()
        marker = write_marker(service.kb.root, url) if url else None
        service.kb.embedder.encode(["warm up"])  # load the model now, not on the first query
        service.kb.hold_in_memory()  # searches from memory (retrieval/resident.py), loaded now
        keep_freed_memory()  # batches of queries reuse their buffers instead of faulting pages in again
        if run_jobs:
            _preload()
        service.interrupted = service.runner.start() if run_jobs else service.jobs.recover()[0]
        service.expire_uploads()
        sweeper = _Sweeper(service.expire_uploads, settings.sweep_seconds)
        app.state.service = service
        try:
            yield
        finally:
            sweeper.stop()
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
        redoc_url=None,  # likewise /redoc
    )
    app.add_middleware(BodyLimit, max_body=max_body_bytes, max_upload=max_upload_bytes, max_request=max_request_bytes)
    _install_docs(app)
    _install_error_handlers(app)
    app.include_router(router)
    return app


# -- API docs ----------------------------------------------------------------------------

#: where the Swagger UI and ReDoc assets are served from (no CDN: /docs and /redoc work offline)
DOCS_ASSETS = "/docs-assets"
#: the assets' folder in the ``fastapi-offline`` package (Swagger UI 5, which reads OpenAPI 3.1, and ReDoc)
_ASSETS_DIR = Path(fastapi_offline.__file__).parent / "static"


def _install_docs(app: FastAPI) -> None:
    """``/docs`` (Swagger UI) and ``/redoc`` with their JS, CSS and icon served by this app from a package."""
    app.mount(DOCS_ASSETS, StaticFiles(directory=str(_ASSETS_DIR)), name="docs-assets")
    schema = app.openapi_url or "/openapi.json"
    icon = f"{DOCS_ASSETS}/favicon.png"

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=schema,
            title=f"{app.title} - API docs",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=icon,
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=schema,
            title=f"{app.title} - API docs",
            redoc_js_url=f"{DOCS_ASSETS}/redoc.standalone.js",
            redoc_favicon_url=icon,
            with_google_fonts=False,  # fonts from Google are a CDN too
        )


# -- errors ------------------------------------------------------------------------------

_STATUS: list[tuple[type[Exception], int]] = [
    (E.CaseNotFoundError, 404),
    (E.RuleNotFoundError, 404),
    (E.MiningError, 409),
    (JobNotFoundError, 404),
    (UploadTooLargeError, 413),
    (RequestBodyError, 400),
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
    400 a body that is not usable JSON, 422 bad input, 503 unavailable, else 400."""
    return next((code for cls, code in _STATUS if isinstance(err, cls)), 400)


#: most per-record problems sent back with an error
MAX_PROBLEMS = 100


def _cut(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit:,} more characters)"


def _error(status: int, detail: str, err: str, problems: Sequence[tuple[int, str]] = ()) -> JSONResponse:
    """An error body: the message and problems cut to size (a message may quote a hostile input)."""
    shown = [ImportProblem(line=n, message=_cut(str(m), 500)) for n, m in problems[:MAX_PROBLEMS]]
    return JSONResponse(ErrorOut(detail=_cut(detail), error=err, problems=shown).model_dump(), status_code=status)


#: why FastAPI could not parse a JSON body, by the exception it chained (it says only "error parsing the body")
_PARSE_ERRORS: list[tuple[type[BaseException], str]] = [
    (RecursionError, "the JSON body is nested too deeply; send flat JSON (as `--json` output is)"),
    (UnicodeError, "the body is not valid UTF-8 text; send JSON encoded as UTF-8"),
]


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(E.RemedyError)
    async def remedy_error(request: Request, err: E.RemedyError) -> JSONResponse:
        return _error(status_of(err), str(err), type(err).__name__, list(getattr(err, "problems", [])))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        cause = err.__cause__
        if isinstance(cause, _TooLarge):  # a streamed JSON body cut off at its limit
            return JSONResponse(_too_large(cause.limit), status_code=413)
        if err.status_code == 400 and cause is not None:
            detail = next((msg for cls, msg in _PARSE_ERRORS if isinstance(cause, cls)), None)
            if detail is not None:
                return _error(400, detail, RequestBodyError.__name__)
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
        return _error(422, _cut("; ".join(parts), 1000), "ValidationError")


# -- body size -------------------------------------------------------------------------------


class _TooLarge(Exception):
    """A streamed body passed its limit (FastAPI may wrap it in a 400; the handler turns that into 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body over the limit of {limit:,} bytes")
        self.limit = limit


class BodyLimit:
    """Refuse request bodies over the limit with 413 before a handler sees them.

    Each route has its limit: a run upload ``max_upload``, an import ``max_body``, every
    other request ``max_request``; both a declared Content-Length and a streamed
    (chunked) body are counted, so nothing past the limit is ever buffered.
    """

    def __init__(self, app: ASGIApp, max_body: int, max_upload: int, max_request: int = MAX_REQUEST_BYTES) -> None:
        self.app, self.max_body, self.max_upload, self.max_request = app, max_body, max_upload, max_request

    def limit_for(self, path: str) -> int:
        """The body limit of the route at ``path``."""
        path = path.rstrip("/")
        return {UPLOAD_PATH: self.max_upload, IMPORT_PATH: self.max_body}.get(path, self.max_request)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            await _send_413(send, limit)
            return
        seen, started = 0, False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:  # a chunked body without Content-Length, or one longer than it said
                raise _TooLarge(limit)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await _send_413(send, limit)


def _too_large(limit: int) -> dict[str, object]:
    detail = (
        f"request body over the limit of {limit:,} bytes; send less (split an import, leave large logs out of a run "
        "archive)"
    )
    return ErrorOut(detail=detail, error="PayloadTooLarge").model_dump()


async def _send_413(send: Send, limit: int) -> None:
    body = json.dumps(_too_large(limit)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
