"""Cases in files: JSONL and Parquet import/export, validated record by record.

Files travel between teams, so every record is validated with the case model
and every problem is reported with its line (JSONL) or row (Parquet) number,
1-based. Floats that JSON cannot hold (NaN, +-inf, which signature features
use for "not measurable") are written as the strings ``"NaN"``,
``"Infinity"``, ``"-Infinity"``, which the case model reads back as floats.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import pydantic
import pydantic_core

from .errors import ImportFileError, ValidationError
from .model import Case
from .patches.spec import Patch

__all__ = [
    "FORMATS",
    "Problem",
    "case_to_json",
    "case_from_json",
    "read_cases",
    "write_cases",
    "format_validation_error",
]

#: file extensions this module reads and writes
FORMATS = (".jsonl", ".parquet")

#: (line or row number, 1-based; 0 for the file as a whole; one-line message)
Problem = tuple[int, str]

_MAX_MSG = 240


def case_to_json(case: Case) -> str:
    """Canonical JSON text of a case that survives NaN/inf features (unlike ``Case.to_json``)."""
    return pydantic_core.to_json(case.model_dump(), inf_nan_mode="strings").decode()


def case_from_json(text: str | bytes) -> Case:
    """Parse and validate one case from JSON text (raises pydantic's ValidationError)."""
    return Case.model_validate_json(text)


def format_validation_error(err: pydantic.ValidationError) -> str:
    """One line from a pydantic error: ``field.path: message (got 'x')`` for each error."""
    parts = []
    for e in err.errors(include_url=False):
        loc = ".".join(str(p) for p in e.get("loc", ())) or "record"
        got = e.get("input")
        # The offending value first: enum messages list every allowed label and get clipped.
        shown = f"got {got!r}: " if isinstance(got, (str, int, float)) and e.get("type") != "missing" else ""
        parts.append(f"{loc}: {shown}{e.get('msg', 'invalid')}")
    return _clip("; ".join(parts))


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_MSG else text[: _MAX_MSG - 3] + "..."


def _check_format(path: Path) -> str:
    ext = path.suffix.lower()
    if ext not in FORMATS:
        raise ValidationError(
            f"{path}: unknown file type {ext or '(none)'!r}; use one of {', '.join(FORMATS)}"
        )
    return ext


def _parse_record(data: object) -> Case:
    # Hand-written files may give a single patch part instead of {"parts": [...]}.
    if isinstance(data, dict) and isinstance(data.get("patch"), dict) and "parts" not in data["patch"]:
        data = {**data, "patch": Patch.from_data(data["patch"])}
    return Case.model_validate(data)


def _validate(lineno: int, text: str | bytes) -> tuple[Case | None, Problem | None]:
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        return None, (lineno, _clip(f"not valid JSON: {err}"))
    if not isinstance(data, dict):
        return None, (lineno, f"expected a JSON object, got {type(data).__name__}")
    try:
        return _parse_record(data), None
    except pydantic.ValidationError as err:
        return None, (lineno, format_validation_error(err))


def _jsonl_records(path: Path) -> Iterable[tuple[int, str]]:
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if raw.strip():
                yield lineno, raw


def _parquet_records(path: Path) -> Iterable[tuple[int, str]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, columns=["case_json"])
    except Exception as err:  # pyarrow raises several types for non-Parquet or column-less files
        raise ImportFileError(
            _clip(f"{path}: not a Remedy Parquet file (need a 'case_json' column): {err}"),
            [(0, _clip(str(err)))],
        ) from None
    for row, text in enumerate(table.column("case_json").to_pylist(), start=1):
        yield row, text if text is not None else "null"


def read_cases(path: Path | str, skip_invalid: bool = False) -> tuple[list[Case], list[Problem]]:
    """Read and validate every case in a ``.jsonl`` or ``.parquet`` file.

    Returns the valid cases and the problems, one ``(line, message)`` per bad
    record (duplicate ``case_id`` within the file counts as one). Unless
    ``skip_invalid``, any problem raises :class:`ImportFileError` naming each
    bad line, so a caller never sees half a file.
    """
    path = Path(path)
    ext = _check_format(path)
    if not path.is_file():
        raise ImportFileError(f"{path}: no such file", [(0, "no such file")])
    records = _jsonl_records(path) if ext == ".jsonl" else _parquet_records(path)
    cases, problems, seen = [], [], {}
    for lineno, text in records:
        case, problem = _validate(lineno, text)
        if case is not None and case.case_id in seen:
            problem = (lineno, f"duplicate case_id {case.case_id!r} (first on line {seen[case.case_id]})")
        if problem is not None:
            problems.append(problem)
            continue
        seen[case.case_id] = lineno
        cases.append(case)
    if problems and not skip_invalid:
        raise ImportFileError(_import_message(path, problems), problems)
    return cases, problems


def _import_message(path: Path, problems: Sequence[Problem], shown: int = 5) -> str:
    unit = "row" if path.suffix.lower() == ".parquet" else "line"
    head = "; ".join(f"{unit} {n}: {msg}" for n, msg in problems[:shown])
    rest = problems[shown:]
    more = f"; also {unit}s {', '.join(str(n) for n, _ in rest)}" if rest else ""
    return (
        f"{path}: {len(problems)} invalid record(s), nothing imported ({head}{more}); "
        "fix them or pass --skip-invalid to import the valid ones"
    )


def write_cases(path: Path | str, cases: Iterable[Case]) -> int:
    """Write cases to ``.jsonl`` or ``.parquet`` (by extension), atomically; returns the count."""
    path = Path(path)
    ext = _check_format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        n = _write_jsonl(tmp, cases) if ext == ".jsonl" else _write_parquet(tmp, cases)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return n


def _write_jsonl(path: Path, cases: Iterable[Case]) -> int:
    n = 0
    with path.open("w", encoding="utf-8") as fh:
        for case in cases:
            fh.write(case_to_json(case) + "\n")
            n += 1
    return n


def _write_parquet(path: Path, cases: Iterable[Case]) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {
            "case_id": c.case_id,
            "source": c.source.value,
            "env_id": c.subject.env_id,
            "algo": c.subject.algo,
            "status": c.status,
            "effect": c.effect_value,
            "root_causes": [r.value for r in c.root_causes],
            "summary": c.signature.summary,
            "case_json": case_to_json(c),
        }
        for c in cases
    ]
    schema = pa.schema(
        [
            ("case_id", pa.string()),
            ("source", pa.string()),
            ("env_id", pa.string()),
            ("algo", pa.string()),
            ("status", pa.string()),
            ("effect", pa.float64()),
            ("root_causes", pa.list_(pa.string())),
            ("summary", pa.string()),
            ("case_json", pa.string()),
        ]
    )
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return len(rows)
