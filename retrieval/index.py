"""The vector / full-text / hybrid index over case signatures, in LanceDB.

One Lance table, ``signatures``, holds a row per case: the embedding of the signature text (summary plus
symptom tags), that text for full-text search, and the columns retrieval filters on. The table is derived
data: every row can be rebuilt from the store of record (:meth:`VectorIndex.rebuild`).

Index policy. Below ``ann_min_rows`` rows every vector search is an exact flat scan (fast enough, and no ANN
index can beat exact recall). Once the table has that many rows an HNSW index (scalar-quantized, cosine) is
built. Rows written after an index build are still found -- Lance scans them flat -- until the index is
refreshed. :meth:`VectorIndex.upsert` refreshes it by itself (calls :meth:`VectorIndex.optimize`) when
enough rows have arrived since the last build, so callers never have to; calling :meth:`optimize` yourself
is harmless. Filtered searches whose filter leaves few rows skip the ANN index and scan those rows exactly,
so a narrow filter never costs recall.

One writer at a time. Concurrent Lance commits from several processes (imports racing a reindex) left
duplicate rows and "Retryable commit conflict" errors, so every write holds :func:`write_lock`, a file lock
beside the index directory (``<kb>/index.lock``), shared by the threads and processes of one machine.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock, Timeout

from .offline_env import offline_defaults

offline_defaults()  # LANCEDB_LOG is read when lancedb is imported

import lancedb  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
from lancedb.index import FTS, HnswSq  # noqa: E402

from remedy.cases.errors import (  # noqa: E402
    DiskFullError,
    IndexMismatchError,
    KBError,
    KBPathError,
    RemedyError,
    is_disk_full,
)
from remedy.cases.model import Case, Signature  # noqa: E402

from .embedder import Embedder  # noqa: E402

__all__ = [
    "ANN_MIN_ROWS",
    "DEFAULT_EF",
    "DEFAULT_REFINE",
    "TABLE",
    "SearchFilters",
    "Hit",
    "VectorIndex",
    "signature_text",
    "case_text",
    "write_lock",
    "LOCK_TIMEOUT_S",
]

#: Table name inside the Lance directory.
TABLE = "signatures"
#: Build the ANN index only from this many rows; below it search is exact (flat).
ANN_MIN_ROWS = 5_000
#: HNSW search breadth. bench/retrieval.py at 100k: ef 160 gave recall@10 0.93, ef 320 0.96, at
#: about the same latency (the query's fixed costs dominate), both with refine_factor 2.
DEFAULT_EF = 320
#: Re-rank this many times k candidates on the full-precision vectors (undoes SQ rounding); None = off.
DEFAULT_REFINE: int | None = 2
#: A filter that leaves at most this many rows is searched exactly instead of through the ANN index.
EXACT_FILTER_ROWS = 5_000
#: Refresh indexes once this many rows (and at least this fraction of the table) are unindexed.
REFRESH_MIN_ROWS = 1_000
REFRESH_FRACTION = 0.10
#: Each refresh adds a delta graph that every query searches; past this many, rebuild the ANN index whole.
MAX_ANN_DELTAS = 4
_META = "meta.json"
_MODES = ("vector", "hybrid", "text")
_UPSERT_CHUNK = 2_048  # rows per merge_insert: each is one Lance version/fragment
#: how long a write waits for another process's index write (a reindex of a large KB takes minutes)
LOCK_TIMEOUT_S = 900.0
_LOCKS: dict[str, FileLock] = {}
_LOCKS_GUARD = threading.Lock()


def write_lock(index_dir: Path) -> FileLock:
    """The file lock every write to the index at ``index_dir`` holds (``<index_dir>.lock``, beside it, so
    a reindex may delete the directory while holding it). One object per path in a process: the lock
    is re-entrant within a thread and excludes other threads and processes."""
    path = str(Path(index_dir).resolve().with_name(Path(index_dir).name + ".lock"))
    with _LOCKS_GUARD:
        if path not in _LOCKS:
            _LOCKS[path] = FileLock(path, timeout=LOCK_TIMEOUT_S)
        return _LOCKS[path]


@contextmanager
def holding(lock: FileLock, index_dir: Path) -> Iterator[None]:
    """Hold ``lock``; waiting past its timeout becomes a KBError that says who to wait for."""
    try:
        lock.acquire()
    except Timeout:
        raise KBError(
            f"the index at {index_dir} has been busy with another writer for {lock.timeout:.0f} s "
            f"(lock {lock.lock_file}); wait for that import or reindex to finish and retry"
        ) from None
    try:
        yield
    finally:
        lock.release()


@dataclass(frozen=True)
class SearchFilters:
    """Prefilters applied before ranking. ``None`` means "any"."""

    env_id: str | None = None
    action_space: str | None = None
    algo: str | None = None  # matched case-insensitively ("ppo" finds "PPO")
    status: str | None = None
    only_improved: bool = False  # same as status="improved"
    min_effect: float | None = None  # effect >= x; cases without a measured effect are excluded
    exclude_scenario: str | None = None  # drop cases of this fault scenario (benchmarks); null kept
    exclude_ids: frozenset[str] = field(default_factory=frozenset)

    def where(self) -> str | None:
        """The Lance SQL predicate for these filters, or ``None`` when nothing is filtered."""
        clauses = [f"{col} = {_sql_str(val)}" for col, val in self._equalities() if val is not None]
        if self.algo is not None:
            clauses.append(f"lower(algo) = {_sql_str(self.algo.lower())}")
        if self.only_improved:
            clauses.append("status = 'improved'")
        if self.min_effect is not None:
            clauses.append(f"effect >= {_sql_float(self.min_effect)}")
        if self.exclude_scenario is not None:
            clauses.append(f"(scenario IS NULL OR scenario <> {_sql_str(self.exclude_scenario)})")
        if self.exclude_ids:
            ids = ", ".join(_sql_str(i) for i in sorted(self.exclude_ids))
            clauses.append(f"id NOT IN ({ids})")
        return " AND ".join(clauses) or None

    def _equalities(self) -> list[tuple[str, str | None]]:
        return [("env_id", self.env_id), ("action_space", self.action_space), ("status", self.status)]


@dataclass(frozen=True)
class Hit:
    """One search result: the case id and the cosine similarity of its vector to the query."""

    case_id: str
    similarity: float


def signature_text(signature: Signature) -> str:
    """The text embedded and full-text indexed for a signature: summary plus symptom tags."""
    summary = signature.summary.strip()
    if not signature.symptoms:
        return summary
    tags = ", ".join(s.replace("_", " ") for s in signature.symptoms)
    return f"{summary} Symptoms: {tags}."


def case_text(case: Case) -> str:
    """The indexed text of a case (its signature's text)."""
    return signature_text(case.signature)


class VectorIndex:
    """Vector, full-text and hybrid search over case signatures, stored as one Lance table."""

    def __init__(
        self,
        path: Path,
        embedder: Embedder,
        *,
        ann_min_rows: int = ANN_MIN_ROWS,
        ef: int = DEFAULT_EF,
        refine_factor: int | None = DEFAULT_REFINE,
        reset: bool = False,
        read_only: bool = False,
    ) -> None:
        """Open or create the index at ``path`` (a directory).

        ``read_only`` (a KB on a read-only mount) opens it without writing anything; a write
        then fails with :class:`KBPathError`, and text search without a full-text index
        falls back to vectors.

        Raises :class:`IndexMismatchError` when the index was built with another
        model or dimension. ``reset=True`` discards whatever is there first (what
        ``remedy kb reindex`` does before :meth:`rebuild`).
        """
        self.path = Path(path)
        self.embedder = embedder
        self.ann_min_rows = ann_min_rows
        self.ef = ef
        self.refine_factor = refine_factor
        self.read_only = read_only
        if self.path.exists() and not self.path.is_dir():
            raise KBError(f"index path {self.path} is a file; remove it or point --kb elsewhere")
        self._lock = write_lock(self.path)
        if reset:
            with self.writing():
                shutil.rmtree(self.path, ignore_errors=True)
        with self._disk_full():
            if not read_only:
                self.path.mkdir(parents=True, exist_ok=True)
            # timedelta(0): every query sees commits made by other handles and processes.
            self._db = lancedb.connect(str(self.path), read_consistency_interval=timedelta(0))
            self._table = self._open_table()

    # ----- writing -------------------------------------------------------------------------

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Hold the index's write lock (re-entrant); the table is re-opened on entry, so this handle writes
        to what the previous holder left (a reindex in another process replaces the table)."""
        if self.read_only:
            raise KBPathError(
                f"the index at {self.path} is on a read-only KB: reads work, writes do not; "
                "copy the KB somewhere writable to change it"
            )
        outer = self._lock.is_locked
        with holding(self._lock, self.path), self._disk_full():
            if not outer and hasattr(self, "_table"):
                self._table = self._open_table()
            yield

    @contextmanager
    def _disk_full(self) -> Iterator[None]:
        """A full disk under a Lance write (an OSError, or Lance's "os error 28") as one DiskFullError."""
        try:
            yield
        except RemedyError:
            raise
        except Exception as err:
            if not is_disk_full(err):
                raise
            raise DiskFullError(
                f"no space left on device writing {self.path}; free space and retry; the index keeps its last "
                "complete version and catches up with the store of record at the next open"
            ) from None

    def upsert(self, cases: Sequence[Case], vectors: np.ndarray | None = None) -> None:
        """Insert or replace rows for ``cases`` (matched on case id).

        Embeds each case's signature text unless ``vectors`` (shape ``(len(cases), dim)``)
        is given. Refreshes the ANN/FTS indexes when enough new rows have arrived.
        """
        cases = list(cases)
        if not cases:
            return
        vecs = self._vectors_for(cases, vectors)  # embedded before taking the lock: other writers need not wait
        rows = self._rows(cases, vecs)
        with self.writing():
            for start in range(0, rows.num_rows, _UPSERT_CHUNK):
                chunk = rows.slice(start, _UPSERT_CHUNK)
                self._table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(chunk)
            self._maybe_optimize()

    def delete(self, case_ids: Iterable[str]) -> None:
        """Remove the rows of ``case_ids`` (unknown ids are ignored)."""
        ids = sorted(set(case_ids))
        if not ids:
            return
        with self.writing():
            for start in range(0, len(ids), 1_000):
                batch = ", ".join(_sql_str(i) for i in ids[start : start + 1_000])
                self._table.delete(f"id IN ({batch})")

    def rebuild(
        self,
        cases: Iterable[Case],
        batch_size: int = 256,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Drop every row and re-embed ``cases`` from scratch; returns the number of rows written.

        ``progress`` is called with the number of cases written after each batch. A case id
        given twice is written once (its first occurrence). Holds the write lock throughout.
        """
        with self.writing():
            self._db.drop_table(TABLE, ignore_missing=True)  # type: ignore[call-arg]  # the connection class takes it
            self._write_meta()
            self._table = self._create_table()
            seen: set[str] = set()
            it = iter(cases)
            while batch := list(islice(it, batch_size)):
                fresh = _first_of_each_id(batch, seen)
                if fresh:
                    self._table.add(self._rows(fresh, self._vectors_for(fresh, None)))
                if progress is not None:
                    progress(len(seen))
            self.optimize()
            return self.count()

    def optimize(self) -> None:
        """Build or refresh the indexes: FTS always, the ANN index once ``ann_min_rows`` is reached.

        Also compacts the small files many upserts leave behind.
        """
        with self.writing():
            self._optimize()

    def _optimize(self) -> None:
        n = self.count()
        if n == 0:
            return
        names = {i.name for i in self._table.list_indices()}
        if "text_idx" not in names:
            self._table.create_index("text", config=FTS(), name="text_idx")
        if "vector_idx" not in names and n >= self.ann_min_rows:
            self._build_ann()
            names.add("vector_idx")
        self._table.optimize(cleanup_older_than=timedelta(days=1))
        stats = self._table.index_stats("vector_idx") if "vector_idx" in names else None
        if stats is not None and stats.num_indices > MAX_ANN_DELTAS:
            self._build_ann()

    # ----- reading -------------------------------------------------------------------------

    def ids(self) -> set[str]:
        """Every case id in the index."""
        return self.id_census()[0]

    def id_census(self) -> tuple[set[str], set[str]]:
        """Every case id in the index, and those held by more than one row (a broken index)."""
        n = self.count()
        if n == 0:
            return set(), set()
        column = self._table.search().select(["id"]).limit(n).to_arrow().column("id")
        counts = pc.value_counts(column)
        many = pc.filter(counts.field("values"), pc.greater(counts.field("counts"), 1))
        return set(counts.field("values").to_pylist()), set(many.to_pylist())

    def count(self) -> int:
        """Number of rows."""
        return self._table.count_rows()

    def has_ann_index(self) -> bool:
        """Whether the ANN (HNSW) index has been built."""
        return any(i.name == "vector_idx" for i in self._table.list_indices())

    def search(
        self,
        vector: np.ndarray | None,
        k: int = 10,
        filters: SearchFilters = SearchFilters(),
        text: str | None = None,
        mode: str = "vector",
    ) -> list[Hit]:
        """The ``k`` nearest cases to ``vector`` (mode ``vector``), to ``text`` by BM25 (``text``),
        or both fused by reciprocal rank (``hybrid``), after ``filters``.

        ``Hit.similarity`` is always the cosine between the query vector and the hit's vector
        (for ``text`` without a vector it is 0.0). In hybrid mode reciprocal-rank fusion of the
        vector and BM25 results picks a pool of 2k candidates, which is then ordered by cosine.
        """
        if mode not in _MODES:
            raise ValueError(f"unknown search mode {mode!r}; use one of {', '.join(_MODES)}")
        if k <= 0 or self.count() == 0:
            return []
        q = None if vector is None else self._query_vector(vector)
        has_text = bool(text and text.strip())
        if mode == "text" or (mode == "hybrid" and q is None):
            return self._text_search(text, q, k, filters) if has_text else []
        if q is None:
            raise ValueError(f"{mode} search needs a query vector")
        if mode == "hybrid" and has_text:
            return self._hybrid_search(q, text, k, filters)  # type: ignore[arg-type]
        return self._vector_search(q, k, filters)

    # ----- internals: search ------------------------------------------------------------

    def _vector_search(self, q: np.ndarray, k: int, filters: SearchFilters) -> list[Hit]:
        query = self._table.search(q, vector_column_name="vector").distance_type("cosine")
        # a margin past k, so a group of equally similar cases (every attempt on one patient shares its
        # signature) is cut by the same rule every time, not by the engine's order among ties
        query = self._apply_ann(query, filters).select(["id", "vector", "_distance"]).limit(k + _TIE_MARGIN)
        return _by_cosine(_hits(self._filtered(query, filters).to_arrow(), q))[:k]

    def _text_search(self, text: str | None, q: np.ndarray | None, k: int, filters: SearchFilters) -> list[Hit]:
        if not self._ensure_fts():
            raise KBPathError(f"the index at {self.path} has no full-text index and is read-only; search by vector")
        query = self._table.search(text, query_type="fts").select(["id", "vector", "_score"]).limit(k)
        return _hits(self._filtered(query, filters).to_arrow(), q)

    def _hybrid_search(self, q: np.ndarray, text: str, k: int, filters: SearchFilters) -> list[Hit]:
        if not self._ensure_fts():
            return self._vector_search(q, k, filters)  # a read-only index without FTS: vectors alone
        query = (
            self._table.search(query_type="hybrid", vector_column_name="vector")
            .vector(q)
            .text(text)
            .distance_type("cosine")
        )
        # Fusion picks the candidate pool (keyword hits get in even when their cosine is
        # modest); the final order is by cosine so ranks agree with the similarity shown.
        pool = self._apply_ann(query, filters).select(["id", "vector"]).limit(max(2 * k, k + 10))
        hits = _hits(self._filtered(pool, filters).to_arrow(), q)
        return _by_cosine(hits)[:k]

    def _apply_ann(self, query: Any, filters: SearchFilters) -> Any:
        """Use the ANN index with our ef, unless there is none or the filter leaves few rows."""
        if not self.has_ann_index():
            return query
        where = filters.where()
        if where is not None and self._table.count_rows(where) <= EXACT_FILTER_ROWS:
            return query.bypass_vector_index()
        query = query.ef(self.ef)
        return query.refine_factor(self.refine_factor) if self.refine_factor else query

    @staticmethod
    def _filtered(query: Any, filters: SearchFilters) -> Any:
        where = filters.where()
        return query if where is None else query.where(where, prefilter=True)

    def _ensure_fts(self) -> bool:
        """Build the full-text index if missing; False when it is missing and cannot be (read-only)."""
        # Lance refuses full-text queries on a table without an inverted index.
        if not any(i.name == "text_idx" for i in self._table.list_indices()):
            if self.read_only:
                return False
            with self.writing():
                if not any(i.name == "text_idx" for i in self._table.list_indices()):
                    self._table.create_index("text", config=FTS(), name="text_idx")
        return True

    def _query_vector(self, vector: np.ndarray) -> np.ndarray:
        q = np.asarray(vector, dtype=np.float32).reshape(-1)
        if q.shape[0] != self.embedder.dim:
            raise ValueError(f"query vector has {q.shape[0]} dims; the index holds {self.embedder.dim}")
        norm = float(np.linalg.norm(q))
        return q / norm if norm > 0 else q

    # ----- internals: writing --------------------------------------------------------------

    def _vectors_for(self, cases: list[Case], vectors: np.ndarray | None) -> np.ndarray:
        if vectors is None:
            return self.embedder.encode([case_text(c) for c in cases])
        vecs = np.asarray(vectors, dtype=np.float32)
        if vecs.shape != (len(cases), self.embedder.dim):
            raise ValueError(f"vectors have shape {vecs.shape}; expected ({len(cases)}, {self.embedder.dim})")
        return vecs

    def _rows(self, cases: list[Case], vecs: np.ndarray) -> pa.Table:
        flat = pa.array(np.ascontiguousarray(vecs, dtype=np.float32).reshape(-1), type=pa.float32())
        return pa.table(
            {
                "id": [c.case_id for c in cases],
                "vector": pa.FixedSizeListArray.from_arrays(flat, self.embedder.dim),
                "text": [case_text(c) for c in cases],
                "env_id": [c.subject.env_id for c in cases],
                "action_space": [c.subject.traits.action_space.value for c in cases],
                "algo": [c.subject.algo for c in cases],
                "status": [c.status for c in cases],
                "effect": [c.effect_value for c in cases],
                "scenario": [c.scenario for c in cases],
                "source": [c.source.value for c in cases],
            },
            schema=self._schema(),
        )

    def _maybe_optimize(self) -> None:
        names = {i.name for i in self._table.list_indices()}
        n = self.count()
        if "text_idx" not in names or ("vector_idx" not in names and n >= self.ann_min_rows):
            self.optimize()
            return
        stale = self._table.index_stats("vector_idx" if "vector_idx" in names else "text_idx")
        unindexed = stale.num_unindexed_rows if stale is not None else 0
        if unindexed >= max(REFRESH_MIN_ROWS, REFRESH_FRACTION * n):
            self.optimize()

    def _build_ann(self) -> None:
        # One partition: a single HNSW graph (Lance's advice for HNSW); cosine to match queries,
        # since a query whose distance type differs from the index's silently scans flat.
        config = HnswSq(distance_type="cosine", num_partitions=1, m=20, ef_construction=200)
        self._table.create_index("vector", config=config, name="vector_idx", replace=True)

    # ----- internals: table and sidecar ------------------------------------------------------

    def _schema(self) -> pa.Schema:
        return pa.schema(
            [
                pa.field("id", pa.string(), nullable=False),
                pa.field("vector", pa.list_(pa.float32(), self.embedder.dim)),
                pa.field("text", pa.string()),
                pa.field("env_id", pa.string()),
                pa.field("action_space", pa.string()),
                pa.field("algo", pa.string()),
                pa.field("status", pa.string()),
                pa.field("effect", pa.float64()),
                pa.field("scenario", pa.string()),
                pa.field("source", pa.string()),
            ]
        )

    def _open_table(self) -> Any:
        """Open (or create) the table without the write lock. A reindex elsewhere may drop it (or the
        directory) between our listing and opening; it holds the lock meanwhile, so on failure we wait
        for it and open what it left (a real fault raises again then, with nobody racing us)."""
        try:
            return self._open_table_unlocked()
        except (ValueError, OSError):  # "Table ... was not found", or files gone under a listing
            if self.read_only:
                raise
        with holding(self._lock, self.path):
            return self._open_table_unlocked()

    def _open_table_unlocked(self) -> Any:
        exists = TABLE in self._db.list_tables().tables
        meta = self._read_meta()
        if meta is None and exists:
            # Sidecar lost (crash between writes): trust the table's vector width.
            meta = {
                "model": self.embedder.name,
                "dim": self._db.open_table(TABLE).schema.field("vector").type.list_size,
            }
        if meta is not None:
            self._check_meta(meta)
        if self.read_only:
            if not exists:
                raise KBPathError(f"the KB is read-only and has no index at {self.path}; reindex a writable copy")
            return self._db.open_table(TABLE)
        if not (self.path / _META).exists():
            self._write_meta()
        return self._db.open_table(TABLE) if exists else self._create_table()

    def _create_table(self) -> Any:
        return self._db.create_table(TABLE, schema=self._schema(), exist_ok=True)

    def _check_meta(self, meta: dict[str, Any]) -> None:
        model, dim = meta.get("model"), meta.get("dim")
        if model != self.embedder.name or dim != self.embedder.dim:
            raise IndexMismatchError(
                f"index at {self.path} built with {model} ({dim} dims) but the configured model is "
                f"{self.embedder.name} ({self.embedder.dim} dims); run `remedy kb reindex`"
            )

    def _read_meta(self) -> dict[str, Any] | None:
        p = self.path / _META
        if not p.exists():
            return None
        try:
            meta = json.loads(p.read_text())
        except (OSError, ValueError) as err:
            raise IndexMismatchError(f"index metadata {p} is unreadable ({err}); run `remedy kb reindex`") from err
        return meta if isinstance(meta, dict) else {}

    def _write_meta(self) -> None:
        p = self.path / _META
        tmp = p.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"model": self.embedder.name, "dim": self.embedder.dim, "table": TABLE}))
        tmp.replace(p)  # atomic: a crash never leaves half a sidecar


def _first_of_each_id(batch: list[Case], seen: set[str]) -> list[Case]:
    """The cases of ``batch`` whose id is not in ``seen`` yet (first occurrence wins); updates ``seen``."""
    out = []
    for c in batch:
        if c.case_id not in seen:
            seen.add(c.case_id)
            out.append(c)
    return out


#: extra rows a vector search fetches past k, so ties at the k-th similarity are cut by :func:`_by_cosine`
_TIE_MARGIN = 10


def _by_cosine(hits: list[Hit]) -> list[Hit]:
    """Best cosine first; equal cosines (to 6 decimals) by case id. LanceDB's order among ties changes
    from query to query, and a diagnosis cut there depended on what the process had searched before
    (the same patient, diagnosed after another, lost a neighbour at the k-th place)."""
    return sorted(hits, key=lambda h: (-round(h.similarity, 6), h.case_id))


def _hits(tbl: pa.Table, q: np.ndarray | None) -> list[Hit]:
    ids = tbl.column("id").to_pylist()
    if not ids:
        return []
    if q is None:
        return [Hit(i, 0.0) for i in ids]
    vecs = tbl.column("vector").combine_chunks().flatten().to_numpy().reshape(len(ids), -1)
    sims = np.clip(vecs @ q, -1.0, 1.0)  # stored vectors are unit-norm: dot == cosine
    return [Hit(i, float(s)) for i, s in zip(ids, sims)]


def _sql_str(value: str) -> str:
    """A SQL string literal: single quotes doubled (the only escape Lance's SQL knows)."""
    if "\x00" in value:
        raise ValueError("filter values cannot contain NUL characters")
    return "'" + value.replace("'", "''") + "'"


def _sql_float(value: float) -> str:
    x = float(value)
    if not math.isfinite(x):
        raise ValueError(f"min_effect must be a finite number, got {value!r}")
    return repr(x)
