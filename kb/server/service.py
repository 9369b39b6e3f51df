"""The service's state: one KnowledgeBase, its tokens, jobs and uploads, and how it runs.

Kept apart from :mod:`.app` (which builds the FastAPI app and includes the routes) so
that the routes and handlers reach the service without importing the app.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from .jobs import JobRunner, JobState, JobStore
from .tokens import TokenStore
from .uploads import UploadShelf

if TYPE_CHECKING:
    from remedy.kb.facade import KnowledgeBase
    from remedy.retrieval.describe import SymptomReader

__all__ = [
    "Service",
    "ServiceSettings",
    "remedy_version",
    "MAX_BODY_BYTES",
    "MAX_REQUEST_BYTES",
    "MAX_UPLOAD_BYTES",
    "UPLOAD_QUOTA_BYTES",
    "UPLOAD_TTL_HOURS",
]

#: largest import body (JSONL or a JSON array of cases)
MAX_BODY_BYTES = 32 * 1024 * 1024
#: largest body of every other JSON request (a query, a signature, a job): far above any real one
MAX_REQUEST_BYTES = 1024 * 1024
#: largest uploaded run archive, and the most it may unpack to
MAX_UPLOAD_BYTES = 64 * 1024 * 1024
#: unpacked bytes of uploads one token may keep stored
UPLOAD_QUOTA_BYTES = 1024 * 1024 * 1024
#: uploads older than this are removed (at start-up and then every hour)
UPLOAD_TTL_HOURS = 72.0


@functools.cache
def remedy_version() -> str:
    """The installed Remedy version (read once: /health answers it on every poll)."""
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
    max_request_bytes: int = MAX_REQUEST_BYTES
    upload_quota_bytes: int | None = UPLOAD_QUOTA_BYTES  # None: no quota
    upload_ttl_hours: float | None = UPLOAD_TTL_HOURS  # None: uploads are kept
    sweep_seconds: float = 3600.0  # how often expired uploads are looked for


@dataclass
class Service:
    """What the handlers reach through ``request.app.state.service``."""

    kb: KnowledgeBase
    tokens: TokenStore
    jobs: JobStore
    runner: JobRunner
    settings: ServiceSettings
    interrupted: list[str] = field(default_factory=list)
    symptoms: SymptomReader | None = None  # reads described failures; built on the first one
    # DuckDB refuses concurrent transactions that touch the same rows: imports take turns.
    write_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def runs_dir(self) -> Path:
        """Where uploaded run directories are unpacked."""
        return self.kb.root / "runs"

    @property
    def uploads(self) -> UploadShelf:
        """The uploaded runs, with the per-token quota and the expiry of these settings."""
        if self._uploads is None:
            ttl = self.settings.upload_ttl_hours
            self._uploads = UploadShelf(
                self.runs_dir,
                self.settings.max_upload_bytes,
                self.settings.upload_quota_bytes,
                None if ttl is None else ttl * 3600,
            )
        return self._uploads

    def expire_uploads(self) -> list[str]:
        """Remove uploads past their time to live, except those of queued or running jobs."""
        active = [j for s in (JobState.queued, JobState.running) for j in self.jobs.list(s, limit=100_000)]
        return self.uploads.expire(keep={str(j.params.get("run_id")) for j in active})

    _uploads: UploadShelf | None = None
