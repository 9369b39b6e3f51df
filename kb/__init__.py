"""The service layer: the KnowledgeBase facade (and, in other modules, the CLI and HTTP API).

``from remedy.kb import KnowledgeBase`` is the Python entry point::

    with KnowledgeBase.open("./.remedy") as kb:
        for hit in kb.similar("lander hovers above the pad", k=5, only_improved=True):
            print(hit.rank, hit.similarity, hit.case.patch.summary())
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from remedy.cases.errors import (
    CaseNotFoundError,
    ImportFileError,
    IndexMismatchError,
    KBError,
    KBLockedError,
    KBNotFoundError,
    KBPathError,
    KBVersionError,
    RemedyError,
    ValidationError,
)

if TYPE_CHECKING:
    from .facade import ImportReport, KBStats, KnowledgeBase, ReconcileReport, SimilarCase

_FACADE = ("KnowledgeBase", "SimilarCase", "ImportReport", "ReconcileReport", "KBStats")

__all__ = [
    "KnowledgeBase",
    "SimilarCase",
    "ImportReport",
    "ReconcileReport",
    "KBStats",
    "RemedyError",
    "KBError",
    "KBNotFoundError",
    "KBPathError",
    "KBLockedError",
    "KBVersionError",
    "CaseNotFoundError",
    "ValidationError",
    "ImportFileError",
    "IndexMismatchError",
]


def __getattr__(name: str) -> Any:
    # The facade pulls in LanceDB (seconds to import); load it only when asked for, so
    # `remedy --help` and commands that never touch the index start fast.
    if name in _FACADE:
        from . import facade

        return getattr(facade, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
