"""`remedy kb ...`, `remedy query`, `remedy case show` (knowledge-base issue).

Each command parses its options, calls one method of the KB it is given (:func:`.connect.open_kb`:
the local ``KnowledgeBase`` at ``--kb``, or the service at ``--server``, which answer the same calls)
and renders the result the same way for both.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from remedy.cases.errors import ValidationError
from remedy.cases.limits import ImportLimits

from .common import (
    DEFAULT_KB,
    JsonOption,
    KbOption,
    ServerOption,
    TrustCheckpointOption,
    console,
    err_console,
    print_json,
    shown,
)
from .connect import bar, open_kb, open_local, serving
from .render import print_similar, render_case, stats_table

if TYPE_CHECKING:
    from remedy.kb.facade import SimilarCase

__all__ = [
    "kb_init",
    "kb_stats",
    "kb_schema",
    "kb_reindex",
    "kb_import",
    "kb_export",
    "query",
    "similar",
    "case_show",
    "case_similar",
]


class _Space(StrEnum):
    discrete = "discrete"
    continuous = "continuous"


class _Mode(StrEnum):
    hybrid = "hybrid"
    vector = "vector"
    text = "text"


# -- kb ------------------------------------------------------------------------------


def kb_init(
    kb: KbOption = Path(DEFAULT_KB),
    examples: Annotated[bool, typer.Option("--examples/--no-examples", help="Load the bundled example cases.")] = True,
    experience: Annotated[
        Path | None,
        typer.Option(
            "--experience",
            help="Also import a case factory's committed experience: every chunk-*.parquet in this folder "
            "(e.g. bench/data/factory).",
            resolve_path=True,
        ),
    ] = None,
) -> None:
    """Create the knowledge base (and load the bundled example cases, and a factory's experience)."""
    chunks = _experience_chunks(experience) if experience is not None else []
    with open_local(kb, create=True) as base, bar("loading examples") as update:
        reports = base.load_examples(progress=update) if examples else []
        learned = [base.import_file(c, progress=update) for c in chunks]
        total = base.count()
    added = sum(r.added for r in reports)
    tail = f", {sum(r.added for r in learned)} from {len(chunks)} experience chunk(s)" if chunks else ""
    console.print(f"KB ready at [bold]{kb}[/]: {total} cases ({added} example cases added{tail}).", soft_wrap=True)


def _experience_chunks(folder: Path) -> list[Path]:
    """The factory's Parquet chunks in ``folder``, in order; one error line when there are none."""
    chunks = sorted(folder.glob("chunk-*.parquet")) if folder.is_dir() else []
    if not chunks:
        raise ValidationError(
            f"--experience {folder}: no chunk-*.parquet files there; give the factory's dataset folder "
            "(bench/data/factory)"
        )
    return chunks


def kb_stats(
    kb: KbOption = Path(DEFAULT_KB),
    as_json: JsonOption = False,
    index: Annotated[
        bool, typer.Option("--index", help="Also open the vector index and count its rows (slower: loads LanceDB).")
    ] = False,
    server: ServerOption = None,
) -> None:
    """Case counts by source, status, env and root cause; schema version (and index size with --index).

    With --index, exits 1 when the index is out of step with the store (missing, extra or duplicate
    ids) or cannot be opened; the message says to run `remedy kb reindex`.
    """
    with open_kb(kb, server, reconcile=False) as base:
        stats = base.stats(index=index)
    if as_json:
        print_json(asdict(stats))
    else:
        console.print(stats_table(stats))
    if stats.index_problem:
        raise typer.Exit(1)


def kb_schema() -> None:
    """Print the JSON schema of a case (what import files must hold, one object per line)."""
    from remedy.cases.model import Case

    print_json(Case.model_json_schema())


def kb_reindex(kb: KbOption = Path(DEFAULT_KB)) -> None:
    """Rebuild the vector index from the store (after a crash or an embedding-model change)."""
    with open_local(kb, reconcile=False) as base, bar("embedding") as update:
        n = base.reindex(progress=update)
    console.print(f"Reindexed {n} cases in {kb}.", soft_wrap=True)


def kb_import(
    file: Annotated[Path, typer.Argument(help="A .jsonl or .parquet file of cases.")],
    kb: KbOption = Path(DEFAULT_KB),
    skip_invalid: Annotated[
        bool, typer.Option("--skip-invalid", help="Import the valid records and skip the others.")
    ] = False,
    max_line_bytes: Annotated[
        int, typer.Option("--max-line-bytes", min=1, help="Longest record, in bytes.")
    ] = ImportLimits.max_line_bytes,
    max_cases: Annotated[
        int, typer.Option("--max-cases", min=1, help="Most records in one file.")
    ] = ImportLimits.max_cases,
    max_field_chars: Annotated[
        int, typer.Option("--max-field-chars", min=1, help="Longest string field.")
    ] = ImportLimits.max_field_chars,
    max_items: Annotated[
        int, typer.Option("--max-items", min=1, help="Largest list or mapping in a record.")
    ] = ImportLimits.max_items,
    max_file_bytes: Annotated[
        int, typer.Option("--max-file-bytes", min=1, help="Largest .json/.parquet file.")
    ] = ImportLimits.max_file_bytes,
    mark_imported: Annotated[
        bool,
        typer.Option(
            "--mark-imported",
            help="File verified/bench cases as 'imported' (another team's): they weigh less in diagnosis.",
        ),
    ] = False,
    replace: Annotated[
        bool,
        typer.Option("--replace", help="Overwrite stored cases whose id comes back with different content."),
    ] = False,
    server: ServerOption = None,
) -> None:
    """Import cases (.jsonl, .json, .parquet); a file with invalid records imports nothing unless --skip-invalid.

    A case whose id is already stored with different content refuses the whole file unless --replace.
    """
    limits = ImportLimits(max_line_bytes, max_cases, max_field_chars, max_items, max_file_bytes)
    with open_kb(kb, server, create=True) as base, bar(f"importing {file.name}") as update:
        report = base.import_file(
            file,
            skip_invalid=skip_invalid,
            progress=update,
            limits=limits,
            mark_imported=mark_imported,
            replace=replace,
        )
    for line, msg in report.problems:
        err_console.print(f"[yellow]skipped line {line}:[/] {shown(msg)}", highlight=False, soft_wrap=True)
    replaced = f"{report.replaced} replaced, " if replace else ""
    into = f" into {shown(server)}" if server else ""
    console.print(
        f"Imported {shown(file)}{into}: {report.added} added, {replaced}{report.unchanged} unchanged, "
        f"{report.skipped} skipped.",
        soft_wrap=True,
        highlight=False,
    )


def kb_export(
    file: Annotated[Path, typer.Argument(help="Output file: .jsonl or .parquet.")],
    kb: KbOption = Path(DEFAULT_KB),
    server: ServerOption = None,
) -> None:
    """Export every case to JSONL, JSON or Parquet (by extension)."""
    with open_kb(kb, server, reconcile=False) as base:
        n = base.export(file)
    source = f" from {server}" if server else ""
    console.print(f"Exported {n} cases{source} to {file}.", soft_wrap=True)


# -- query ---------------------------------------------------------------------------


def query(
    text: Annotated[str, typer.Argument(help="The failure, in words: 'lander hovers above the pad'.")],
    kb: KbOption = Path(DEFAULT_KB),
    env: Annotated[str | None, typer.Option("--env", help="Only cases on this env id.")] = None,
    action_space: Annotated[_Space | None, typer.Option("--action-space", help="Only this action space.")] = None,
    algo: Annotated[str | None, typer.Option("--algo", help="Only this algorithm (case-insensitive).")] = None,
    only_improved: Annotated[bool, typer.Option("--only-improved", help="Only verified improvements.")] = False,
    min_effect: Annotated[float | None, typer.Option("--min-effect", help="Only measured effects >= X.")] = None,
    k: Annotated[int, typer.Option("--k", "-k", min=1, help="How many cases.")] = 10,
    mode: Annotated[_Mode, typer.Option("--mode", help="Ranking: hybrid, vector or text.")] = _Mode.hybrid,
    as_json: JsonOption = False,
    server: ServerOption = None,
) -> None:
    """What fixed similar failures: the nearest stored cases, with patch and measured effect.

    When a `remedy serve` on this machine holds the KB and $REMEDY_TOKEN is set, the query goes
    through it (already warm) and says so on stderr."""
    server = server or serving(kb)
    with open_kb(kb, server) as base:
        hits = base.similar(
            text,
            k=k,
            env_id=env,
            action_space=action_space.value if action_space else None,
            algo=algo,
            only_improved=only_improved,
            min_effect=min_effect,
            mode=mode.value,
        )
    _print_hits(hits, as_json, f"cases similar to {shown(repr(text))}", server)


def _print_hits(hits: list[SimilarCase], as_json: bool, title: str, server: str | None) -> None:
    """Similar cases as JSON, a table (or tab-separated lines in a pipe), or why there are none."""
    if as_json:
        print_json([h.as_dict() for h in hits])
    elif not hits:
        fill = "import cases into the served KB" if server else "`remedy kb init` to load the examples"
        console.print(f"No similar cases (try fewer filters, or {fill}).", soft_wrap=True)
    else:
        print_similar(hits, title=title)


def similar(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (run.yaml + checkpoint).", resolve_path=True)],
    kb: KbOption = Path(DEFAULT_KB),
    k: Annotated[int, typer.Option("--k", "-k", min=1, help="How many cases.")] = 10,
    episodes: Annotated[int, typer.Option("--episodes", min=1, help="Evaluation episodes to roll out.")] = 10,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the evaluation rollouts.")] = 0,
    any_action_space: Annotated[
        bool, typer.Option("--any-action-space", help="Also show cases from the other action-space type.")
    ] = False,
    only_improved: Annotated[bool, typer.Option("--only-improved", help="Only verified improvements.")] = False,
    as_json: JsonOption = False,
    server: ServerOption = None,
    trust_checkpoint: TrustCheckpointOption = False,
) -> None:
    """What fixed failures like this agent's: signature of RUN_DIR, then the nearest stored cases."""
    with open_kb(kb, server) as base:
        run, hits = base.similar_to_run(
            run_dir,
            k=k,
            n_episodes=episodes,
            seed=seed,
            same_action_space=not any_action_space,
            only_improved=only_improved,
            trust=trust_checkpoint,
        )
    if as_json:
        print_json({"signature": run.signature.model_dump(mode="json"), "similar": [h.as_dict() for h in hits]})
        return
    console.print(f"[bold]signature:[/] {shown(run.signature.summary)}", soft_wrap=True)
    if hits:
        print_similar(hits, title=f"cases similar to {shown(run_dir)}")
    else:
        console.print("No similar cases.")


# -- case ----------------------------------------------------------------------------


def case_show(
    case_id: Annotated[
        str, typer.Argument(help="The case id, or a unique prefix such as the short id the tables show.")
    ],
    kb: KbOption = Path(DEFAULT_KB),
    as_json: JsonOption = False,
    server: ServerOption = None,
) -> None:
    """Show one stored case in full."""
    with open_kb(kb, server, reconcile=False) as base:
        case = base.get(case_id)
    if as_json:
        print_json(json.loads(case.model_dump_json()))
        return
    console.print(render_case(case))


def case_similar(
    case_id: Annotated[str, typer.Argument(help="The case id, or a unique prefix (the short id the tables show).")],
    kb: KbOption = Path(DEFAULT_KB),
    k: Annotated[int, typer.Option("--k", "-k", min=1, help="How many cases.")] = 10,
    only_improved: Annotated[bool, typer.Option("--only-improved", help="Only verified improvements.")] = False,
    as_json: JsonOption = False,
    server: ServerOption = None,
) -> None:
    """What fixed failures like a stored case's: the nearest other cases, with patch and measured effect."""
    with open_kb(kb, server) as base:
        case = base.get(case_id)
        hits = base.similar(case, k=k, only_improved=only_improved)
    _print_hits(hits, as_json, f"cases similar to {shown(case.case_id)}", server)
