"""Retrieval: embeddings and the vector / full-text / hybrid index over case signatures."""

from .embedder import Embedder, MiniLMEmbedder, default_embedder
from .index import ANN_MIN_ROWS, Hit, SearchFilters, VectorIndex, case_text, signature_text

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
]
