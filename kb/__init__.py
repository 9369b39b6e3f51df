"""The service layer: the KnowledgeBase facade (and, in other modules, the CLI and HTTP API).

``from remedy.kb import KnowledgeBase`` is the Python entry point::

    with KnowledgeBase.open("./.remedy") as kb:
        for hit in kb.similar("lander hovers above the pad", k=5, only_improved=True):
            print(hit.rank, hit.similarity, hit.case.patch.summary())
"""

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

from .facade import ImportReport, KBStats, KnowledgeBase, ReconcileReport, SimilarCase

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
