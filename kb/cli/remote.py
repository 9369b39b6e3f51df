"""The read and write commands through a running `remedy serve` (``--server URL`` or ``$REMEDY_SERVER``).

Each function mirrors a command of :mod:`.kb`: it calls the service with
``$REMEDY_TOKEN`` and renders the answer with the same table or JSON shape, so
output does not depend on where the KB lives.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

from .common import console, print_json

__all__ = ["query", "similar", "case_show", "kb_stats", "kb_import", "kb_export"]

_err = Console(stderr=True)


def _client(server: str):
    from remedy.kb.client import RemedyClient

    return RemedyClient(server)


def _render_hits(hits: list[dict[str, Any]], title: str) -> None:
    from remedy.cases.model import Case
    from remedy.kb.facade import SimilarCase

    from .kb import render_similar

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
        print_json({"signature": signature.model_dump(mode="json"),
                    "similar": [{k: v for k, v in h.items() if k != "case"} for h in hits]})
        return
    console.print(f"[bold]signature:[/] {signature.summary}", soft_wrap=True)
    if hits:
        _render_hits(hits, f"cases similar to {run_dir}")
    else:
        console.print("No similar cases.")


def case_show(server: str, case_id: str, as_json: bool) -> None:
    """`remedy case show` through the service."""
    from remedy.cases.model import Case

    from .kb import render_case

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

    from .kb import _stats_table

    with _client(server) as client:
        data = client.stats()
    if as_json:
        print_json(data)
        return
    stats = KBStats(**{**data, "path": Path(data["path"]), "store": StoreStats(**data["store"])})
    console.print(_stats_table(stats))


def kb_import(server: str, file: Path, skip_invalid: bool) -> None:
    """`remedy kb import` through the service (Parquet files are read here and sent as JSONL)."""
    with _client(server) as client:
        report = client.import_jsonl(_jsonl_bytes(file, skip_invalid), skip_invalid=skip_invalid)
    for p in report["problems"]:
        _err.print(f"[yellow]skipped line {p['line']}:[/] {p['message']}", highlight=False, soft_wrap=True)
    console.print(f"Imported {file} into {server}: {report['added']} added, {report['unchanged']} unchanged, "
                  f"{report['skipped']} skipped.", soft_wrap=True)


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
