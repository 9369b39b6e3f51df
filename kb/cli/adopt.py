"""`remedy adopt PATH --out RUN_DIR`: turn an SB3 zip, an RL Zoo log folder or a Hub model folder into a run directory."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from .common import JsonOption, console, err_console, print_json

if TYPE_CHECKING:
    from remedy.cases.evidence.adopt import AdoptResult

__all__ = ["adopt_cmd", "render_adoption"]


def _shown(path: str, source: str) -> str:
    """A file's path relative to the adopted folder (the table's title names it), else as given."""
    root = Path(source) if Path(source).is_dir() else Path(source).parent
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return path


def render_adoption(result: AdoptResult) -> None:
    """Print every file used or ignored, then what the run directory holds and what to run next."""
    table = Table(title=f"{escape(result.source)} ({result.layout})")
    table.add_column("file", style="cyan", overflow="fold")
    table.add_column("used")
    table.add_column("role")
    table.add_column("what was read, or why not", overflow="fold")
    for f in result.files:
        dest = f" -> {f.copied_to}" if f.copied_to else ""
        used = "[green]yes[/]" if f.used else "[dim]no[/]"
        table.add_row(escape(_shown(f.path, result.source)), used, f.role, escape(f.note + dest))
    console.print(table)
    for warning in result.warnings:
        err_console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)
    c = result.config
    steps = f"{c.train_steps:,} steps" if c.train_steps is not None else "steps unknown"
    console.print(
        f"[bold]wrote {escape(result.run_dir)}[/]: {c.algo} on {c.env_id}, {steps}, {c.n_envs} envs, "
        f"success: {c.success.describe()}",
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"next: remedy signature {escape(result.run_dir)}", highlight=False, soft_wrap=True)


def adopt_cmd(
    path: Annotated[
        Path, typer.Argument(help="An SB3 .zip, an RL Zoo log folder (logs/<algo>/<env>_<n>/) or a Hub model folder.")
    ],
    out: Annotated[Path, typer.Option("--out", help="Run directory to write (must not exist, or be empty).")],
    success: Annotated[
        str | None,
        typer.Option(
            "--success",
            help="What success means, when the env has no reward_threshold: 'return>=X', 'info:KEY', "
            "'final_reward>=X', 'obs[I]>=X', 'terminated', 'survive', or a YAML mapping.",
        ),
    ] = None,
    env: Annotated[
        str | None, typer.Option("--env", help="Env id, when the files do not say it (a bare zip never does).")
    ] = None,
    algo: Annotated[str | None, typer.Option("--algo", help="Algorithm, when the files do not say it.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Write a run directory for an agent trained elsewhere, reading its settings from its own files."""
    from remedy.cases.evidence.adopt import adopt  # reads gymnasium's registry; deferred so --help stays light

    result = adopt(path, out, success=success, env_id=env, algo=algo)
    if as_json:
        print_json(result.model_dump(mode="json"))
        return
    render_adoption(result)
