"""What the KnowledgeBase's calls return: search hits, import and reconcile reports, stats, mining.

Shared by the local :class:`~remedy.kb.facade.KnowledgeBase`, the typed remote client and the
service's response models, so one shape serves both transports.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from remedy.cases.io import Problem
from remedy.cases.model import Case
from remedy.cases.store import StoreStats
from remedy.miners.model import Rule

__all__ = ["SimilarCase", "ImportReport", "ReconcileReport", "KBStats", "MineReport", "IndexCheck"]


@dataclass(frozen=True)
class SimilarCase:
    """A stored case found by :meth:`KnowledgeBase.similar`, its cosine similarity and 1-based rank."""

    case: Case
    similarity: float
    rank: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary: what ``remedy query --json`` and the HTTP API return."""
        c = self.case
        eff = c.verification.effect if c.verification is not None else None
        return {
            "rank": self.rank,
            "case_id": c.case_id,
            "similarity": round(self.similarity, 4),
            "env_id": c.subject.env_id,
            "algo": c.subject.algo,
            "action_space": c.subject.traits.action_space.value,
            "source": c.source.value,
            "status": c.status,
            "symptoms": list(c.signature.symptoms),
            "summary": c.signature.summary,
            "root_causes": [r.value for r in c.root_causes],
            "patch": {
                "summary": c.patch.summary(),
                "parts": [p.model_dump(mode="json") for p in c.patch.parts],
            },
            "effect": None
            if eff is None
            else {"diff": eff.diff, "ci_low": eff.ci_low, "ci_high": eff.ci_high, "metric": eff.metric},
            "literature": None if c.literature is None else c.literature.model_dump(mode="json"),
        }


@dataclass(frozen=True)
class ImportReport:
    """What :meth:`KnowledgeBase.import_file` did."""

    path: Path
    read: int  # valid records in the file
    added: int  # new cases written
    unchanged: int  # identical cases already stored
    problems: tuple[Problem, ...] = ()  # skipped records (only with skip_invalid)
    replaced: int = 0  # stored cases overwritten with different content (only with replace)

    @property
    def skipped(self) -> int:
        """Invalid records that were skipped."""
        return len(self.problems)


@dataclass(frozen=True)
class ReconcileReport:
    """Index rows added for cases missing from it, and rows removed that had no case."""

    added: int = 0
    removed: int = 0
    rebuilt: str = ""  # why the index was damaged and rebuilt from the store, if it was
    refreshed: int = 0  # indexed cases re-indexed because a write that changed them stopped before the index
    deduplicated: int = 0  # ids that had several index rows (concurrent writers), left with one

    @property
    def in_sync(self) -> bool:
        """True when nothing had to be done."""
        return not (self.added or self.removed or self.rebuilt or self.refreshed or self.deduplicated)


@dataclass(frozen=True)
class KBStats:
    """Store counts plus the state of the index."""

    path: Path
    store: StoreStats
    schema_version: int
    index_rows: int | None  # None when the index cannot be opened (see index_problem)
    embedder: str
    index_problem: str = ""
    #: with the index opened: stored ids without a row, rows without a stored case, ids with several rows
    index_missing: int = 0
    index_extra: int = 0
    index_duplicates: int = 0


class MineReport(BaseModel):
    """What :meth:`KnowledgeBase.mine` found and stored (the shape of `remedy mine --json`)."""

    model_config = ConfigDict(frozen=True)

    attempts: int = Field(description="Measured attempts at their final verdict (what support counts).")
    tested: int = Field(description="Candidate rules tested (the Benjamini–Hochberg family).")
    rules: list[Rule]
    new: list[str] = Field(description="Ids stored as new proposed rules.")
    updated: list[str] = Field(description="Ids whose evidence was updated (status and reviews kept).")
    flagged: dict[str, str] = Field(description="Ids flagged by this run, with how the evidence turned.")


@dataclass(frozen=True)
class IndexCheck:
    """How the index differs from the store: ids missing from it, extra in it, and held twice."""

    missing: int = 0
    extra: int = 0
    duplicates: int = 0

    @classmethod
    def of(cls, stored: set[str], indexed: set[str], dups: set[str]) -> IndexCheck:
        return cls(len(stored - indexed), len(indexed - stored), len(dups))

    def problem(self, rows: int, root: Path) -> str:
        """The one line `remedy kb stats --index` shows, or '' when the index matches the store."""
        found = [
            f"{n} {what}"
            for n, what in (
                (self.missing, "stored case(s) missing from it"),
                (self.extra, "row(s) without a stored case"),
                (self.duplicates, "id(s) with duplicate rows"),
            )
            if n
        ]
        if not found:
            return ""
        return (
            f"the index ({rows} rows) is out of step with the store: {', '.join(found)}; "
            f"run `remedy kb reindex --kb {root}`"
        )
