"""`remedy optimize` (the periodic tuning job) and `remedy programs list|show|activate|rollback`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from remedy.cases.errors import KBNotFoundError

from .common import DEFAULT_KB, JsonOption, KbOption, console, err_console, print_json

__all__ = ["optimize", "programs_list", "programs_show", "programs_activate", "programs_rollback"]

BackendOption = Annotated[
    str, typer.Option("--backend", help="offline (tunes the offline vote), llm (DSPy) or ranker (the remedy ranker).")
]


def _program_store(kb: Path):
    from remedy.cases.store import CaseStore
    from remedy.kb.facade import DB_FILE
    from remedy.optimizer.versions import ProgramStore

    if not (kb / DB_FILE).is_file():
        raise KBNotFoundError(f"no KB at {kb}; create one with `remedy kb init --kb {kb}`")
    return ProgramStore(CaseStore(kb / DB_FILE))


def optimize(
    backend: BackendOption = "offline",
    optimizer: Annotated[str | None, typer.Option("--optimizer", help="llm backend: gepa, mipro or bootstrap.")] = None,
    trials: Annotated[int, typer.Option("--trials", help="Search trials (offline) or optimizer budget (llm).")] = 100,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the split and the search.")] = 0,
    margin: Annotated[
        float, typer.Option("--margin", help="Promote only if validation beats the active version by this much.")
    ] = 0.02,
    min_new: Annotated[
        int, typer.Option("--min-new", help="Do nothing unless this many verified cases arrived since the last run.")
    ] = 0,
    val_fraction: Annotated[
        float, typer.Option("--val-fraction", help="Share of groups held out for validation.")
    ] = 0.3,
    reports: Annotated[Path, typer.Option("--reports", help="Where the Markdown report goes.")] = Path("reports"),
    kb: KbOption = Path(DEFAULT_KB),
    as_json: JsonOption = False,
) -> None:
    """Tune the diagnoser on verified cases; store a version, promoted only if it beats the active one.

    --backend llm compiles the DSPy diagnosis program with the LM named by REMEDY_LM (and
    REMEDY_LM_API_BASE / REMEDY_LM_API_KEY); gepa reflects with REMEDY_REFLECTION_LM, else REMEDY_LM.
    """
    from remedy.kb.diagnose import KBRetriever
    from remedy.kb.facade import KnowledgeBase
    from remedy.optimizer.job import OptimizeOptions, run_optimize

    opts = OptimizeOptions(backend, optimizer, trials, seed, margin, min_new, val_fraction, reports)
    opts.check()  # a bad flag fails before the KB and the embedder load
    store = KnowledgeBase.open(kb, create=False)
    with err_console.status("optimizing") as status:
        result = run_optimize(store.store, KBRetriever(store), opts, progress=lambda m: status.update(m))
    if as_json:
        print_json(result.as_dict())
        return
    if result.status == "nothing_to_do":
        console.print(result.message, highlight=False)
        return
    t = Table(title=f"remedy optimize ({backend})", title_justify="left")
    for col in ("", "active before", "new version"):
        t.add_column(col)
    v = result.version
    t.add_row("validation score", _f(result.active_val), _f(result.new_val))
    t.add_row("train score", _f(result.train_score_before), _f(result.train_score_after))
    console.print(t)
    console.print(f"examples: {result.train_size} train, {result.val_size} validation", highlight=False)
    word = "[green]promoted[/]" if result.promoted else "[yellow]not promoted[/]"
    console.print(f"{v.id if v else '-'}: {word}: {v.reason if v else ''}", highlight=False)
    if result.report is not None:
        console.print(f"report: {result.report}", highlight=False)


def programs_list(
    backend: Annotated[str | None, typer.Option("--backend", help="Only this backend's versions.")] = None,
    kb: KbOption = Path(DEFAULT_KB),
    as_json: JsonOption = False,
) -> None:
    """List stored program versions, oldest first; the active one is marked."""
    versions = _program_store(kb).list(backend)
    if as_json:
        print_json([v.as_dict() for v in versions])
        return
    t = Table(title=f"program versions of {kb}", title_justify="left")
    for col in ("id", "backend", "optimizer", "created", "train/val", "active val", "new val", "promoted", "active"):
        t.add_column(col)
    for v in versions:
        t.add_row(
            v.id, v.backend, v.optimizer, f"{v.created_at:%Y-%m-%d %H:%M}", f"{v.train_size}/{v.val_size}",
            _f(v.active_val), _f(v.new_val), "yes" if v.promoted else "no", "[green]*[/]" if v.active else "",
        )  # fmt: skip
    console.print(t)
    if not versions:
        console.print("none yet: the built-in defaults are in force; run `remedy optimize`")


def programs_show(
    version: Annotated[str, typer.Argument(help="A version id (or its pN prefix) from `remedy programs list`.")],
    kb: KbOption = Path(DEFAULT_KB),
    as_json: JsonOption = False,
) -> None:
    """Show one program version in full (its parameters or saved program)."""
    # the parameters (or the saved program) are the point, and JSON shows them whole: one rendering for both
    print_json(_program_store(kb).get(version).as_dict())


def programs_activate(
    version: Annotated[str, typer.Argument(help="A version id (or its pN prefix) from `remedy programs list`.")],
    kb: KbOption = Path(DEFAULT_KB),
    as_json: JsonOption = False,
) -> None:
    """Make a stored version the active one of its backend (`remedy diagnose` uses it from now on)."""
    v = _program_store(kb).activate(version)
    if as_json:
        print_json(v.as_dict())
        return
    console.print(f"active {v.backend} program: {v.id}", highlight=False)


def programs_rollback(
    backend: BackendOption = "offline",
    kb: KbOption = Path(DEFAULT_KB),
    as_json: JsonOption = False,
) -> None:
    """Undo the last activation: the version active before it, or the built-in defaults."""
    v = _program_store(kb).rollback(backend)
    if as_json:
        print_json({"backend": backend, "active": None if v is None else v.as_dict()})
        return
    console.print(f"active {backend} program: {v.id if v else 'the built-in defaults'}", highlight=False)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"
