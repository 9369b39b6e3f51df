"""Retrieval: embeddings, the vector / full-text / hybrid index over case signatures, and
grounded diagnosis (the offline diagnoser with its prior rulebook; the DSPy LLM diagnoser lives in
``remedy.retrieval.llm`` and is imported on demand because DSPy is slow to import).

Every name is loaded on first use (module ``__getattr__``): the index pulls in LanceDB and the
embedder sentence-transformers and torch, seconds of imports that commands which never embed
(``remedy kb stats``, ``kb export``, ``case show``) must not pay.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .diagnosis import (
        Attempt,
        CandidatePatch,
        CaseRetriever,
        Diagnoser,
        DiagnosisContext,
        DiagnosisReport,
        RetrievedCase,
        RuleLike,
        get_diagnoser,
    )
    from .embedder import Embedder, MiniLMEmbedder, default_embedder
    from .index import ANN_MIN_ROWS, Hit, SearchFilters, VectorIndex, case_text, signature_text
    from .offline import OfflineDiagnoser, OfflineSettings
    from .priors import PRIORS, PriorRule, match_priors
    from .trust import trust_weights

#: public name -> submodule defining it
_WHERE = {
    **dict.fromkeys(("Embedder", "MiniLMEmbedder", "default_embedder"), "embedder"),
    **dict.fromkeys(("VectorIndex", "SearchFilters", "Hit", "ANN_MIN_ROWS", "signature_text", "case_text"), "index"),
    **dict.fromkeys(
        (
            "Attempt",
            "CandidatePatch",
            "CaseRetriever",
            "Diagnoser",
            "DiagnosisContext",
            "DiagnosisReport",
            "RetrievedCase",
            "RuleLike",
            "get_diagnoser",
        ),
        "diagnosis",
    ),
    **dict.fromkeys(("OfflineDiagnoser", "OfflineSettings"), "offline"),
    **dict.fromkeys(("PRIORS", "PriorRule", "match_priors"), "priors"),
    "trust_weights": "trust",
}

__all__ = [
    "Embedder",
    "MiniLMEmbedder",
    "default_embedder",
    "VectorIndex",
    "SearchFilters",
    "Hit",
    "ANN_MIN_ROWS",
    "signature_text",
    "case_text",
    "Attempt",
    "CandidatePatch",
    "CaseRetriever",
    "Diagnoser",
    "DiagnosisContext",
    "DiagnosisReport",
    "RetrievedCase",
    "RuleLike",
    "get_diagnoser",
    "OfflineDiagnoser",
    "OfflineSettings",
    "PRIORS",
    "PriorRule",
    "match_priors",
    "trust_weights",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(import_module(f".{_WHERE[name]}", __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
