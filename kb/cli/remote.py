"""The read and write commands through a running `remedy serve` (``--server URL`` or ``$REMEDY_SERVER``).

Each function mirrors a command of :mod:`.kb`: it calls the service with
``$REMEDY_TOKEN`` and renders the answer with the same table or JSON shape, so
output does not depend on where the KB lives. The rule and diagnosis functions
return what the local path computes (rules, the mining JSON, a report), and
their commands render it as they render a local result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from .common import console, print_json, shown
from .render import render_case, render_outcome, render_similar, stats_table

if TYPE_CHECKING:
    from remedy.kb.settings import FixSettings, VerifySettings
    from remedy.miners import Rule
    from remedy.retrieval.diagnosis import DiagnosisReport

__all__ = [
    "query",
    "similar",
    "case_show",
    "kb_stats",
    "kb_import",
    "kb_export",
    "verify",
    "fix",
    "jobs_list",
    "jobs_show",
    "jobs_cancel",
    "rules_list",
    "rule_show",
    "rule_review",
    "mine",
    "diagnose",
]

_err = Console(stderr=True)


def _client(server: str):
    from remedy.kb.client import RemedyClient

    return RemedyClient(server)


def _render_hits(hits: list[dict[str, Any]], title: str) -> None:
    from remedy.cases.model import Case
    from remedy.kb.facade import SimilarCase

    found = [SimilarCase(Case.model_validate(h["case"]), h["similarity"], h["rank"]) for h in hits]
    console.print(render_similar(found, title=title))


def query(server: str, text: str, as_json: bool, **filters: Any) -> None:
    """`remedy query` through the service."""
    with _client(server) as client:
        hits = client.query(text, full=not as_json, **filters)
    if as_json:
        print_json([{k: v for k, v in h.items() if k != "case"} for h in hits])
    elif not hits:
        console.print("No similar cases (try fewer filters, or import cases into the served KB).", soft_wrap=True)
    else:
        _render_hits(hits, f"cases similar to {text!r}")


def similar(server: str, signature: Any, run_dir: Path, as_json: bool, **filters: Any) -> None:
    """`remedy similar` through the service: the signature is computed here, the search runs there."""
    with _client(server) as client:
        hits = client.similar(json.loads(signature.model_dump_json()), full=not as_json, **filters)
    if as_json:
        print_json(
            {
                "signature": signature.model_dump(mode="json"),
                "similar": [{k: v for k, v in h.items() if k != "case"} for h in hits],
            }
        )
        return
    console.print(f"[bold]signature:[/] {shown(signature.summary)}", soft_wrap=True)
    if hits:
        _render_hits(hits, f"cases similar to {shown(run_dir)}")
    else:
        console.print("No similar cases.")


def case_show(server: str, case_id: str, as_json: bool) -> None:
    """`remedy case show` through the service."""
    from remedy.cases.model import Case

    with _client(server) as client:
        data = client.case(case_id)
    if as_json:
        print_json(data)
        return
    console.print(render_case(Case.model_validate(data)))


def kb_stats(server: str, as_json: bool) -> None:
    """`remedy kb stats` through the service."""
    from remedy.cases.store import StoreStats
    from remedy.kb.facade import KBStats

    with _client(server) as client:
        data = client.stats()
    if as_json:
        print_json(data)
        return
    stats = KBStats(**{**data, "path": Path(data["path"]), "store": StoreStats(**data["store"])})
    console.print(stats_table(stats))


def kb_import(server: str, file: Path, skip_invalid: bool) -> None:
    """`remedy kb import` through the service (Parquet files are read here and sent as JSONL)."""
    with _client(server) as client:
        report = client.import_jsonl(_jsonl_bytes(file, skip_invalid), skip_invalid=skip_invalid)
    for p in report["problems"]:
        _err.print(f"[yellow]skipped line {p['line']}:[/] {shown(p['message'])}", highlight=False, soft_wrap=True)
    console.print(
        f"Imported {file} into {server}: {report['added']} added, {report['unchanged']} unchanged, "
        f"{report['skipped']} skipped.",
        soft_wrap=True,
    )


def _jsonl_bytes(file: Path, skip_invalid: bool) -> bytes:
    from remedy.cases.errors import ImportFileError
    from remedy.cases.io import case_to_json, read_cases

    if file.suffix.lower() == ".jsonl":
        if not file.is_file():
            raise ImportFileError(f"{file}: no such file", [(0, "no such file")])
        return file.read_bytes()
    cases, _ = read_cases(file, skip_invalid=skip_invalid)  # Parquet: validated here, sent as JSONL
    return "".join(case_to_json(c) + "\n" for c in cases).encode()


def kb_export(server: str, file: Path) -> None:
    """`remedy kb export` through the service, to JSONL or Parquet by extension."""
    from remedy.cases.io import case_from_json, write_cases

    with _client(server) as client:
        lines = list(client.export_lines())
    n = write_cases(file, (case_from_json(line) for line in lines))
    console.print(f"Exported {n} cases from {server} to {file}.", soft_wrap=True)


# -- jobs ---------------------------------------------------------------------------------------


def _follow(client: Any, job: dict[str, Any], quiet: bool) -> dict[str, Any]:
    """Wait for a job, showing its progress on stderr; Ctrl-C leaves it running on the service."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=_err, transient=True, disable=quiet) as bar:
        task = bar.add_task(f"{job['job_id']} queued", total=None)

        def show(j: dict[str, Any]) -> None:
            p = j["progress"]
            bar.update(
                task,
                description=f"{j['job_id']} {j['state']}: {p['message'][:80]}",
                completed=p["done"],
                total=p["total"] or None,
            )

        return client.wait(job["job_id"], progress=show)


