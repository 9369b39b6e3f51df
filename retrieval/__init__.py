"""Retrieval: embeddings, the vector / full-text / hybrid index over case signatures, and
grounded diagnosis (the offline diagnoser with its prior rulebook; the DSPy LLM diagnoser lives in
``remedy.retrieval.llm`` and is imported on demand because DSPy is slow to import)."""

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
from .offline import OfflineDiagnoser
from .priors import PRIORS, PriorRule, match_priors

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
    "PRIORS",
    "PriorRule",
    "match_priors",
]
