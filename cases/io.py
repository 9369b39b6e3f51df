"""Cases in files: JSONL, JSON and Parquet import/export, validated record by record.

Files travel between teams, so every record is validated with the case model
and every problem is reported with its line (JSONL), item (JSON array) or row
(Parquet) number, 1-based. A file is also bounded (:class:`ImportLimits`: line
length, cases per import, size of any one field), so a hostile or broken file
is refused with the limit it broke instead of exhausting memory. Floats that JSON cannot hold (NaN, +-inf, which signature features
use for "not measurable") are written as the strings ``"NaN"``,
``"Infinity"``, ``"-Infinity"``, which the case model reads back as floats.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import pydantic
import pydantic_core

from .errors import ImportFileError, ValidationError
from .limits import _FLAGS, ImportLimits
from .model import Case
from .patches.spec import Patch

__all__ = [
    "FORMATS",
    "ImportLimits",
    "Problem",
    "case_to_json",
    "case_from_json",
    "read_cases",
    "write_cases",
    "format_validation_error",
]

#: file extensions this module reads and writes
FORMATS = (".jsonl", ".json", ".parquet")

#: (line or row number, 1-based; 0 for the file as a whole; one-line message)
Problem = tuple[int, str]

_MAX_MSG = 240


def _over(path: Path, what: str, limit: str, value: int) -> ImportFileError:
    return ImportFileError(
        f"{path}: {what}, over the limit of {value:,} ({limit}); nothing imported. "
        f"If the file is trusted, raise it with `remedy kb import {_FLAGS[limit]} N`",
        [(0, f"{what} (limit {limit}={value})")],
    )


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
        raise ValidationError(f"{path}: unknown file type {ext or '(none)'!r}; use one of {', '.join(FORMATS)}")
    return ext


def _parse_record(data: object) -> Case:
    # Hand-written files may give a single patch part instead of {"parts": [...]}.
    if isinstance(data, dict) and isinstance(data.get("patch"), dict) and "parts" not in data["patch"]:
        data = {**data, "patch": Patch.from_data(data["patch"])}
    return Case.model_validate(data)


def _validate(lineno: int, data: object, limits: ImportLimits) -> tuple[Case | None, Problem | None]:
    if isinstance(data, (str, bytes)):
        try:
            data = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
            return None, (lineno, _clip(f"not valid JSON: {err}"))
    if not isinstance(data, dict):
        return None, (lineno, f"expected a JSON object, got {type(data).__name__}")
    oversize = _oversize(data, limits)
    if oversize:
        return None, (lineno, oversize)
    try:
        return _parse_record(data), None
    except pydantic.ValidationError as err:
        return None, (lineno, format_validation_error(err))


def _oversize(data: object, limits: ImportLimits) -> str:
    """The first string or container in ``data`` past the limits, as a message; "" if none."""
    stack: list[tuple[str, object]] = [("", data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str) and len(value) > limits.max_field_chars:
            return (
                f"field '{where}' holds {len(value):,} characters, over the limit of "
                f"{limits.max_field_chars:,} (--max-field-chars)"
            )
        if isinstance(value, str) and not value.isascii() and _has_surrogate(value):
            # JSON's \ud800 escapes decode to lone surrogates, which no store or export can encode
            return f"field '{where or 'record'}' holds a lone UTF-16 surrogate (a broken \\uXXXX escape); fix the text"
        if isinstance(value, (list, dict)):
            if len(value) > limits.max_items:
                return (
                    f"field '{where or 'record'}' holds {len(value):,} items, over the limit of "
                    f"{limits.max_items:,} (--max-items)"
                )
            items = value.items() if isinstance(value, dict) else enumerate(value)
            stack.extend((f"{where}.{k}" if where else str(k), v) for k, v in items)
    return ""


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _read_line(fh: BinaryIO, limit: int) -> tuple[bytes, bool]:
    """The next line, at most ``limit`` bytes held in memory; (b"", False) at the end of the file.

    A longer line is consumed in chunks and thrown away: (its first bytes, True).
    """
    raw = fh.readline(limit + 1)
    if len(raw) <= limit or raw.endswith(b"\n"):
        return raw, False
    while chunk := fh.readline(1 << 16):
        if chunk.endswith(b"\n"):
            break
    return raw[:64], True


def _jsonl_records(path: Path, limits: ImportLimits) -> Iterator[tuple[int, object]]:
    with path.open("rb") as fh:
        lineno = 0
        while True:
            raw, too_long = _read_line(fh, limits.max_line_bytes)
            if not raw:
                return
            lineno += 1
            if too_long:
                raise _over(
                    path,
                    f"line {lineno} is longer than {limits.max_line_bytes:,} bytes",
                    "max_line_bytes",
                    limits.max_line_bytes,
                )
            if raw.strip():
                yield lineno, raw


def _check_file_size(path: Path, limits: ImportLimits) -> None:
    size = path.stat().st_size
    if size > limits.max_file_bytes:
        raise _over(path, f"the file is {size:,} bytes", "max_file_bytes", limits.max_file_bytes)


def _json_records(path: Path, limits: ImportLimits) -> Iterator[tuple[int, object]]:
    _check_file_size(path, limits)
    try:
        data = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise ImportFileError(_clip(f"{path}: not valid JSON ({err}); fix the file"), [(0, "not valid JSON")]) from None
    if isinstance(data, dict):
        data = [data]  # one case on its own
    if not isinstance(data, list):
        raise ImportFileError(
            f"{path}: expected a JSON array of cases (or one case object), got {type(data).__name__}",
            [(0, "not an array")],
        )
    for item, record in enumerate(data, start=1):
        if len(json.dumps(record)) > limits.max_line_bytes:
            raise _over(
                path,
                f"item {item} is longer than {limits.max_line_bytes:,} bytes",
                "max_line_bytes",
                limits.max_line_bytes,
            )
        yield item, record


def _parquet_records(path: Path, limits: ImportLimits) -> Iterator[tuple[int, object]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    _check_file_size(path, limits)
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as err:
        raise ImportFileError(
            _clip(f"{path}: not a Remedy Parquet file ({err}); export one with `remedy kb export FILE.parquet`"),
            [(0, _clip(str(err)))],
        ) from None
    if "case_json" not in schema.names:
        raise ImportFileError(
            f"{path}: no 'case_json' column (columns: {', '.join(schema.names) or 'none'}); "
            "a Remedy Parquet file holds one case as JSON text per row in 'case_json'",
            [(0, "no case_json column")],
        )
    kind = schema.field("case_json").type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise ImportFileError(
            f"{path}: column 'case_json' has type {kind}, but must hold strings (one case as JSON text per row)",
            [(0, f"case_json is {kind}")],
        )
    try:
        table = pq.read_table(path, columns=["case_json"])
    except (pa.ArrowException, OSError) as err:
        raise ImportFileError(_clip(f"{path}: unreadable Parquet data ({err})"), [(0, _clip(str(err)))]) from None
    for row, text in enumerate(table.column("case_json").to_pylist(), start=1):
        if text is not None and len(text) > limits.max_line_bytes:
            raise _over(
                path,
                f"row {row} is longer than {limits.max_line_bytes:,} bytes",
                "max_line_bytes",
                limits.max_line_bytes,
            )
        yield row, text if text is not None else "null"


_READERS = {".jsonl": _jsonl_records, ".json": _json_records, ".parquet": _parquet_records}


def read_cases(
    path: Path | str, skip_invalid: bool = False, limits: ImportLimits | None = None
) -> tuple[list[Case], list[Problem]]:
    """Read and validate every case in a ``.jsonl``, ``.json`` or ``.parquet`` file.

    Returns the valid cases and the problems, one ``(line, message)`` per bad
    record (duplicate ``case_id`` within the file counts as one). Unless
    ``skip_invalid``, any problem raises :class:`ImportFileError` naming each
    bad line, so a caller never sees half a file. A file past ``limits``
    raises :class:`ImportFileError` naming the limit, even with ``skip_invalid``.
    """
    path = Path(path)
    ext = _check_format(path)
    limits = limits or ImportLimits()
    if not path.is_file():
        raise ImportFileError(f"{path}: no such file", [(0, "no such file")])
    cases: list[Case] = []
    problems: list[tuple[int, str]] = []
    seen: dict[str, int] = {}
    for n, (lineno, text) in enumerate(_READERS[ext](path, limits), start=1):
        if n > limits.max_cases:
            raise _over(path, f"more than {limits.max_cases:,} records", "max_cases", limits.max_cases)
        case, problem = _validate(lineno, text, limits)
        if case is not None and case.case_id in seen:
            problem = (lineno, f"duplicate case_id {case.case_id!r} (first on line {seen[case.case_id]})")
        if problem is not None or case is None:
            problems.append(problem or (lineno, "no case"))
            continue
        seen[case.case_id] = lineno
        cases.append(case)
    if problems and not skip_invalid:
        raise ImportFileError(_import_message(path, problems), problems)
    return cases, problems


def _import_message(path: Path, problems: Sequence[Problem], shown: int = 5) -> str:
    unit = {".parquet": "row", ".json": "item"}.get(path.suffix.lower(), "line")
    head = "; ".join(f"{unit} {n}: {msg}" for n, msg in problems[:shown])
    rest = problems[shown:]
    more = f"; also {unit}s {', '.join(str(n) for n, _ in rest)}" if rest else ""
    return (
        f"{path}: {len(problems)} invalid record(s), nothing imported ({head}{more}); "
        "fix them or pass --skip-invalid to import the valid ones"
    )


def write_cases(path: Path | str, cases: Iterable[Case]) -> int:
    """Write cases to ``.jsonl``, ``.json`` or ``.parquet`` (by extension), atomically; returns the count."""
    path = Path(path)
    ext = _check_format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        writer = {".jsonl": _write_jsonl, ".json": _write_json, ".parquet": _write_parquet}[ext]
        n = writer(tmp, cases)
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


def _write_json(path: Path, cases: Iterable[Case]) -> int:
    n = 0
    with path.open("w", encoding="utf-8") as fh:
        fh.write("[")
        for case in cases:
            fh.write(("," if n else "") + "\n" + case_to_json(case))
            n += 1
        fh.write("\n]\n")
    return n


def summary_columns(case: Case) -> dict[str, Any]:
    """The columns a case is filtered and counted by; shared by the store's table and the Parquet export."""
    return {
        "case_id": case.case_id,
        "source": case.source.value,
        "env_id": case.subject.env_id,
        "algo": case.subject.algo,
        "status": case.status,
        "effect": case.effect_value,
        "root_causes": [r.value for r in case.root_causes],
    }


def summary_fields() -> list[tuple[str, Any]]:
    """Arrow types of :func:`summary_columns`, in order (pyarrow is imported only when asked)."""
    import pyarrow as pa

    return [
        ("case_id", pa.string()),
        ("source", pa.string()),
        ("env_id", pa.string()),
        ("algo", pa.string()),
        ("status", pa.string()),
        ("effect", pa.float64()),
        ("root_causes", pa.list_(pa.string())),
    ]


def _write_parquet(path: Path, cases: Iterable[Case]) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{**summary_columns(c), "summary": c.signature.summary, "case_json": case_to_json(c)} for c in cases]
    schema = pa.schema([*summary_fields(), ("summary", pa.string()), ("case_json", pa.string())])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return len(rows)