def _finish(job: dict[str, Any]) -> dict[str, Any]:
    from remedy.kb.client import ServiceError

    if job["state"] != "done":
        raise ServiceError(f"job {job['job_id']} {job['state']}: {job['error']}")
    return job["result"]


def verify(server: str, run_dir: Path, patch_file: Path, as_json: bool, wait: bool, settings: VerifySettings) -> None:
    """`remedy verify` as a job on the service: upload the run, queue it with the same settings, follow, and
    print the outcome as a local run prints it (the service screens and confirms with the same library call)."""
    from remedy.cases.patches.io import load_patch

    patch = json.loads(load_patch(patch_file).model_dump_json())  # checked here: a bad file fails before upload
    with _client(server) as client:
        run = client.upload_run(run_dir)
        job = client.submit("verify", run_id=run["run_id"], patch=patch, **settings.model_dump())
        if not wait:
            return _print_job(job, as_json)
        result = _finish(_follow(client, job, as_json))
    if as_json:
        print_json(result)
        return
    render_outcome(result, f"{server} (job {job['job_id']})")


def fix(server: str, run_dir: Path, as_json: bool, wait: bool, settings: FixSettings) -> None:
    """`remedy fix` as a job on the service with every option of the local loop; prints the loop's result (its
    JSON shape) and where the service wrote the winning patch and the fixed agent."""
    from remedy.kb.server.models import FixJobIn
    from remedy.kb.settings import settings_from

    settings_from(FixJobIn, **settings.model_dump(), run_id="not-uploaded-yet")  # a bad --out fails before upload
    with _client(server) as client:
        run = client.upload_run(run_dir)
        job = client.submit("fix", run_id=run["run_id"], **settings.model_dump())
        if not wait:
            return _print_job(job, as_json)
        result = _finish(_follow(client, job, as_json))
    if as_json:
        print_json(result)
        return
    for a in result.get("attempts", []):
        console.print(
            shown(f"round {a.get('round')}: {a.get('family')} -> {a.get('status')} ({a.get('case_id')})"),
            highlight=False,
        )
    console.print(
        shown(f"stopped: {result.get('stop_reason')}; fixed: {bool(result.get('fixed'))} (job {job['job_id']})"),
        highlight=False,
    )
    for key, what in (("patch_path", "winning patch"), ("fixed_dir", "fixed agent")):
        if result.get(key):
            console.print(
                f"{what} (on the service's machine): [bold]{shown(result[key])}[/]", highlight=False, soft_wrap=True
            )


def _print_job(job: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(job)
        return
    p = job["progress"]
    console.print(
        f"{shown(job['job_id'])}  {shown(job['kind'])}  [bold]{shown(job['state'])}[/]  {shown(p['message'])}"
        + (f"  {p['done']}/{p['total']}" if p["total"] else "")
        + (f"\n  error: {shown(job['error'])}" if job["error"] else ""),
        highlight=False,
        soft_wrap=True,
    )


def jobs_list(server: str, state: str | None, as_json: bool) -> None:
    """`remedy jobs list`."""
    with _client(server) as client:
        jobs = client.jobs(state)
    if as_json:
        print_json(jobs)
        return
    for job in jobs:
        _print_job(job, False)
    if not jobs:
        console.print("No jobs.")


def jobs_show(server: str, job_id: str, as_json: bool, wait: bool) -> None:
    """`remedy jobs show`."""
    with _client(server) as client:
        job = _follow(client, client.job(job_id), as_json) if wait else client.job(job_id)
    if as_json:
        print_json(job)
    else:
        _print_job(job, False)


def jobs_cancel(server: str, job_id: str) -> None:
    """`remedy jobs cancel`."""
    with _client(server) as client:
        _print_job(client.cancel(job_id), False)


# -- rules and diagnosis ----------------------------------------------------------------------


def rules_list(server: str, status: str | None) -> list[Rule]:
    """The service's rules (only those in review state ``status`` when given)."""
    from remedy.miners import Rule

    with _client(server) as client:
        return [Rule.model_validate(r) for r in client.rules(status)]


def rule_show(server: str, rule_id: str) -> Rule:
    """One rule from the service (its 404 names close ids)."""
    from remedy.miners import Rule

    with _client(server) as client:
        return Rule.model_validate(client.rule(rule_id))


def rule_review(server: str, rule_id: str, decision: str, note: str) -> Rule:
    """Accept or reject (``decision``: "accepted" or "rejected") on the service, as the token's name."""
    from remedy.miners import Rule

    verb = {"accepted": "accept", "rejected": "reject"}[decision]
    with _client(server) as client:
        return Rule.model_validate(client.review(rule_id, verb, note))


def mine(server: str, **params: Any) -> dict[str, Any]:
    """Mine on the service; the `remedy mine --json` shape."""
    with _client(server) as client:
        return client.mine(**params)


def diagnose(server: str, run_dir: Path | None, **body: Any) -> DiagnosisReport:
    """A diagnosis on the service: of ``run_dir`` (uploaded first) or of a description (``describe=...``)."""
    from remedy.retrieval.diagnosis import DiagnosisReport

    with _client(server) as client:
        if run_dir is not None:
            body["run_id"] = client.upload_run(run_dir)["run_id"]
        return DiagnosisReport.model_validate(client.diagnose(**body))
