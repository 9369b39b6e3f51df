"""A resident copy of the index's search columns, for a long-running service.

``remedy serve`` answers many small queries against one KB. Asking Lance for each one costs a
table consistency check, a query plan and two scans (vector and BM25), about 15 ms at 10k cases
on 2 cores, most of it fixed cost. A :class:`ResidentIndex` keeps the unit vectors and the
filter columns in numpy arrays (15 MB per 10k cases) and answers the vector half with one
exact matrix product, and the keyword half with a BM25 matrix that analyses and scores text as
Lance's full-text index does (:mod:`remedy.retrieval.keywords`). Hybrid results are fused as
LanceDB's hybrid query fuses them (reciprocal rank fusion, K = 60, vector hits first on ties).
So a resident search returns what :meth:`VectorIndex.search` returns, except where Lance's
answer is itself approximate: its vector half goes through an HNSW index above 5k rows, its
BM25 statistics drift slightly as rows are appended between index refreshes, and documents with
equal keyword scores may come in another order.

Freshness: every search compares the Lance table's version with the one loaded (a cheap call:
the table is opened with a zero consistency interval) and reloads when they differ, so a write
by this process or by another is seen on the next query. A KB above ``max_rows`` is not held
in memory; the caller falls back to :class:`VectorIndex`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from .index import _TIE_MARGIN, Hit, SearchFilters, VectorIndex, _by_cosine
from .keywords import KeywordIndex

__all__ = ["ResidentIndex", "RRF_K", "MAX_RESIDENT_ROWS"]

#: LanceDB's RRFReranker constant (its default), so the fusion matches ``VectorIndex`` hybrid search.
RRF_K = 60
#: Above this many rows the index is not copied into memory and Lance answers. A (re)load reads every
#: vector and analyses every text: about 0.5 s at 10k rows, so about 5 s at this cap, paid by the first
#: query after each write (150 MB of vectors).
MAX_RESIDENT_ROWS = 100_000
_COLUMNS = ["id", "vector", "text", "env_id", "action_space", "algo", "status", "effect", "scenario"]


@dataclass(frozen=True)
class _Snapshot:
    """One loaded version of the table: arrays indexed by row, immutable once built."""

    version: int
    ids: list[str]
    row_of: dict[str, int]
    vectors: np.ndarray  # (n, dim) float32, unit rows
    codes: dict[str, tuple[dict[str | None, int], np.ndarray]]  # column -> (value -> code, code per row)
    effect: np.ndarray  # float64, NaN where the case has no measured effect
    keywords: KeywordIndex

    def mask(self, filters: SearchFilters) -> np.ndarray | None:
        """Rows the filters keep (None: all of them), with the SQL meaning of ``SearchFilters.where``."""
        keep: np.ndarray | None = None

        def narrow(m: np.ndarray) -> None:
            nonlocal keep
            keep = m if keep is None else keep & m

        status = "improved" if filters.only_improved else None
        for col, val in (*filters._equalities(), ("status", status), ("algo_lower", _lower(filters.algo))):
            if val is not None:
                lookup, rows = self.codes[col]
                narrow(rows == lookup.get(val, -1))  # NULL never equals a value (SQL)
        if filters.min_effect is not None:
            with np.errstate(invalid="ignore"):
                narrow(self.effect >= float(filters.min_effect))  # NaN (no effect) is excluded, as NULL is
        if filters.exclude_scenario is not None:
            lookup, rows = self.codes["scenario"]
            narrow(rows != lookup.get(filters.exclude_scenario, -1))  # NULL scenarios are kept
        if filters.exclude_ids:
            m = np.ones(len(self.ids), dtype=bool)
            m[[self.row_of[i] for i in filters.exclude_ids if i in self.row_of]] = False
            narrow(m)
        return keep


class ResidentIndex:
    """Vector and hybrid search over an in-memory copy of a :class:`VectorIndex` (see the module doc)."""

    def __init__(self, index: VectorIndex, *, max_rows: int = MAX_RESIDENT_ROWS) -> None:
        self.index = index
        self.max_rows = max_rows
        self._snap: _Snapshot | None = None
        self._too_large: int | None = None  # the table version found above ``max_rows``
        self._loading = threading.Lock()

    def available(self) -> bool:
        """Whether the index fits in memory (else search with the :class:`VectorIndex` itself)."""
        return self.index.count() <= self.max_rows

    def search(
        self,
        vector: np.ndarray | None,
        k: int = 10,
        filters: SearchFilters = SearchFilters(),
        text: str | None = None,
        mode: str = "vector",
    ) -> list[Hit]:
        """Same contract as :meth:`VectorIndex.search`; text-only search is delegated to it."""
        snap = None if mode == "text" or vector is None or k <= 0 else self._current()
        if snap is None or vector is None:  # text alone, nothing asked, or a table too large: Lance answers
            return self.index.search(vector, k=k, filters=filters, text=text, mode=mode)
        if not snap.ids:
            return []
        q = _unit(vector, self.index.embedder.dim)
        keep = snap.mask(filters)
        if mode == "vector" or not (text and text.strip()):
            return _by_cosine(_hits(snap, q, _top(snap, q, keep, k + _TIE_MARGIN)))[:k]  # ties cut as Lance's
        if mode != "hybrid":
            return self.index.search(vector, k=k, filters=filters, text=text, mode=mode)  # raises on a bad mode
        limit = max(2 * k, k + 10)  # VectorIndex's hybrid pool
        vec_rows = _top(snap, q, keep, limit)
        fts_rows = snap.keywords.top(text, limit, keep)
        pool = _rrf(vec_rows, fts_rows)[:limit]
        hits = _hits(snap, q, pool)
        return _by_cosine(hits)[:k]

    def _current(self) -> _Snapshot | None:
        """The loaded snapshot, reloaded first when the table has a newer version; None while the table
        holds more than ``max_rows`` rows (counted once per version, not per query)."""
        version = self.index._table.version
        snap = self._snap
        if snap is not None and snap.version == version:
            return snap
        if self._too_large == version:
            return None
        with self._loading:  # one thread reloads; the others wait and use its result
            snap = self._snap
            if snap is not None and snap.version == version:
                return snap
            if not self.available():
                self._snap, self._too_large = None, version
                return None
            snap = self._snap = _load(self.index)
            return snap


def _load(index: VectorIndex) -> _Snapshot:
    table = index._table
    version = table.version
    n = table.count_rows()
    tbl: pa.Table = table.search().select(_COLUMNS).limit(max(n, 1)).to_arrow() if n else pa.table({})
    if n == 0:
        empty = np.zeros((0, index.embedder.dim), np.float32)
        return _Snapshot(version, [], {}, empty, {}, np.zeros(0), KeywordIndex([]))
    ids = tbl.column("id").to_pylist()
    vectors = tbl.column("vector").combine_chunks().flatten().to_numpy().reshape(len(ids), -1).astype(np.float32)
    codes = {col: _codes(tbl.column(col).to_pylist()) for col in ("env_id", "action_space", "status", "scenario")}
    codes["algo_lower"] = _codes([_lower(a) for a in tbl.column("algo").to_pylist()])
    effect = np.array([np.nan if e is None else e for e in tbl.column("effect").to_pylist()], dtype=np.float64)
    keywords = KeywordIndex(tbl.column("text").to_pylist())
    return _Snapshot(version, ids, {i: r for r, i in enumerate(ids)}, vectors, codes, effect, keywords)


def _codes(values: list[str | None]) -> tuple[dict[str | None, int], np.ndarray]:
    """An integer code per distinct non-null value; NULL rows get -2, which no lookup returns."""
    lookup: dict[str | None, int] = {}
    rows = np.array([-2 if v is None else lookup.setdefault(v, len(lookup)) for v in values], dtype=np.int64)
    return lookup, rows


def _lower(value: str | None) -> str | None:
    return None if value is None else value.lower()


def _top(snap: _Snapshot, q: np.ndarray, keep: np.ndarray | None, k: int) -> list[int]:
    """Rows of the ``k`` highest cosines among ``keep``, best first (an exact scan)."""
    rows = np.arange(len(snap.ids)) if keep is None else np.flatnonzero(keep)
    if rows.size == 0:
        return []
    sims = _dot(snap.vectors[rows] if keep is not None else snap.vectors, q)
    if rows.size > k:
        part = np.argpartition(-sims, k - 1)[:k]
        order = part[np.argsort(-sims[part], kind="stable")]
    else:
        order = np.argsort(-sims, kind="stable")
    return [int(rows[i]) for i in order]


def _unit(vector: np.ndarray, dim: int) -> np.ndarray:
    """The query as a unit float32 vector (``VectorIndex._query_vector`` without a BLAS call)."""
    q = np.asarray(vector, dtype=np.float32).reshape(-1)
    if q.shape[0] != dim:
        raise ValueError(f"query vector has {q.shape[0]} dims; the index holds {dim}")
    norm = float(np.sqrt(np.einsum("i,i", q, q)))
    return q / norm if norm > 0 else q


def _dot(vectors: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``vectors @ q`` without BLAS: OpenBLAS serves one call at a time, so under load every search
    queued behind the encoder's matrix products (42% of the service's samples at 16 clients, py-spy);
    numpy's own einsum loop takes 0.3 ms for 10k x 384 and runs beside them."""
    return np.einsum("ij,j->i", vectors, q)


def _rrf(vec_rows: list[int], fts_rows: list[int]) -> list[int]:
    """Reciprocal rank fusion as LanceDB's RRFReranker: 1/(rank + K) summed over both lists, scores
    rounded to float32, vector hits before keyword-only hits, then a stable sort by score."""
    score: dict[int, float] = {}
    for ranked in (vec_rows, fts_rows):
        for rank, row in enumerate(ranked, start=1):
            score[row] = score.get(row, 0.0) + 1.0 / (rank + RRF_K)
    merged = list(dict.fromkeys([*vec_rows, *fts_rows]))
    rounded = np.array([score[r] for r in merged], dtype=np.float32)
    order = np.argsort(-rounded, kind="stable")
    return [merged[i] for i in order]


def _hits(snap: _Snapshot, q: np.ndarray, rows: list[int]) -> list[Hit]:
    if not rows:
        return []
    sims = np.clip(_dot(snap.vectors[rows], q), -1.0, 1.0)
    return [Hit(snap.ids[r], float(s)) for r, s in zip(rows, sims)]
