"""Long work (verify, fix) as jobs: records in the KB's store, run one at a time by a worker thread.

A job is ``queued``, ``running``, then ``done``, ``failed`` or ``cancelled``. Its
record is written at every change, so a restart finds every job: one that was
running when the service died is marked ``failed`` with the reason
``interrupted``, never silently lost; queued ones are queued again.
Cancellation sets a flag that the job's progress callback checks between
steps (a finished fine-tuning job, a stage of the fix loop). A job records who
submitted it (the token's name and id); only that token or an admin may cancel it.
"""

from __future__ import annotations

import builtins
import json
import queue
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from remedy.cases.errors import KBError, RemedyError, ValidationError
from remedy.cases.store import CaseStore

__all__ = [
    "JobState",
    "JobRecord",
    "JobStore",
    "JobRunner",
    "JobCancelled",
    "JobNotFoundError",
    "JobProgress",
    "INTERRUPTED",
]

#: the error of a job that was running when the service stopped
INTERRUPTED = "interrupted: the service stopped while this job ran; submit it again"

_TABLE = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id      VARCHAR PRIMARY KEY,
    kind        VARCHAR NOT NULL,
    state       VARCHAR NOT NULL,
    params      JSON NOT NULL,
    owner       VARCHAR,
    message     VARCHAR,
    done        INTEGER,
    total       INTEGER,
    result      JSON,
    error       VARCHAR,
    cancel      BOOLEAN NOT NULL DEFAULT false,
    created_at  TIMESTAMPTZ NOT NULL,
    started_at  TIMESTAMPTZ,
    finished_at TIMESTAMPTZ
)
"""
#: added after the first release: which token submitted the job (names need not be unique, ids are)
_OWNER_ID = "ALTER TABLE jobs ADD COLUMN IF NOT EXISTS owner_id VARCHAR"
_COLS = (
    "job_id, kind, state, params, owner, message, done, total, result, error, cancel, created_at, started_at, "
    "finished_at, owner_id"
)

#: ``progress(message, done, total)``: what the existing verify and fix callbacks report
JobProgress = Callable[[str, int, int], None]
#: runs one job: ``handler(params, progress) -> JSON-ready result``
Handler = Callable[[dict[str, Any], JobProgress], Any]


class JobState(StrEnum):
    """Where a job is in its life."""

    queued = "queued"
    running = "running"
    done = "done"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def final(self) -> bool:
        """True for done, failed and cancelled."""
        return self in (JobState.done, JobState.failed, JobState.cancelled)


class JobCancelled(BaseException):
    """Raised inside a job's progress callback once cancellation was asked for.

    A BaseException, like KeyboardInterrupt: the fix loop turns any ``Exception`` from a
    candidate into a recorded failure, and a cancellation must stop the loop instead.
    """


@dataclass(frozen=True)
class JobRecord:
    """One job as stored."""

    job_id: str
    kind: str
    state: JobState
    params: dict[str, Any]
    owner: str | None
    message: str
    done: int
    total: int
    result: Any
    error: str | None
    cancel_requested: bool
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    owner_id: str | None = None

    @classmethod
    def from_row(cls, row: tuple) -> JobRecord:
        """A record from a row of ``SELECT {_COLS}``."""
        (
            job_id,
            kind,
            state,
            params,
            owner,
            message,
            done,
            total,
            result,
            error,
            cancel,
            created,
            started,
            finished,
            owner_id,
        ) = row
        return cls(
            job_id,
            kind,
            JobState(state),
            json.loads(params),
            owner,
            message or "",
            done or 0,
            total or 0,
            None if result is None else json.loads(result),
            error,
            bool(cancel),
            created,
            started,
            finished,
            owner_id,
        )

    def owned_by(self, token_id: str, name: str) -> bool:
        """Whether the token ``token_id`` (named ``name``) submitted this job.

        Jobs recorded before token ids were kept match by name.
        """
        return self.owner_id == token_id if self.owner_id is not None else self.owner == name

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: what the HTTP API returns for a job."""
        return {
            "job_id": self.job_id,
            "kind": self.kind,
            "state": self.state.value,
            "params": self.params,
            "owner": self.owner,
            "progress": {"message": self.message, "done": self.done, "total": self.total},
            "result": self.result,
            "error": self.error,
            "cancel_requested": self.cancel_requested,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }


def _now() -> datetime:
    return datetime.now(UTC)


