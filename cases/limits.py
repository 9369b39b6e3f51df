"""Bounds on one case import: a light module of its own, so `remedy kb import --help` shows the defaults
without importing the case models (pydantic, numpy) that ``cases.io`` needs to read a file."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ValidationError

__all__ = ["ImportLimits"]


@dataclass(frozen=True)
class ImportLimits:
    """Bounds on one import; each names the `remedy kb import` flag that raises it.

    A real case is a few KB of JSON (the bundled examples are under 4 KB); the defaults leave
    two orders of magnitude of room and still refuse a file built to exhaust memory.
    """

    max_line_bytes: int = 1 << 20  # one JSONL line, one JSON array item or one Parquet cell
    max_cases: int = 100_000  # records in one file
    max_field_chars: int = 100_000  # any one string in a record (reward code, summary, ...)
    max_items: int = 10_000  # any one list or mapping in a record (episodes, features, ...)
    max_file_bytes: int = 1 << 30  # a whole .json or .parquet file, which is read at once

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not isinstance(value, int) or value < 1:
                raise ValidationError(f"import limit {name} must be a positive integer, got {value!r}")


_FLAGS = {
    "max_line_bytes": "--max-line-bytes",
    "max_cases": "--max-cases",
    "max_field_chars": "--max-field-chars",
    "max_items": "--max-items",
    "max_file_bytes": "--max-file-bytes",
}
