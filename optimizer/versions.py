"""Program versions: what each optimization run produced, which one is active, and the way back.

Stored in the KB's DuckDB file next to the cases (tables created on first use, so older KBs open
unchanged): ``programs`` holds one row per run, promoted or not (backend, optimizer, the
parameters or the saved DSPy program, train/validation sizes, the validation score of the version
that was active then and of the new one, the decision and why), and ``program_activations`` is
the stack of activations per backend. The active version of a backend is the top of its stack;
:meth:`ProgramStore.rollback` pops it, so repeated rollbacks walk back through earlier versions
to the built-in defaults.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from remedy.cases.errors import OptimizeError
from remedy.cases.store import CaseStore
from remedy.retrieval.offline import OfflineSettings

__all__ = ["ProgramVersion", "ProgramStore", "promotion_decision", "active_offline", "BACKENDS", "DEFAULT_MARGIN"]

#: kinds of stored program a version can belong to: a diagnoser's ``program_kind`` (``offline``, ``llm``;
#: asked through :func:`remedy.retrieval.diagnosis.program_kind`, never read off its name) or ``ranker`` (the
#: remedy ranker, ``remedy.optimizer.ranker``)
BACKENDS = ("offline", "llm", "ranker")
#: how much a new version must beat the active one on validation to be promoted
DEFAULT_MARGIN = 0.02

_TABLES = (
    """
    CREATE TABLE IF NOT EXISTS programs (
        id          VARCHAR PRIMARY KEY,
        seq         INTEGER NOT NULL,
        backend     VARCHAR NOT NULL,
        optimizer   VARCHAR NOT NULL,
        parameters  JSON,
        program     VARCHAR,
        train_size  INTEGER NOT NULL,
        val_size    INTEGER NOT NULL,
        active_val  DOUBLE,
        new_val     DOUBLE NOT NULL,
        promoted    BOOLEAN NOT NULL,
        reason      VARCHAR NOT NULL,
        parent      VARCHAR,
        seed        INTEGER,
        trials      INTEGER,
        created_at  TIMESTAMPTZ NOT NULL
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS program_activations (
        seq         INTEGER PRIMARY KEY,
        backend     VARCHAR NOT NULL,
        program_id  VARCHAR,
        activated_at TIMESTAMPTZ NOT NULL
    )
    """,
)
_COLUMNS = (
    "id, backend, optimizer, parameters::VARCHAR, program, train_size, val_size, active_val, new_val, "
    "promoted, reason, parent, seed, trials, created_at"
)


@dataclass(frozen=True)
class ProgramVersion:
    """One optimization run's program: its settings or saved program, its scores, and whether it is active."""

    id: str
    backend: str
    optimizer: str
    parameters: dict[str, Any] | None  # OfflineSettings as JSON (offline backend); the fitted RemedyRanker (ranker)
    program: str | None  # the saved DSPy program, JSON text (llm backend)
    train_size: int
    val_size: int
    active_val: float | None  # validation score of the version active when this one was made
    new_val: float  # validation score of this version
    promoted: bool  # whether the run promoted it (activate/rollback may change what is active later)
    reason: str
    parent: str | None  # the version active when this one was made (None: the built-in defaults)
    seed: int | None
    trials: int | None
    created_at: datetime
    active: bool = False

    def offline_settings(self) -> OfflineSettings:
        """The version's OfflineSettings (an offline version only)."""
        if self.backend != "offline" or self.parameters is None:
            raise OptimizeError(f"program version {self.id} is a {self.backend} program, not offline settings")
        return OfflineSettings.model_validate(self.parameters)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (dates as ISO text)."""
        return {**asdict(self), "created_at": self.created_at.isoformat()}


def promotion_decision(active_val: float | None, new_val: float, margin: float) -> tuple[bool, str]:
    """Promote only when ``new_val >= active_val + margin``; (decision, why in one sentence)."""
    base = 0.0 if active_val is None else active_val
    if new_val >= base + margin - 1e-12:
        return True, f"validation {new_val:.3f} >= active {base:.3f} + margin {margin:g}"
    return False, f"validation {new_val:.3f} < active {base:.3f} + margin {margin:g}: the active version stays"


class ProgramStore:
    """Program versions in the KB's store; every method opens and closes its own connection."""

    def __init__(self, store: CaseStore) -> None:
        self.store = store
        with store.connection() as con:
            for sql in _TABLES:
                con.execute(sql)

    def add(
        self,
        *,
        backend: str,
        optimizer: str,
        train_size: int,
        val_size: int,
        active_val: float | None,
        new_val: float,
        promote: bool,
        reason: str,
        parameters: dict[str, Any] | None = None,
        program: str | None = None,
        seed: int | None = None,
        trials: int | None = None,
    ) -> ProgramVersion:
        """Store a run's version (and activate it when ``promote``); returns it as stored."""
        _check_backend(backend)
        blob = json.dumps([backend, optimizer, parameters, program], sort_keys=True, default=str)
        now = datetime.now(UTC)
        with self.store.connection() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                seq = int(_one(con, "SELECT coalesce(max(seq), 0) + 1 FROM programs"))
                vid = f"p{seq}-{hashlib.sha256(blob.encode()).hexdigest()[:8]}"
                parent = self._active_id(con, backend)
                con.execute(
                    "INSERT INTO programs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [vid, seq, backend, optimizer, None if parameters is None else json.dumps(parameters), program,
                     train_size, val_size, active_val, new_val, promote, reason, parent, seed, trials, now],
                )  # fmt: skip
                if promote:
                    self._push(con, backend, vid, now)
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        return self.get(vid)

    def list(self, backend: str | None = None) -> list[ProgramVersion]:
        """Every version (of ``backend``, or all), oldest first."""
        where, args = ("WHERE backend = ?", [backend]) if backend else ("", [])
        with self.store.connection() as con:
            rows = con.execute(f"SELECT {_COLUMNS} FROM programs {where} ORDER BY seq", args).fetchall()
            active = {b: self._active_id(con, b) for b in BACKENDS}
        return [_version(r, active) for r in rows]

    def get(self, version_id: str) -> ProgramVersion:
        """The version with this id, or with this ``pN`` prefix; :class:`OptimizeError` naming the known ids if none."""
        with self.store.connection() as con:
            rows = con.execute(
                f"SELECT {_COLUMNS} FROM programs WHERE id = ? OR starts_with(id, ?) ORDER BY seq",
                [version_id, f"{version_id}-"],
            ).fetchall()
            active = {b: self._active_id(con, b) for b in BACKENDS}
            known = [r[0] for r in con.execute("SELECT id FROM programs ORDER BY seq DESC LIMIT 5").fetchall()]
        if len(rows) != 1:
            hint = f"known: {', '.join(known)}" if known else "none stored yet; run `remedy optimize`"
            raise OptimizeError(f"no program version {version_id!r} in {self.store.path.parent} ({hint})")
        return _version(rows[0], active)

    def active(self, backend: str = "offline") -> ProgramVersion | None:
        """The active version of ``backend``, or None (the built-in defaults are in force)."""
        with self.store.connection() as con:
            vid = self._active_id(con, backend)
        return None if vid is None else self.get(vid)

    def activate(self, version_id: str) -> ProgramVersion:
        """Make a stored version the active one of its backend (pushed on the activation stack)."""
        version = self.get(version_id)
        with self.store.connection() as con:
            self._push(con, version.backend, version.id, datetime.now(UTC))
        return self.get(version.id)

    def rollback(self, backend: str = "offline") -> ProgramVersion | None:
        """Undo the last activation of ``backend``: the version active before it, or None (the defaults)."""
        _check_backend(backend)
        with self.store.connection() as con:
            top = con.execute(
                "SELECT seq FROM program_activations WHERE backend = ? ORDER BY seq DESC LIMIT 1", [backend]
            ).fetchone()
            if top is None:
                raise OptimizeError(f"nothing to roll back: the built-in {backend} defaults are already in force")
            con.execute("DELETE FROM program_activations WHERE seq = ?", [top[0]])
        return self.active(backend)

    def last_run_at(self, backend: str | None = None) -> datetime | None:
        """When the last version (of ``backend``, or any) was stored: the last optimization run."""
        where, args = ("WHERE backend = ?", [backend]) if backend else ("", [])
        with self.store.connection() as con:
            return _one(con, f"SELECT max(created_at) FROM programs {where}", args)

    @staticmethod
    def _active_id(con: Any, backend: str) -> str | None:
        row = con.execute(
            "SELECT program_id FROM program_activations WHERE backend = ? ORDER BY seq DESC LIMIT 1", [backend]
        ).fetchone()
        return None if row is None else row[0]

    @staticmethod
    def _push(con: Any, backend: str, version_id: str | None, at: datetime) -> None:
        seq = int(_one(con, "SELECT coalesce(max(seq), 0) + 1 FROM program_activations"))
        con.execute("INSERT INTO program_activations VALUES (?, ?, ?, ?)", [seq, backend, version_id, at])


def active_offline(store: CaseStore) -> ProgramVersion | None:
    """The active offline program version of the KB whose store is ``store`` (None: the built-in defaults)."""
    return ProgramStore(store).active("offline")


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise OptimizeError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")


def _one(con: Any, sql: str, args: list[Any] | None = None) -> Any:
    row = con.execute(sql, args or []).fetchone()
    return None if row is None else row[0]


def _version(row: tuple[Any, ...], active: dict[str, str | None]) -> ProgramVersion:
    (vid, backend, optimizer, params, program, n_train, n_val, active_val, new_val, promoted, reason, parent,
     seed, trials, created) = row  # fmt: skip
    return ProgramVersion(
        id=vid,
        backend=backend,
        optimizer=optimizer,
        parameters=None if params is None else json.loads(params),
        program=program,
        train_size=int(n_train),
        val_size=int(n_val),
        active_val=active_val,
        new_val=float(new_val),
        promoted=bool(promoted),
        reason=reason,
        parent=parent,
        seed=seed,
        trials=trials,
        created_at=created.astimezone(UTC),
        active=active.get(backend) == vid,
    )
