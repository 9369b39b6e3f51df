"""`remedy report`: the researchers' heuristics report (Markdown + self-contained HTML) of a KB's rules."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer

from .common import DEFAULT_KB, JsonOption, KbOption, console, print_json

__all__ = ["report"]


def report(
    out: Annotated[Path, typer.Option("--out", help="Directory for the report files (created if missing).")] = Path(
        "reports"
    ),
    date: Annotated[
        datetime | None,
        typer.Option("--date", formats=["%Y-%m-%d"], help="Date in the file names and the text (default today)."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the plots' point jitter.")] = 0,
    kb: KbOption = Path(DEFAULT_KB),
    as_json: JsonOption = False,
) -> None:
    """Write heuristics-DATE.md (plots beside it) and a self-contained heuristics-DATE.html of the KB's rules."""
    from remedy.kb.facade import KnowledgeBase
    from remedy.miners.report import HOW_TO_MINE, write_kb_report

    with KnowledgeBase.open(kb, create=False, reconcile=False) as base:
        paths = write_kb_report(base.store, out, date=date.date() if date else None, seed=seed, kb_label=str(kb))
    if as_json:
        print_json(
            {"markdown": str(paths.markdown), "html": str(paths.html), "plots": [str(p) for p in paths.plots]}
            | {"rules": paths.counts}
        )
        return
    n = paths.counts
    if not sum(n.values()):
        console.print(f"[yellow]nothing mined yet:[/] {HOW_TO_MINE}", highlight=False, soft_wrap=True)
    console.print(
        f"{n['accepted']} accepted, {n['proposed']} awaiting review, {n['flagged']} flagged, {n['rejected']} rejected",
        highlight=False,
    )
    console.print(str(paths.markdown), highlight=False, soft_wrap=True)
    console.print(str(paths.html), highlight=False, soft_wrap=True)
