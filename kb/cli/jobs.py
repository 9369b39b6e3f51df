"""`remedy jobs list|show|cancel`: verify and fix jobs on a running `remedy serve`."""

from __future__ import annotations

from typing import Annotated

import typer

from remedy.cases.errors import ValidationError

from . import remote
from .common import JsonOption, ServerOption

__all__ = ["jobs_list", "jobs_show", "jobs_cancel"]

JobArg = Annotated[str, typer.Argument(help="The job id (see `remedy jobs list`).")]


def _need(server: str | None) -> str:
    if not server:
        raise ValidationError("jobs live on a service: pass --server URL or set REMEDY_SERVER (see `remedy serve`)")
    return server


def jobs_list(
    server: ServerOption = None,
    state: Annotated[str | None, typer.Option("--state", help="queued, running, done, failed or cancelled.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Recent jobs on the service, newest first."""
    remote.jobs_list(_need(server), state, as_json)


def jobs_show(
    job_id: JobArg,
    server: ServerOption = None,
    wait: Annotated[bool, typer.Option("--wait", help="Follow the job until it ends.")] = False,
    as_json: JsonOption = False,
) -> None:
    """One job: state, progress, result or error."""
    remote.jobs_show(_need(server), job_id, as_json, wait)


def jobs_cancel(job_id: JobArg, server: ServerOption = None) -> None:
    """Cancel a job: a queued one at once, a running one at its next step."""
    remote.jobs_cancel(_need(server), job_id)
