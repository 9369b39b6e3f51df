"""`remedy kb ...`, `remedy query`, `remedy case show` (knowledge-base issue).

Each command parses its options, calls one KnowledgeBase method and renders the
result. The facade is imported inside the commands so `remedy --help` stays fast.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from remedy.cases.limits import ImportLimits

from . import remote
from .common import (
    DEFAULT_KB,
    JsonOption,
    KbOption,
    ServerOption,
    TrustCheckpointOption,
    console,
    err_console,
    print_json,
    progress_bar,
    shown,
)
from .render import print_similar, render_case, stats_table

if TYPE_CHECKING:
    pass

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
]


class _Space(StrEnum):
    discrete = "discrete"
    continuous = "continuous"


class _Mode(StrEnum):
    hybrid = "hybrid"
    vector = "vector"
    text = "text"


def _open(kb: Path, create: bool = False, reconcile: bool = True):
    from remedy.kb.facade import KnowledgeBase

    base = KnowledgeBase.open(kb, create=create, reconcile=False)
    if reconcile:  # after a crash the index may lag the store: catch up, showing progress
        with _bar("reconciling the index") as update:
            report = base.reconcile(progress=update)
        if report.deduplicated:
            err_console.print(
                f"[yellow]removed duplicate index rows of {report.deduplicated} case(s)[/]", highlight=False
            )
        if report.rebuilt:
            err_console.print(
                f"[yellow]the index was damaged ({report.rebuilt}); rebuilt it from the store[/]",
                highlight=False,
                soft_wrap=True,
            )
    return base


@contextmanager
def _bar(label: str) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar on stderr (stdout stays clean for scripts); yields ``update(done, total)``."""
    with progress_bar() as progress:
        task = progress.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        yield update


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
    with _open(kb, create=True) as base, _bar("loading examples") as update:
        reports = base.load_examples(progress=update) if examples else []
        learned = [base.import_file(c, progress=update) for c in chunks]
        total = base.count()
    added = sum(r.added for r in reports)
    tail = f", {sum(r.added for r in learned)} from {len(chunks)} experience chunk(s)" if chunks else ""
    console.print(f"KB ready at [bold]{kb}[/]: {total} cases ({added} example cases added{tail}).", soft_wrap=True)


def _experience_chunks(folder: Path) -> list[Path]:
    """The factory's Parquet chunks in ``folder``, in order; one error line when there are none."""
    from remedy.cases.errors import ValidationError

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
    if server:
        return remote.kb_stats(server, as_json)
    with _open(kb, reconcile=False) as base:
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
    with _open(kb, reconcile=False) as base, _bar("embedding") as update:
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
    if server:
        if replace:
            from remedy.cases.errors import ValidationError

            raise ValidationError("--replace is not available through --server; drop it, or import with --kb")
        return remote.kb_import(server, file, skip_invalid)
    with _open(kb, create=True) as base, _bar(f"importing {file.name}") as update:
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
    console.print(
        f"Imported {shown(file)}: {report.added} added, {replaced}{report.unchanged} unchanged, "
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
    if server:
        return remote.kb_export(server, file)
    with _open(kb, reconcile=False) as base:
        n = base.export(file)
    console.print(f"Exported {n} cases to {file}.", soft_wrap=True)


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
    """What fixed similar failures: the nearest stored cases, with patch and measured effect."""
    if server:
        return remote.query(
            server,
            text,
            as_json,
            env=env,
            action_space=action_space.value if action_space else None,
            algo=algo,
            only_improved=only_improved,
            min_effect=min_effect,
            k=k,
            mode=mode.value,
        )
    with _open(kb) as base:
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
    if as_json:
        print_json([h.as_dict() for h in hits])
    elif not hits:
        console.print("No similar cases (try fewer filters, or `remedy kb init` to load the examples).", soft_wrap=True)
    else:
        print_similar(hits, title=f"cases similar to {shown(repr(text))}")


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
    if server:
        return _similar_remote(server, run_dir, k, episodes, seed, any_action_space, only_improved, as_json)
    with _open(kb) as base:
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


def _similar_remote(
    server: str,
    run_dir: Path,
    k: int,
    episodes: int,
    seed: int,
    any_action_space: bool,
    only_improved: bool,
    as_json: bool,
) -> None:
    from remedy.cases.evidence.signature import signature_of_run

    run = signature_of_run(run_dir, n_episodes=episodes, seed=seed)  # rolled out here; only the search is remote
    space = None if any_action_space else run.subject.traits.action_space.value
    remote.similar(server, run.signature, run_dir, as_json, k=k, action_space=space, only_improved=only_improved)


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
    if server:
        return remote.case_show(server, case_id, as_json)
    with _open(kb, reconcile=False) as base:
        case = base.get(case_id)
    if as_json:
        print_json(json.loads(case.model_dump_json()))
        return
    console.print(render_case(case))
