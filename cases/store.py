"""The store of record: every case, in one DuckDB file.

DuckDB lets one process hold the file and blocks every other process, readers
included, so each operation opens a connection, does its work and closes it.
A process that finds the file locked retries for about two seconds and then
raises :class:`KBLockedError` naming the holder's PID.

The full case lives in ``body`` (JSON); a few flat columns copy what filters
and statistics need. The schema is versioned in ``meta``: opening an older
file applies :data:`MIGRATIONS` inside one transaction; a file written by a
newer Remedy is refused.

A KB whose directory cannot be written (a read-only mount) is opened read-only,
so every read works and a write fails with one clear line. A full disk during a
write is one :class:`DiskFullError` line; the transaction is rolled back.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import duckdb
import pyarrow as pa

from .errors import (
    CaseNotFoundError,
    DiskFullError,
    KBError,
    KBLockedError,
    KBPathError,
    KBVersionError,
    ValidationError,
    is_disk_full,
)
from .io import case_from_json, case_to_json, summary_columns, summary_fields
from .model import Case

__all__ = [
    "CaseStore",
    "StoreStats",
    "AddCounts",
    "MIGRATIONS",
    "STORE_SCHEMA_VERSION",
    "LOCK_TIMEOUT_S",
    "MARKER",
    "SERVE_MARKER",
    "live_service",
]

_PID = re.compile(r"PID (\d+)")
#: writes to each store file by this process (see :meth:`CaseStore.writes`)
_WRITES: dict[str, int] = {}
#: ``meta`` row that says "this DuckDB file is a Remedy KB"; a file with tables but without it is foreign
MARKER = ("application", "remedy")
_SQLITE_MAGIC = b"SQLite format 3\x00"
_DUCKDB_MAGIC = b"DUCK"  # at bytes 8-11 of every DuckDB file
# Never let DuckDB fetch or load an extension on its own: a foreign file (SQLite, ...) would make it
# try to download a scanner, which hangs without network and reads someone else's data with it.
_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}
#: seconds to keep retrying a locked file before giving up
LOCK_TIMEOUT_S = 2.0
#: file in the KB directory that `remedy serve` writes while it owns the KB: ``{"url", "pid"}``
SERVE_MARKER = "serve.json"
#: a prefix of a generated id (``c-`` + hex, as the CLI tables show them) that `get` resolves when unique
_SHORT_ID = re.compile(r"c-[0-9a-f]{6,15}")


def _v0_to_v1(con: duckdb.DuckDBPyConnection) -> None:
    """Cases table with flat filter columns and the full case as JSON."""
    con.execute(
        """
        CREATE TABLE cases (
            case_id      VARCHAR PRIMARY KEY,
            created_at   TIMESTAMPTZ,
            source       VARCHAR NOT NULL,
            env_id       VARCHAR NOT NULL,
            action_space VARCHAR NOT NULL,
            algo         VARCHAR NOT NULL,
            status       VARCHAR NOT NULL,
            effect       DOUBLE,
            root_causes  VARCHAR[],
            scenario     VARCHAR,
            body         JSON NOT NULL
        )
        """
    )
    # ART indexes pay off on selective columns only; low-cardinality filters use zone maps.
    con.execute("CREATE INDEX cases_env ON cases (env_id)")
    con.execute("CREATE INDEX cases_scenario ON cases (scenario)")


#: ``MIGRATIONS[i]`` upgrades schema ``i`` to ``i + 1``; append, never edit.
MIGRATIONS: list[Callable[[duckdb.DuckDBPyConnection], None]] = [_v0_to_v1]
#: schema version this code writes
STORE_SCHEMA_VERSION = len(MIGRATIONS)


class AddCounts(NamedTuple):
    """Result of an upsert: ``added`` rows written (new or changed), ``unchanged`` identical ones."""

    added: int
    unchanged: int


@dataclass(frozen=True)
class StoreStats:
    """Case counts overall and by source, status, env and root cause."""

    total: int
    by_source: dict[str, int] = field(default_factory=dict)
    by_status: dict[str, int] = field(default_factory=dict)
    by_env: dict[str, int] = field(default_factory=dict)
    by_root_cause: dict[str, int] = field(default_factory=dict)


# the export's summary columns plus what the store also filters on, and the case itself (``body``)
_ARROW_SCHEMA = pa.schema(
    [
        *summary_fields(),
        ("created_at", pa.timestamp("us", tz="UTC")),
        ("action_space", pa.string()),
        ("scenario", pa.string()),
        ("body", pa.string()),
    ]
)


def _row(case: Case) -> dict:
    return {
        **summary_columns(case),
        "created_at": case.provenance.created_at,
        "action_space": case.subject.traits.action_space.value,
        "scenario": case.scenario,
        "body": case_to_json(case),
    }


def _id_table(ids: Iterable[str]) -> pa.Table:
    return pa.table({"id": pa.array(list(dict.fromkeys(ids)), type=pa.string())})


class CaseStore:
    """Cases in one DuckDB file; every method opens and closes its own connection."""

    def __init__(self, path: Path | str, create: bool = True, lock_timeout: float = LOCK_TIMEOUT_S) -> None:
        """Open (and create or upgrade) the store at ``path``, the ``remedy.duckdb`` file.

        ``lock_timeout``: how long to keep retrying while another process holds the file.
        """
        self.path = Path(path)
        self.lock_timeout = lock_timeout
        self._kb = self.path.parent if self.path.name == "remedy.duckdb" else self.path
        if not create and not self.path.exists():
            raise KBError(f"no case store at {self.path}; run `remedy kb init` first")
        #: True when the file or its directory cannot be written: opened read-only, reads only
        self.read_only = self.path.exists() and not _writable(self.path)
        self._check_header()
        self._migrate()

    # -- connections ---------------------------------------------------------------

    def hold(self) -> duckdb.DuckDBPyConnection:
        """A connection the caller keeps open and closes (the service holds one for its whole run,
        which makes it the file's owner); opened with the store's own settings, so the store's
        short-lived connections in the same process can share the file."""
        return self._open_with_retry()

    def connection(self) -> AbstractContextManager[duckdb.DuckDBPyConnection]:
        """A short-lived connection (retrying while locked), for tables other modules own (tokens, jobs)."""
        return self._connect()

    @contextmanager
    def _connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        con = self._open_with_retry()
        try:
            try:
                yield con
            finally:
                con.close()  # may checkpoint, so it may hit a full disk too
        except (duckdb.Error, OSError) as err:
            mapped = self._write_failure(err)
            if mapped is None:
                raise
            raise mapped from None

    def _write_failure(self, err: BaseException) -> KBError | None:
        """A full disk or a read-only KB as one clear error; None for anything else."""
        if is_disk_full(err):
            return DiskFullError(
                f"no space left on device writing {self.path}; free space and retry; nothing was stored"
            )
        if self.read_only and "read-only" in str(err):
            return KBPathError(
                f"KB at {self._kb} is read-only (its directory cannot be written): reads work, writes do not; "
                "copy it somewhere writable (or remount it read-write) to change it"
            )
        return None

    def _open_with_retry(self) -> duckdb.DuckDBPyConnection:
        deadline, delay = time.monotonic() + self.lock_timeout, 0.05
        while True:
            try:
                return duckdb.connect(str(self.path), read_only=self.read_only, config=_CONFIG)
            except duckdb.IOException as err:
                msg = str(err)
                if is_disk_full(err):
                    raise DiskFullError(
                        f"no space left on device creating {self.path}; free space and retry; nothing was stored"
                    ) from None
                if "lock" not in msg.lower():
                    raise self._unreadable(msg) from None
                if time.monotonic() + delay > deadline:
                    raise self._locked(msg) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
            except duckdb.Error as err:
                raise self._unreadable(str(err)) from None

    def _unreadable(self, msg: str) -> KBError:
        first = (msg.splitlines() or ["unknown error"])[0]
        return KBError(f"cannot open {self.path} ({first}); move it away or point --kb elsewhere")

    def _locked(self, msg: str) -> KBLockedError:
        m = _PID.search(msg)
        pid = int(m.group(1)) if m else None
        who = f"PID {pid}" if pid is not None else "another process"
        served = _served_by(self._kb / SERVE_MARKER, pid)
        if served:
            return KBLockedError(
                f"KB at {self._kb} is served by `remedy serve` at {served} ({who}); go through it with "
                f"--server {served} (or REMEDY_SERVER={served}) and REMEDY_TOKEN",
                pid=pid,
            )
        return KBLockedError(f"KB at {self._kb} is locked by {who}; stop that process or use `remedy serve`", pid=pid)

    # -- schema --------------------------------------------------------------------

    def _check_header(self) -> None:
        """Refuse, before DuckDB touches it, a file that is not a DuckDB database at all."""
        if not self.path.exists():
            return
        if self.path.is_dir():
            raise KBPathError(f"{self.path} is a directory, not a case store; move it away or point --kb elsewhere")
        try:
            with self.path.open("rb") as fh:
                head = fh.read(16)
        except OSError as err:
            raise KBPathError(f"cannot read {self.path}: {err.strerror or err}; check its permissions") from None
        if not head:
            return  # an empty file: a KB being created
        if head.startswith(_SQLITE_MAGIC):
            raise KBPathError(
                f"{self.path} is an SQLite database, not a Remedy KB; left unchanged. "
                "Point --kb at a new directory (or an existing Remedy KB)"
            )
        if head[8:12] != _DUCKDB_MAGIC:
            raise KBPathError(
                f"{self.path} is not a DuckDB file, so not a Remedy KB; left unchanged. "
                "Point --kb at a new directory (or an existing Remedy KB)"
            )

    def _migrate(self) -> None:
        with self._connect() as con:
            version = self._version(con)
            if version > STORE_SCHEMA_VERSION:
                raise KBVersionError(
                    f"KB at {self._kb} was written by a newer Remedy (schema {version}, "
                    f"this one knows {STORE_SCHEMA_VERSION}); upgrade remedy"
                )
            if version == 0:
                self._refuse_foreign(con)
            if version == STORE_SCHEMA_VERSION:
                return
            if self.read_only:
                raise KBPathError(
                    f"KB at {self._kb} needs a schema upgrade ({version} -> {STORE_SCHEMA_VERSION}) but is "
                    "read-only; open it once where it can be written"
                )
            con.execute("BEGIN TRANSACTION")
            try:
                con.execute("CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
                for step in MIGRATIONS[version:]:
                    step(con)
                con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(STORE_SCHEMA_VERSION)])
                con.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", list(MARKER))
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise

    def _refuse_foreign(self, con: duckdb.DuckDBPyConnection) -> None:
        """A DuckDB file with tables but no Remedy schema version belongs to someone else: touch nothing."""
        tables = [
            r[0] for r in con.execute("SELECT table_name FROM information_schema.tables ORDER BY 1 LIMIT 4").fetchall()
        ]
        if tables:
            shown = ", ".join(tables[:3]) + (", ..." if len(tables) > 3 else "")
            raise KBPathError(
                f"{self.path} is a DuckDB database made by another program (tables {shown}), not a "
                "Remedy KB; left unchanged. Point --kb at a new directory (or an existing Remedy KB)"
            )

    @staticmethod
    def _version(con: duckdb.DuckDBPyConnection) -> int:
        has_meta = _first(
            con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'meta'").fetchone()
        )
        if not has_meta:
            return 0
        try:
            row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            return int(row[0]) if row else 0
        except (duckdb.Error, ValueError, TypeError):
            return 0  # someone else's `meta` table: _refuse_foreign names it

    def schema_version(self) -> int:
        """The schema version recorded in the file."""
        with self._connect() as con:
            return self._version(con)

    # -- writes --------------------------------------------------------------------

    def add(self, case: Case) -> bool:
        """Insert or replace one case; False if an identical case was already stored."""
        return self.add_many([case]).added == 1

    def add_many(self, cases: Iterable[Case]) -> AddCounts:
        """Upsert cases by id in one transaction; identical re-adds are left untouched."""
        written, unchanged = self.upsert(cases)
        return AddCounts(len(written), unchanged)

    def upsert(self, cases: Iterable[Case], replace: bool = True) -> tuple[list[str], int]:
        """Like :meth:`add_many`, but returns the ids actually written and the unchanged count.

        ``replace=False`` refuses (:class:`ValidationError` naming the ids, nothing written) when a
        case id is already stored with different content; identical cases stay unchanged.
        """
        rows = _dedupe([_checked_row(c) for c in cases])
        if not rows:
            return [], 0
        with self._connect() as con:
            existing = self._bodies(con, [r["case_id"] for r in rows])
            changed = [r for r in rows if existing.get(r["case_id"]) != r["body"]]
            if not replace:
                # the same computation run again (same id) differs only in when and how fast it ran:
                # that is the stored case, not a conflict, and it is left as it was
                changed = [r for r in changed if not _same_substance(existing.get(r["case_id"]), r["body"])]
                _refuse_conflicts(sorted(r["case_id"] for r in changed if r["case_id"] in existing))
            if changed:
                batch = pa.Table.from_pylist(changed, schema=_ARROW_SCHEMA)  # noqa: F841 (read by SQL)
                con.execute("BEGIN TRANSACTION")
                try:
                    con.execute("INSERT OR REPLACE INTO cases BY NAME SELECT * FROM batch")
                    con.execute("COMMIT")
                except BaseException:
                    con.execute("ROLLBACK")
                    raise
                finally:
                    self._wrote()
        return [r["case_id"] for r in changed], len(rows) - len(changed)

    def delete(self, case_ids: Iterable[str]) -> int:
        """Delete cases by id; returns how many were stored."""
        wanted = _id_table(case_ids)
        if wanted.num_rows == 0:
            return 0
        with self._connect() as con:
            n = _first(con.execute("SELECT count(*) FROM cases WHERE case_id IN (SELECT id FROM wanted)").fetchone())
            try:
                con.execute("DELETE FROM cases WHERE case_id IN (SELECT id FROM wanted)")
            finally:
                self._wrote()
        return int(n)

    def writes(self) -> int:
        """How many times this process has written cases to this file (any :class:`CaseStore` on it).

        A cache of stored cases compares it to know when to drop what it holds. Writes by other
        processes are not counted: they cannot happen while this process holds the file
        (:meth:`hold`, as ``remedy serve`` does), which is when such a cache is kept.
        """
        return _WRITES.get(os.path.abspath(self.path), 0)

    def _wrote(self) -> None:
        key = os.path.abspath(self.path)
        _WRITES[key] = _WRITES.get(key, 0) + 1

    # -- reads ---------------------------------------------------------------------

    @staticmethod
    def _bodies(con: duckdb.DuckDBPyConnection, ids: Iterable[str]) -> dict[str, str]:
        wanted = _id_table(ids)  # noqa: F841 (read by SQL)
        rows = con.execute(
            "SELECT case_id, body::VARCHAR FROM cases WHERE case_id IN (SELECT id FROM wanted)"
        ).fetchall()
        return dict(rows)

    def get(self, case_id: str) -> Case:
        """The case with this id; :class:`CaseNotFoundError` (with suggestions) if none."""
        with self._connect() as con:
            row = con.execute("SELECT body::VARCHAR FROM cases WHERE case_id = ?", [case_id]).fetchone()
            if row is not None:
                return case_from_json(row[0])
            close = self._near(con, case_id)
            if len(close) == 1 and close[0].startswith(case_id) and _SHORT_ID.fullmatch(case_id):
                return self.get(close[0])  # a unique short id, like a short git hash
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else "; list ids with `remedy query`"
        raise CaseNotFoundError(f"no case {case_id!r} in {self._kb}{hint}")

    @staticmethod
    def _near(con: duckdb.DuckDBPyConnection, case_id: str) -> list[str]:
        # A typed prefix (like a short git hash) first, then ids within a few edits.
        rows = con.execute(
            "SELECT case_id FROM cases WHERE starts_with(case_id, ?) ORDER BY case_id LIMIT 3", [case_id]
        ).fetchall()
        if not rows:
            rows = con.execute(
                "SELECT case_id FROM cases WHERE levenshtein(case_id, ?) <= 3 "
                "ORDER BY levenshtein(case_id, ?), case_id LIMIT 3",
                [case_id, case_id],
            ).fetchall()
        return [r[0] for r in rows]

    def get_many(self, case_ids: Iterable[str]) -> list[Case]:
        """The stored cases among ``case_ids``, in the order given (missing ids are skipped)."""
        ids = list(dict.fromkeys(case_ids))
        if not ids:
            return []
        with self._connect() as con:
            bodies = self._bodies(con, ids)
        return [case_from_json(bodies[i]) for i in ids if i in bodies]

    def existing(self, case_ids: Iterable[str]) -> set[str]:
        """Which of ``case_ids`` are stored."""
        with self._connect() as con:
            return set(self._bodies(con, case_ids))

    def ids(self) -> set[str]:
        """Every stored case id."""
        with self._connect() as con:
            return {r[0] for r in con.execute("SELECT case_id FROM cases").fetchall()}

    def count(self) -> int:
        """Number of stored cases."""
        with self._connect() as con:
            return int(_first(con.execute("SELECT count(*) FROM cases").fetchone()))

    def iter_cases(self, batch: int = 500) -> Iterator[Case]:
        """Every case in id order, fetched in batches; no connection is held between batches."""
        after = ""
        while True:
            with self._connect() as con:
                rows = con.execute(
                    "SELECT case_id, body::VARCHAR FROM cases WHERE case_id > ? ORDER BY case_id LIMIT ?",
                    [after, batch],
                ).fetchall()
            if not rows:
                return
            for _, body in rows:
                yield case_from_json(body)
            after = rows[-1][0]

    def stats(self) -> StoreStats:
        """Counts overall and by source, status, env and root cause."""
        with self._connect() as con:
            total = int(_first(con.execute("SELECT count(*) FROM cases").fetchone()))
            by = {
                col: self._counts(con, f"SELECT {col}, count(*) FROM cases GROUP BY 1")
                for col in ("source", "status", "env_id")
            }
            causes = self._counts(
                con, "SELECT rc, count(*) FROM (SELECT unnest(root_causes) AS rc FROM cases) GROUP BY 1"
            )
        return StoreStats(total, by["source"], by["status"], by["env_id"], causes)

    @staticmethod
    def _counts(con: duckdb.DuckDBPyConnection, sql: str) -> dict[str, int]:
        rows = con.execute(sql + " ORDER BY 2 DESC, 1").fetchall()
        return {str(k): int(v) for k, v in rows}


def _writable(path: Path) -> bool:
    """Whether this process may write ``path`` and its directory (DuckDB writes a WAL beside the file).

    The one probe for read-only KBs, so tests can stand in for a read-only mount (root ignores modes)."""
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)


def live_service(kb_dir: Path) -> str:
    """The URL a running `remedy serve` of the KB at ``kb_dir`` wrote in its marker, or "" (no marker,
    or its process is gone)."""
    return _served_by(Path(kb_dir) / SERVE_MARKER, None)


def _served_by(marker: Path, pid: int | None) -> str:
    """The URL in the service's marker file when that service is the lock holder, else ""."""
    try:
        info = json.loads(marker.read_text())
        url, owner = str(info["url"]), int(info["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    if pid is not None:
        return url if owner == pid else ""
    try:  # DuckDB did not name the holder: trust the marker only if its process still lives
        os.kill(owner, 0)
    except ProcessLookupError:
        return ""
    except PermissionError:
        pass
    return url


def _first(row: tuple[Any, ...] | None) -> Any:  # DuckDB rows are untyped tuples
    """The first column of a row a query always returns (e.g. a ``count(*)``)."""
    if row is None:
        raise KBError("the KB returned no row where one was expected")
    return row[0]


def _checked_row(case: Case) -> dict:
    row = _row(case)
    # A body that cannot be read back would be a case lost on the next read: refuse it now.
    try:
        case_from_json(row["body"])
    except Exception as err:
        raise ValidationError(
            f"case {case.case_id!r} does not survive a JSON round trip ({str(err).splitlines()[0]}); "
            "fix the offending field"
        ) from None
    return row


#: what a re-run of the same computation may change: the machine's clock and speed, not the outcome
_VOLATILE = (("provenance", "created_at"), ("verification", "wall_time_s"), ("verification", "race", "wall_time_s"))


def _same_substance(stored: str | None, body: str) -> bool:
    """True when two case bodies differ at most in :data:`_VOLATILE` fields."""
    if stored is None:
        return False
    a, b = json.loads(stored), json.loads(body)
    for path in _VOLATILE:
        for doc in (a, b):
            node = doc
            for key in path[:-1]:
                node = node.get(key) if isinstance(node, dict) else None
            if isinstance(node, dict):
                node.pop(path[-1], None)
    return bool(a == b)


def _refuse_conflicts(ids: list[str]) -> None:
    """One line naming the ids already stored with other content; nothing was written."""
    if not ids:
        return
    shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
    raise ValidationError(
        f"{len(ids)} case id(s) already stored with different content ({shown}); nothing imported. "
        "Import with --replace to overwrite them, or give the new cases new ids"
    )


def _dedupe(rows: list[dict]) -> list[dict]:
    # Last one wins, as in a sequence of single upserts.
    return list({r["case_id"]: r for r in rows}.values())
