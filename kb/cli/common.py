"""Options and renderers shared by the CLI modules."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

__all__ = ["KbOption", "JsonOption", "console", "print_json", "DEFAULT_KB"]

DEFAULT_KB = ".remedy"

KbOption = Annotated[
    Path,
    typer.Option("--kb", envvar="REMEDY_KB", help="Knowledge-base directory (default ./.remedy, or $REMEDY_KB)."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of a table.")]

console = Console()


def print_json(data: Any) -> None:
    """Print strict JSON to stdout, plain (no colour codes), for scripts.

    Non-finite floats (NaN features mean "not measurable") are written as the strings the case
    files use ("NaN", "Infinity", "-Infinity"): a bare NaN is invalid JSON for strict parsers.
    """
    typer.echo(json.dumps(_finite(data), indent=2, default=str, allow_nan=False))


def _finite(data: Any) -> Any:
    if isinstance(data, float) and not math.isfinite(data):
        return "NaN" if math.isnan(data) else ("Infinity" if data > 0 else "-Infinity")
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return data