class JobStore:
    """Job records in the KB's store; writes are serialized (DuckDB refuses conflicting concurrent updates)."""

    def __init__(self, store: CaseStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        with store.connection() as con:
            con.execute(_TABLE)
            con.execute(_OWNER_ID)

    def _write(self, sql: str, args: list[Any]) -> None:
        with self._lock, self.store.connection() as con:
            con.execute(sql, args)

    def submit(
        self, kind: str, params: dict[str, Any], owner: str | None = None, owner_id: str | None = None
    ) -> JobRecord:
        """Record a new queued job, submitted by the token named ``owner`` (id ``owner_id``)."""
        job_id = f"job-{_now():%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"
        self._write(
            "INSERT INTO jobs (job_id, kind, state, params, owner, owner_id, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [job_id, kind, JobState.queued.value, json.dumps(params, default=str), owner, owner_id, _now()],
        )
        return self.get(job_id)

    def get(self, job_id: str) -> JobRecord:
        """The job with this id; :class:`JobNotFoundError` if none."""
        with self.store.connection() as con:
            row = con.execute(f"SELECT {_COLS} FROM jobs WHERE job_id = ?", [job_id]).fetchone()
        if row is None:
            raise JobNotFoundError(f"no job {job_id!r}; list jobs with GET /v1/jobs")
        return JobRecord.from_row(row)

    def list(self, state: JobState | None = None, limit: int = 100) -> list[JobRecord]:
        """The newest jobs first, optionally only those in ``state``."""
        where, args = ("WHERE state = ?", [state.value]) if state else ("", [])
        with self.store.connection() as con:
            rows = con.execute(
                f"SELECT {_COLS} FROM jobs {where} ORDER BY created_at DESC, job_id LIMIT ?", [*args, limit]
            ).fetchall()
        return [JobRecord.from_row(r) for r in rows]

    def start(self, job_id: str) -> None:
        """Mark a job running."""
        self._write(
            "UPDATE jobs SET state = ?, started_at = ? WHERE job_id = ?", [JobState.running.value, _now(), job_id]
        )

    def progress(self, job_id: str, message: str, done: int, total: int) -> None:
        """Record how far a running job is."""
        self._write(
            "UPDATE jobs SET message = ?, done = ?, total = ? WHERE job_id = ?", [message[:500], done, total, job_id]
        )

    def finish(self, job_id: str, state: JobState, result: Any = None, error: str | None = None) -> None:
        """Mark a job done, failed or cancelled, with its result or error."""
        body = None if result is None else json.dumps(result, default=str)
        self._write(
            "UPDATE jobs SET state = ?, result = ?, error = ?, finished_at = ? WHERE job_id = ?",
            [state.value, body, error, _now(), job_id],
        )

    def request_cancel(self, job_id: str) -> JobRecord:
        """Ask a job to stop: a queued one is cancelled at once, a running one at its next step."""
        job = self.get(job_id)
        if job.state.final:
            raise ValidationError(f"job {job_id} is already {job.state.value}; nothing to cancel")
        if job.state is JobState.queued:
            self._write(
                "UPDATE jobs SET state = ?, cancel = true, finished_at = ? WHERE job_id = ? AND state = ?",
                [JobState.cancelled.value, _now(), job_id, JobState.queued.value],
            )
        else:
            self._write("UPDATE jobs SET cancel = true WHERE job_id = ?", [job_id])
        return self.get(job_id)

    def cancel_requested(self, job_id: str) -> bool:
        """True once :meth:`request_cancel` was called for this job."""
        with self.store.connection() as con:
            row = con.execute("SELECT cancel FROM jobs WHERE job_id = ?", [job_id]).fetchone()
        return bool(row and row[0])

    def recover(self) -> tuple[builtins.list[str], builtins.list[str]]:
        """After a (re)start: fail jobs left running, return (interrupted ids, queued ids to run again)."""
        running = [j.job_id for j in self.list(JobState.running, limit=1_000_000)]
        for job_id in running:
            self.finish(job_id, JobState.failed, error=INTERRUPTED)
        queued = [j.job_id for j in reversed(self.list(JobState.queued, limit=1_000_000))]
        return running, queued


class JobNotFoundError(KBError):
    """No job with the given id is recorded."""


class JobRunner:
    """Runs queued jobs one at a time in a daemon thread, recording progress, results and failures."""

    def __init__(self, jobs: JobStore, handlers: dict[str, Handler]) -> None:
        self.jobs, self.handlers = jobs, handlers
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def start(self) -> list[str]:
        """Recover records left by the last run, re-queue queued jobs, start the worker; returns interrupted ids."""
        interrupted, queued = self.jobs.recover()
        for job_id in queued:
            self._queue.put(job_id)
        self._thread = threading.Thread(target=self._loop, name="remedy-jobs", daemon=True)
        self._thread.start()
        return interrupted

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the worker to stop after its current job; a job still running stays ``running`` and is
        marked interrupted on the next start."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)
            self._thread = None

    def submit(
        self, kind: str, params: dict[str, Any], owner: str | None = None, owner_id: str | None = None
    ) -> JobRecord:
        """Record a job and queue it."""
        if kind not in self.handlers:
            raise ValidationError(f"unknown job kind {kind!r}; use one of {', '.join(sorted(self.handlers))}")
        job = self.jobs.submit(kind, params, owner, owner_id)
        self._queue.put(job.job_id)
        return job

    def _loop(self) -> None:
        while (job_id := self._queue.get()) is not None:
            self.run_one(job_id)

    def run_one(self, job_id: str) -> JobRecord:
        """Run one queued job now, in this thread (the worker's body; tests call it directly)."""
        job = self.jobs.get(job_id)
        if job.state is not JobState.queued:
            return job  # cancelled while queued
        self.jobs.start(job_id)

        def progress(message: str, done: int = 0, total: int = 0) -> None:
            self.jobs.progress(job_id, message, done, total)
            if self.jobs.cancel_requested(job_id):
                raise JobCancelled(message)

        try:
            result = self.handlers[job.kind](job.params, progress)
        except JobCancelled as stop:
            self.jobs.finish(job_id, JobState.cancelled, error=f"cancelled after: {stop}")
        except RemedyError as err:
            self.jobs.finish(job_id, JobState.failed, error=str(err))
        except Exception as err:
            self.jobs.finish(job_id, JobState.failed, error=f"{type(err).__name__}: {err}")
        else:
            if self.jobs.cancel_requested(job_id):
                self.jobs.finish(job_id, JobState.cancelled, result=result, error="cancelled after its last step")
            else:
                self.jobs.finish(job_id, JobState.done, result=result)
        return self.jobs.get(job_id)
