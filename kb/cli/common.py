"""Options and renderers shared by the CLI modules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

__all__ = ["KbOption", "JsonOption", "ServerOption", "console", "print_json", "DEFAULT_KB"]

DEFAULT_KB = ".remedy"

KbOption = Annotated[
    Path,
    typer.Option("--kb", envvar="REMEDY_KB", help="Knowledge-base directory (default ./.remedy, or $REMEDY_KB)."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of a table.")]
ServerOption = Annotated[
    str | None,
    typer.Option("--server", envvar="REMEDY_SERVER",
                 help="Go through a running `remedy serve` at this URL (token from $REMEDY_TOKEN) instead of --kb."),
]

console = Console()


def print_json(data: Any) -> None:
    """Print JSON to stdout, plain (no colour codes), for scripts."""
    typer.echo(json.dumps(data, indent=2, default=str))
