"""The KnowledgeBase: one object over the case store (DuckDB) and the vector index (LanceDB).

A KB is a directory holding ``remedy.duckdb`` (the store of record) and
``index/`` (derived: every row can be rebuilt from the store). Writes go to the
store first, then to the index; if the index write fails the store keeps the
case and the next :meth:`KnowledgeBase.open` reconciles the two. Each write first
leaves the ids it writes in ``index-pending/`` and removes them once the index has
them, so a crash between the two writes of a *changed* case (same id, new content)
is repaired too, not only a missing id. Index writes take the index's file lock
(:func:`remedy.retrieval.index.write_lock`), one writer at a time across processes;
a reconcile also removes duplicate index rows.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from importlib import resources
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from remedy.cases.errors import KBError, KBNotFoundError, KBPathError, ValidationError
from remedy.cases.io import ImportLimits, read_cases, write_cases
from remedy.cases.model import ActionSpaceType, Case, Signature, Source
from remedy.cases.store import AddCounts, CaseStore
from remedy.kb.pending import PENDING_DIR, PendingWrite, drop, finished_writes
from remedy.kb.results import ImportReport, IndexCheck, KBStats, MineReport, ReconcileReport, SimilarCase
from remedy.miners.model import Rule, RuleStatus
from remedy.miners.store import RuleStore, mine_into
from remedy.retrieval.embedder import MINILM_NAME, Embedder, MiniLMEmbedder, default_embedder

if TYPE_CHECKING:
    from remedy.cases.evidence.signature import RunSignature
    from remedy.retrieval.index import VectorIndex
    from remedy.retrieval.resident import ResidentIndex

# The index module (LanceDB, seconds to import) is imported where the index is first used, so
# opening a KB to count, show or export cases never pays for it.

__all__ = [
    "KnowledgeBase",
    "SimilarCase",
    "ImportReport",
    "ReconcileReport",
    "KBStats",
    "MineReport",
    "DB_FILE",
    "INDEX_DIR",
    "PENDING_DIR",
    "SEARCH_MODES",
    "resolve_kb_path",
    "example_files",
    "Progress",
]

DB_FILE = "remedy.duckdb"
INDEX_DIR = "index"
SEARCH_MODES = ("hybrid", "vector", "text")
_BATCH = 256
#: stored cases a service keeps in memory for its search hits (see KnowledgeBase.hold_in_memory)
HELD_CASES = 4_096
#: cases embedded per reconcile step: each step is committed to the index on its own, so an
#: interrupted reconcile keeps what it did and progress can be shown between steps
RECONCILE_BATCH = 64

#: progress callback: ``progress(done, total)`` with counts of cases
Progress = Callable[[int, int], None]

log = logging.getLogger(__name__)


class _DefaultEmbedder:
    """The default MiniLM, loaded on first ``encode``: commands that never embed stay fast."""

    name = MINILM_NAME
    dim = MiniLMEmbedder.dim

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return default_embedder().encode(texts)


def resolve_kb_path(path: Path | str | None) -> Path:
    """The KB directory: ``path``, else ``$REMEDY_KB``, else ``./.remedy``."""
    return Path(path or os.environ.get("REMEDY_KB") or ".remedy")


class KnowledgeBase:
    """Cases, their vector index, and similarity search. Open with :meth:`open`."""

    def __init__(self, root: Path, store: CaseStore, embedder: Embedder) -> None:
        """Wrap an opened store; prefer :meth:`open`, which also checks and reconciles the index."""
        self.root = root
        self.store = store
        self.embedder = embedder
        self._index: VectorIndex | None = None
        self._resident: ResidentIndex | None = None
        self._hold_resident = False
        self._held_cases: OrderedDict[str, Case] = OrderedDict()  # hits' cases, when held in memory
        self._held_writes = -1
        self._held_lock = threading.Lock()

    # -- lifecycle -----------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: Path | str | None = None,
        create: bool = True,
        embedder: Embedder | None = None,
        reconcile: bool = True,
    ) -> KnowledgeBase:
        """Open the KB at ``path`` (default ``$REMEDY_KB`` or ``./.remedy``), creating it if asked.

        Raises :class:`KBPathError` if the path is a file, :class:`KBNotFoundError` if it
        does not exist and ``create`` is False, :class:`KBLockedError` / :class:`KBVersionError`
        from the store, :class:`IndexMismatchError` if the index was built with another model.
        With ``reconcile`` the index is brought in line with the store (cheap when in sync).
        """
        root = resolve_kb_path(path)
        _prepare_dir(root, create)
        kb = cls(root, CaseStore(root / DB_FILE), embedder or _DefaultEmbedder())
        if reconcile and kb.store.read_only:
            log.warning("KB at %s is read-only: opened for reading, the index is not reconciled", root)
        elif reconcile:
            kb.reconcile()
        return kb

    def close(self) -> None:
        """Drop the index handle (the store holds no connection between calls)."""
        self._index = None
        self._resident = None

    def hold_in_memory(self) -> None:
        """Answer :meth:`similar` from an in-memory copy of the index's vectors and filter columns
        (a long-running service: about 1 ms instead of about 15 ms per search at 10k cases; see
        :mod:`remedy.retrieval.resident`). Loads it now; later writes are picked up by the next search."""
        self._hold_resident = True
        _guard_index(lambda: self._searcher().search(self.embedder.encode(["warm up"])[0], k=1), self.root)

    def _searcher(self) -> VectorIndex | ResidentIndex:
        """What :meth:`similar` searches: the resident copy when held (and the KB fits), else the index."""
        index = self.index
        if not self._hold_resident:
            return index
        from remedy.retrieval.resident import ResidentIndex  # lancedb is loaded already: ``index`` is open

        if self._resident is None or self._resident.index is not index:  # a reindex replaces the handle
            self._resident = ResidentIndex(index)
        return self._resident

    def _hit_cases(self, ids: list[str]) -> dict[str, Case]:
        """The stored cases of search hits; held in memory too (the most recent ``HELD_CASES``)
        when the index is, and dropped whenever this process writes cases."""
        if not self._hold_resident:
            return {c.case_id: c for c in self.store.get_many(ids)}
        with self._held_lock:
            if self._held_writes != self.store.writes():
                self._held_cases.clear()
                self._held_writes = self.store.writes()
            held = {i: self._held_cases[i] for i in ids if i in self._held_cases}
            writes = self._held_writes
        missing = [i for i in ids if i not in held]
        fetched = self.store.get_many(missing) if missing else []
        with self._held_lock:
            if writes == self.store.writes():  # nothing written while we read: safe to keep
                for c in fetched:
                    self._held_cases[c.case_id] = c
                for i in held:
                    self._held_cases.move_to_end(i)
                while len(self._held_cases) > HELD_CASES:
                    self._held_cases.popitem(last=False)
        return held | {c.case_id: c for c in fetched}

    def __enter__(self) -> KnowledgeBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"KnowledgeBase({str(self.root)!r})"

    @property
    def index(self) -> VectorIndex:
        """The vector index, opened on first use (raises IndexMismatchError on a model change)."""
        if self._index is None:
            from remedy.retrieval.index import VectorIndex

            self._index = VectorIndex(self.root / INDEX_DIR, self.embedder, read_only=self.store.read_only)
        return self._index

    # -- writing -------------------------------------------------------------------

    def add(self, case: Case) -> bool:
        """Store and index one case; False if an identical case was already stored."""
        return self.add_many([case]).added == 1

    def add_many(self, cases: Iterable[Case], progress: Progress | None = None, replace: bool = True) -> AddCounts:
        """Store cases (one transaction), then index the new or changed ones.

        ``progress(done, total)`` is called after the store write and after each index batch.
        ``replace=False`` refuses the whole batch (:class:`ValidationError` naming the ids) when an
        id is already stored with different content.
        """
        latest = {c.case_id: c for c in cases}  # last duplicate wins, as in the store
        if self.store.read_only and latest:  # before the pending file: nothing may be written
            raise KBPathError(f"KB at {self.root} is read-only: reads work, writes do not; copy it somewhere writable")
        with PendingWrite(self.root, latest) as pending:
            written, unchanged = self.store.upsert(latest.values(), replace=replace)
            pending.stored()
            done, total = unchanged, len(latest)
            _report(progress, done, total)
            try:
                for ids in _batches(written):
                    self.index.upsert([latest[i] for i in ids])
                    done += len(ids)
                    _report(progress, done, total)
            except _LANCE_FAILURES as err:
                if not _is_conflict(err):
                    raise
                self._after_conflict(err, len(written))
            pending.indexed()
        return AddCounts(len(written), unchanged)

    def _after_conflict(self, err: BaseException, n: int) -> None:
        """A Lance commit conflict (a writer outside the lock: an older Remedy) after the store write:
        the cases are stored, so bring the index in line; one clean line if even that fails."""
        log.warning("index write conflicted with another writer (%s); reconciling", _first_line(err))
        self._index = None
        try:
            self.reconcile()
        except (*_LANCE_FAILURES, KBError) as again:
            raise KBError(
                f"the index write conflicted with another writer ({_first_line(again)}); the {n} case(s) are "
                f"stored: run `remedy kb reindex --kb {self.root}` once the other writer is done"
            ) from None

    def delete(self, case_ids: Iterable[str]) -> int:
        """Delete cases from the store, then from the index; returns how many were stored."""
        ids = list(case_ids)
        n = self.store.delete(ids)
        self.index.delete(ids)
        return n

    def import_file(
        self,
        path: Path | str,
        skip_invalid: bool = False,
        progress: Progress | None = None,
        limits: ImportLimits | None = None,
        mark_imported: bool = False,
        replace: bool = False,
    ) -> ImportReport:
        """Import a ``.jsonl``, ``.json`` or ``.parquet`` file of cases.

        Every record is validated first; any invalid record raises :class:`ImportFileError`
        naming each bad line and nothing is imported, unless ``skip_invalid``. A file past
        ``limits`` (line length, cases per import, field sizes) is refused whole. Re-importing
        the same cases changes nothing. A case whose id is stored with different content refuses
        the whole file (:class:`ValidationError` naming the ids) unless ``replace``. ``mark_imported``
        files the file's measured cases (``verified``, ``bench``) as ``imported``: another team's
        outcomes, which the offline vote weighs less than outcomes verified here.
        """
        cases, problems = read_cases(path, skip_invalid=skip_invalid, limits=limits)
        if mark_imported:
            local = (Source.verified, Source.bench)
            cases = [c.model_copy(update={"source": Source.imported}) if c.source in local else c for c in cases]
        known = self.store.existing(c.case_id for c in cases)
        counts = self.add_many(cases, progress=progress, replace=replace)
        new = len({c.case_id for c in cases} - known)  # a new id is always written
        return ImportReport(Path(path), len(cases), new, counts.unchanged, tuple(problems), counts.added - new)

    def load_examples(self, progress: Progress | None = None) -> list[ImportReport]:
        """Import the example cases bundled with Remedy (``remedy.cases/examples/*.jsonl``); a newer Remedy's
        version of an example replaces the stored one."""
        return [self.import_file(p, progress=progress, replace=True) for p in example_files()]

    def export(self, path: Path | str, ids: Iterable[str] | None = None) -> int:
        """Write all cases (or those in ``ids``) to ``.jsonl`` or ``.parquet``; returns the count."""
        cases = self.store.iter_cases() if ids is None else self.store.get_many(ids)
        return write_cases(path, cases)

    def reindex(self, progress: Progress | None = None) -> int:
        """Rebuild the index from the store (also after a model change); returns rows written."""
        from remedy.retrieval.index import VectorIndex, holding, write_lock

        index_dir = self.root / INDEX_DIR
        with holding(write_lock(index_dir), index_dir):  # no other write between the reset and the rebuild
            total = self.store.count()
            markers = finished_writes(self.root)  # a rebuild from the store covers what they left
            self._index = VectorIndex(index_dir, self.embedder, reset=True)
            tick = None if progress is None else (lambda done: progress(done, total))
            rows = self._index.rebuild(self.store.iter_cases(), batch_size=_BATCH, progress=tick)
            drop(markers)
        return rows

    def reconcile(self, progress: Progress | None = None) -> ReconcileReport:
        """Embed cases missing from the index and drop index rows without a case.

        Cases that a write left in ``index-pending/`` (its process died, or its index write
        failed, between the store and the index) are re-indexed from the store even when their
        id is indexed: the row may hold the case's previous content.
        Works in steps of :data:`RECONCILE_BATCH` cases, each written to the index on its own,
        with ``progress(done, total)`` after each. An index whose files are damaged is rebuilt
        from the store (the store is the truth); if even that fails, the error says to run
        `remedy kb reindex`.
        """
        try:
            return self._reconcile(progress)
        except _LANCE_FAILURES as err:
            if not _is_lance_failure(err) or _is_conflict(err):  # a conflict is another writer, not damage
                raise
            reason = _first_line(err)
        self._index = None
        _guard_index(lambda: self.reindex(progress), self.root)
        return ReconcileReport(added=self.store.count(), rebuilt=reason)

    def _reconcile(self, progress: Progress | None) -> ReconcileReport:
        if not self._out_of_step():
            return ReconcileReport()  # checked without the lock: a KB in sync is never written to
        with self.index.writing():  # the census and the repair, with no other writer in between
            markers = finished_writes(self.root)
            stale = set().union(*markers.values()) if markers else set()
            stored, (indexed, dups) = self.store.ids(), self.index.id_census()
            absent, extra = stored - indexed, indexed - stored
            refresh = sorted(absent | (stale & indexed & stored) | (dups & stored))
            # merge_insert cannot pick one of several rows of an id: drop them all, then write one
            self.index.delete(extra | dups)
            for start in range(0, len(refresh), RECONCILE_BATCH):
                self.index.upsert(self.store.get_many(refresh[start : start + RECONCILE_BATCH]))
                _report(progress, min(start + RECONCILE_BATCH, len(refresh)), len(refresh))
            drop(markers)
        refreshed = len((stale & indexed & stored) - dups)
        return ReconcileReport(
            added=len(absent), removed=len(extra), refreshed=refreshed, deduplicated=len(dups & stored)
        )

    def _out_of_step(self) -> bool:
        """Whether the index lacks a stored case, holds one that is not stored or twice, or a write left work."""
        if finished_writes(self.root):
            return True
        stored, (indexed, dups) = self.store.ids(), self.index.id_census()
        return bool(dups) or stored != indexed

    # -- reading -------------------------------------------------------------------

    def get(self, case_id: str) -> Case:
        """The stored case with this id (:class:`CaseNotFoundError` with suggestions if none)."""
        return self.store.get(case_id)

    def count(self) -> int:
        """Number of stored cases."""
        return self.store.count()

    def cases(self) -> Iterable[Case]:
        """Every stored case, in id order (streamed in batches)."""
        return self.store.iter_cases()

    def similar(
        self,
        query: str | Signature | Case,
        k: int = 10,
        *,
        env_id: str | None = None,
        action_space: str | None = None,
        algo: str | None = None,
        status: str | None = None,
        only_improved: bool = False,
        min_effect: float | None = None,
        exclude_scenario: str | None = None,
        exclude_ids: Iterable[str] = (),
        mode: str = "hybrid",
    ) -> list[SimilarCase]:
        """Stored cases most similar to a text, a signature or a case (the case itself excluded).

        Filters narrow the candidates before ranking; ``mode`` is ``hybrid`` (vector + BM25
        fused by reciprocal rank), ``vector`` or ``text``.
        """
        from remedy.retrieval.index import SearchFilters

        text, exclude = _query_text(query)
        for name, value in (("env_id", env_id), ("algo", algo), ("status", status), ("scenario", exclude_scenario)):
            if value is not None and "\x00" in value:
                raise ValidationError(f"{name} filter contains a NUL character; pass plain text")
        filters = SearchFilters(
            env_id=env_id,
            action_space=action_space,
            algo=algo,
            status=status,
            only_improved=only_improved,
            min_effect=_check_search(k, mode, min_effect, action_space),
            exclude_scenario=exclude_scenario,
            exclude_ids=frozenset(exclude_ids) | exclude,
        )
        vector = self.embedder.encode([text])[0]  # text mode too: hits still get a cosine
        hits = _guard_index(
            lambda: self._searcher().search(vector, k=k, filters=filters, text=text, mode=mode), self.root
        )
        found = self._hit_cases([h.case_id for h in hits])
        # A hit without a stored case is an index row a crash left behind: skip it.
        kept = [h for h in hits if h.case_id in found]
        return [SimilarCase(found[h.case_id], h.similarity, rank) for rank, h in enumerate(kept, start=1)]

    def similar_to_run(
        self,
        run_dir: Path | str,
        k: int = 10,
        *,
        n_episodes: int = 10,
        seed: int = 0,
        same_action_space: bool = True,
        trust: bool = False,
        **filters: Any,
    ) -> tuple[RunSignature, list[SimilarCase]]:
        """Roll out the agent in ``run_dir``, compute its failure signature, and find similar cases.

        By default only cases with the same action-space type are returned (their patches fit);
        ``filters`` are those of :meth:`similar`; ``trust``: the user's own files (``--trust-checkpoint``).
        """
        from remedy.cases.evidence.signature import signature_of_run

        # resolved here, before any rollout: a worker that loads the run works in its own directory
        run = signature_of_run(Path(run_dir).resolve(), n_episodes=n_episodes, seed=seed, trust=trust)
        if same_action_space:
            filters.setdefault("action_space", run.subject.traits.action_space.value)
        return run, self.similar(run.signature, k=k, **filters)

    def stats(self, index: bool = True) -> KBStats:
        """Case counts (by source, status, env, root cause), schema version and index size.

        ``index=False`` leaves the index closed (``index_rows`` None): the counts then need
        neither LanceDB nor the embedding model, which is what `remedy kb stats` shows by default.
        """
        rows, problem, check = None, "", IndexCheck()
        try:
            if index:
                rows = _guard_index(lambda: self.index.count(), self.root)
                check = _guard_index(lambda: IndexCheck.of(self.store.ids(), *self.index.id_census()), self.root)
                problem = check.problem(rows, self.root)
        except KBError as err:
            problem = str(err)
        return KBStats(
            self.root,
            self.store.stats(),
            self.store.schema_version(),
            rows,
            self.embedder.name,
            problem,
            check.missing,
            check.extra,
            check.duplicates,
        )

    # -- rules (mined from the cases, reviewed by people) --------------------------------

    def rules(self, status: RuleStatus | str | None = None) -> list[Rule]:
        """Stored rules by id (only those in review state ``status`` when given)."""
        return RuleStore(self.store).all(status)

    def rule(self, rule_id: str) -> Rule:
        """One stored rule (:class:`RuleNotFoundError` naming close ids if none)."""
        return RuleStore(self.store).get(rule_id)

    def review(self, rule_id: str, decision: RuleStatus | str, reviewer: str | None = None, note: str = "") -> Rule:
        """Accept or reject a rule (``decision``: "accepted" or "rejected") as ``reviewer`` (default: the login)."""
        return RuleStore(self.store).review(rule_id, decision, reviewer, note)

    def mine(self, *, min_support: int = 3, fdr: float = 0.1, max_conditions: int = 2, seed: int = 0) -> MineReport:
        """Mine rules from the measured cases and store them as proposed (re-mining updates their evidence)."""
        rules = RuleStore(self.store)
        result, report = mine_into(rules, min_support=min_support, fdr=fdr, max_conditions=max_conditions, seed=seed)
        return MineReport(
            attempts=result.n_attempts,
            tested=result.n_tested,
            rules=result.rules,
            new=report.new,
            updated=report.updated,
            flagged=report.flagged,
        )


def example_files() -> list[Path]:
    """The bundled example-case files, sorted by name (none if the package ships none)."""
    folder = resources.files("remedy.cases") / "examples"
    if not folder.is_dir():
        return []
    return sorted(Path(str(f)) for f in folder.iterdir() if f.name.endswith(".jsonl"))


def _batches(ids: list[str]) -> Iterable[list[str]]:
    it = iter(ids)
    while batch := list(islice(it, _BATCH)):
        yield batch


def _is_conflict(err: BaseException) -> bool:
    """A Lance commit conflict ("Retryable commit conflict for version ..."), not a damaged index."""
    return _is_lance_failure(err) and "conflict" in str(err).lower()


def _report(progress: Progress | None, done: int, total: int) -> None:
    if progress is not None:
        progress(done, total)


def _prepare_dir(root: Path, create: bool) -> None:
    if root.exists() and not root.is_dir():
        raise KBPathError(f"KB path {root} is a file, not a directory; pass --kb DIR (for example ./.remedy)")
    if root.is_dir() and (root / DB_FILE).exists():
        return
    if not create:
        raise KBNotFoundError(f"no KB at {root}; create one with `remedy kb init --kb {root}`")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise KBPathError(f"cannot create KB directory {root}: {err.strerror or err}; pick another --kb") from None


#: what LanceDB raises for damaged or truncated files (``RuntimeError: lance error: ...``, IO errors)
_LANCE_FAILURES = (RuntimeError, OSError, ValueError)


def _is_lance_failure(err: BaseException) -> bool:
    # Only errors that come out of Lance itself mean "damaged index"; anything else is a bug.
    return "lance" in f"{type(err).__module__} {err}".lower()


def _first_line(err: BaseException) -> str:
    return (str(err).splitlines() or [type(err).__name__])[0][:200]


def _guard_index(call: Callable[[], Any], root: Path) -> Any:
    """Run ``call``; a Lance failure becomes a KBError that says how to recover."""
    try:
        return call()
    except _LANCE_FAILURES as err:
        if not _is_lance_failure(err):
            raise
        raise KBError(
            f"the index at {root / INDEX_DIR} is damaged ({_first_line(err)}); the cases are safe in the "
            f"store: run `remedy kb reindex --kb {root}` to rebuild it"
        ) from None


def _query_text(query: str | Signature | Case) -> tuple[str, frozenset[str]]:
    from remedy.retrieval.index import case_text, signature_text

    if isinstance(query, Case):
        return case_text(query), frozenset({query.case_id})
    if isinstance(query, Signature):
        return signature_text(query), frozenset()
    if isinstance(query, str) and query.strip():
        return query.strip(), frozenset()
    raise ValidationError("the query is empty; describe the failure, e.g. 'lander hovers above the pad'")


def _check_search(k: int, mode: str, min_effect: float | None, action_space: str | None) -> float | None:
    spaces = [a.value for a in ActionSpaceType]
    if action_space is not None and action_space not in spaces:
        raise ValidationError(f"unknown action space {action_space!r}; use one of {', '.join(spaces)}")
    if mode not in SEARCH_MODES:
        raise ValidationError(f"unknown search mode {mode!r}; use one of {', '.join(SEARCH_MODES)}")
    if k < 1:
        raise ValidationError(f"k must be at least 1, got {k}")
    if min_effect is not None and not math.isfinite(min_effect):
        raise ValidationError(f"min_effect must be a finite number, got {min_effect}")
    return min_effect
