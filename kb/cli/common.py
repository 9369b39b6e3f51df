"""Options and renderers shared by the CLI modules."""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

if TYPE_CHECKING:
    from remedy.cases.model import Effect

__all__ = [
    "KbOption",
    "JsonOption",
    "ServerOption",
    "TrustCheckpointOption",
    "console",
    "err_console",
    "print_json",
    "DEFAULT_KB",
    "progress_bar",
    "status_markup",
    "effect_text",
    "add_columns",
    "shown",
    "shown_cell",
]

DEFAULT_KB = ".remedy"

KbOption = Annotated[
    Path,
    typer.Option("--kb", envvar="REMEDY_KB", help="Knowledge-base directory (default ./.remedy, or $REMEDY_KB)."),
]
#: the default is ``remedy.cases.verify.verification.SCREEN_CONFIDENCE`` (a literal here: the CLI imports no torch)
ScreenConfidenceOption = Annotated[
    float,
    typer.Option(
        "--screen-confidence",
        min=0.5,
        max=0.99,
        help="Two-sided level at which a screen passes and earns a confirmation on fresh seeds (0.8: one-sided "
        "10%). Only the confirmation, at 95%, can say improved; records made before this option screened at 0.95.",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of a table.")]
ServerOption = Annotated[
    str | None,
    typer.Option(
        "--server",
        envvar="REMEDY_SERVER",
        help="Go through a running `remedy serve` at this URL (token from $REMEDY_TOKEN) instead of --kb.",
    ),
]

TrustCheckpointOption = Annotated[
    bool,
    typer.Option(
        "--trust-checkpoint",
        help="Load RUN_DIR as SB3 does: unpickle its checkpoint and normalization stats and import a "
        "'module:' env id. Only for your own files (a checkpoint is code); ignored with --server, "
        "the service never trusts.",
    ),
]

console = Console()
#: progress and warnings go to stderr, so stdout stays clean for ``--json``.
err_console = Console(stderr=True)

#: rich colour of each verification status; anything else (no_effect, inconclusive, ...) is yellow.
STATUS_COLOURS = {"improved": "green", "worse": "red", "reward_hacking": "magenta", "failed": "red"}


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


def progress_bar(*, to: Console | None = None, disable: bool = False) -> Progress:
    """The one progress-bar look of the CLI: description, bar, done/total, elapsed; on stderr by default."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    return Progress(*columns, console=to or err_console, transient=True, disable=disable)


def status_markup(status: str, bold: bool = False) -> str:
    """A status word in its colour (rich markup)."""
    colour = STATUS_COLOURS.get(status, "yellow")
    return f"[{'bold ' if bold else ''}{colour}]{status}[/]"


def effect_text(effect: Effect | None) -> str:
    """``+0.45 [+0.2, +0.7] success_rate`` for an Effect, ``-`` for none."""
    return "-" if effect is None else effect.text()


#: characters a terminal acts on or hides: C0/C1 controls (escape sequences, carriage return), format
#: characters (bidi overrides, zero-width), surrogates, line/paragraph separators. Newline and tab are kept.
_HIDDEN = re.compile(r"[^\n\t\x20-\x7e]")
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def shown(value: Any) -> str:
    """Text from a stored case (or any outside source) made safe to print through rich.

    Control and format characters become visible escapes (``\\x1b``, ``\\u202e``) so an escape
    sequence or a right-to-left override in a case cannot drive the terminal or disguise text, and
    rich markup is escaped so ``[red]...[/]`` in a summary prints as written. The one helper every
    table and panel built from case text goes through; ``--json`` output never does (it stays exact).
    """
    return escape(_visible(str(value)))


def shown_cell(value: Any) -> str:
    """Like :func:`shown` for plain (non-rich) output such as tab-separated lines: no markup escaping,
    and tabs and newlines folded to spaces so a cell stays one cell."""
    return " ".join(_visible(str(value)).split())


def _visible(text: str) -> str:
    return _HIDDEN.sub(_escape_char, text)


def _escape_char(match: re.Match[str]) -> str:
    ch = match.group()
    if unicodedata.category(ch) not in _HIDDEN_CATEGORIES:
        return ch  # ordinary non-ASCII text (accents, CJK, symbols) prints as it is
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def add_columns(table: Table, columns: Sequence[tuple[str, Mapping[str, Any]]]) -> Table:
    """Add ``(header, rich column options)`` pairs to ``table``, in order; returns the table."""
    for header, options in columns:
        table.add_column(header, **options)
    return table
