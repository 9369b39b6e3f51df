"""`remedy jobs list|show|cancel`, and `remedy verify` / `remedy fix` as jobs on a running `remedy serve`.

A verify or fix with ``--server`` uploads the run, queues the job with the command's settings
(the same typed settings the local library call takes), follows it and prints its result as
the local command prints its own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from remedy.cases.errors import ServiceError, ValidationError
from remedy.kb.settings import FixSettings, VerifySettings, settings_from

from . import connect
from .common import JsonOption, ServerOption, console, print_json, progress_bar
from .render import render_fix_job, render_job, render_outcome

if TYPE_CHECKING:
    from remedy.kb.client import RemedyClient
    from remedy.kb.server.models import JobOut

__all__ = ["jobs_list", "jobs_show", "jobs_cancel", "verify_job", "fix_job"]

JobArg = Annotated[str, typer.Argument(help="The job id (see `remedy jobs list`).")]


def _need(server: str | None) -> str:
    if not server:
        raise ValidationError("jobs live on a service: pass --server URL or set REMEDY_SERVER (see `remedy serve`)")
    return server


def _print(job: JobOut, as_json: bool) -> None:
    if as_json:
        print_json(job.model_dump(mode="json"))
    else:
        render_job(job)


def jobs_list(
    server: ServerOption = None,
    state: Annotated[str | None, typer.Option("--state", help="queued, running, done, failed or cancelled.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Recent jobs on the service, newest first."""
    with connect.client(_need(server)) as remote:
        jobs = remote.jobs(state)
    if as_json:
        print_json([job.model_dump(mode="json") for job in jobs])
        return
    for job in jobs:
        render_job(job)
    if not jobs:
        console.print("No jobs.")


def jobs_show(
    job_id: JobArg,
    server: ServerOption = None,
    wait: Annotated[bool, typer.Option("--wait", help="Follow the job until it ends.")] = False,
    as_json: JsonOption = False,
) -> None:
    """One job: state, progress, result or error."""
    with connect.client(_need(server)) as remote:
        job = remote.job(job_id)
        job = _follow(remote, job, as_json) if wait else job
    _print(job, as_json)


def jobs_cancel(job_id: JobArg, server: ServerOption = None) -> None:
    """Cancel a job: a queued one at once, a running one at its next step."""
    with connect.client(_need(server)) as remote:
        render_job(remote.cancel(job_id))


def _follow(remote: RemedyClient, job: JobOut, quiet: bool) -> JobOut:
    """Wait for a job, showing its progress on stderr; Ctrl-C leaves it running on the service."""
    with progress_bar(disable=quiet) as bar:
        task = bar.add_task(f"{job.job_id} queued", total=None)

        def show(j: JobOut) -> None:
            p = j.progress
            message = f"{j.job_id} {j.state}: {p.message[:80]}"
            bar.update(task, description=message, completed=p.done, total=p.total or None)

        return remote.wait(job.job_id, progress=show)


def _result(job: JobOut) -> dict:
    """The result of a finished job; a failed or cancelled one is one error line."""
    if job.state != "done":
        raise ServiceError(f"job {job.job_id} {job.state}: {job.error}")
    return job.result


def verify_job(
    server: str, run_dir: Path, patch_file: Path, as_json: bool, wait: bool, settings: VerifySettings
) -> None:
    """`remedy verify` as a job on the service: upload the run, queue it with the same settings, follow, and
    print the outcome as a local run prints it (the service screens and confirms with the same library call)."""
    from remedy.cases.patches.io import load_patch  # the patch models (numpy): only when a patch is read
    from remedy.kb.server.models import VerifyJobIn

    patch = json.loads(load_patch(patch_file).model_dump_json())  # checked here: a bad file fails before upload
    with connect.client(server) as remote:
        run_id = remote.upload_run(run_dir).run_id
        job = remote.submit(settings_from(VerifyJobIn, **settings.model_dump(), run_id=run_id, patch=patch))
        if not wait:
            return _print(job, as_json)
        result = _result(_follow(remote, job, as_json))
    if as_json:
        print_json(result)
        return
    render_outcome(result, f"{server} (job {job.job_id})")


def fix_job(server: str, run_dir: Path, as_json: bool, wait: bool, settings: FixSettings) -> None:
    """`remedy fix` as a job on the service with every option of the local loop; prints the loop's result (its
    JSON shape) and where the service wrote the winning patch and the fixed agent."""
    from remedy.kb.server.models import FixJobIn

    settings_from(FixJobIn, **settings.model_dump(), run_id="not-uploaded-yet")  # a bad --out fails before upload
    with connect.client(server) as remote:
        run_id = remote.upload_run(run_dir).run_id
        job = remote.submit(settings_from(FixJobIn, **settings.model_dump(), run_id=run_id))
        if not wait:
            return _print(job, as_json)
        result = _result(_follow(remote, job, as_json))
    if as_json:
        print_json(result)
        return
    render_fix_job(result, job.job_id)
