"""The ONNX Runtime MiniLM (the service's encoder) gives the sentence-transformers vectors and answers."""

from __future__ import annotations

import numpy as np
import pytest

from remedy.cases.io import read_cases
from remedy.kb.facade import example_files
from remedy.retrieval import MiniLMEmbedder, case_text
from remedy.retrieval.embedder import EMBEDDER_ENV, default_embedder
from remedy.retrieval.light_embedder import LightMiniLMEmbedder
from remedy.retrieval.onnx_embedder import ONNX_BATCH, OnnxMiniLMEmbedder

from .test_light_embedder import QUERIES


@pytest.fixture(scope="module")
def onnx() -> OnnxMiniLMEmbedder:
    return OnnxMiniLMEmbedder(threads=1)


@pytest.fixture(scope="module")
def encoded(onnx):
    docs = [case_text(c) for path in example_files() for c in read_cases(path)[0]]
    full = MiniLMEmbedder()
    return {name: (e.encode(docs), e.encode(QUERIES)) for name, e in (("onnx", onnx), ("full", full))}


def test_vectors_match_sentence_transformers(encoded) -> None:
    (onnx_docs, onnx_q), (full_docs, full_q) = encoded["onnx"], encoded["full"]
    assert onnx_docs.shape == full_docs.shape and onnx_docs.dtype == np.float32
    assert float(np.min(np.sum(onnx_docs * full_docs, axis=1))) >= 0.999
    assert float(np.min(np.sum(onnx_q * full_q, axis=1))) >= 0.999
    assert np.allclose(np.linalg.norm(onnx_docs, axis=1), 1.0, atol=1e-5)


def test_top10_equals_the_full_path(encoded) -> None:
    (onnx_docs, onnx_q), (full_docs, full_q) = encoded["onnx"], encoded["full"]
    onnx_top = np.argsort(-(onnx_q @ onnx_docs.T), axis=1)[:, :10]
    full_top = np.argsort(-(full_q @ full_docs.T), axis=1)[:, :10]
    assert onnx_top.tolist() == full_top.tolist()


def test_padding_never_changes_a_vector(onnx) -> None:
    """Sentences of very different lengths share a padded batch; the mask keeps each one as if alone,
    in the caller's order, and text past the model's 256 tokens is cut as the other encoders cut it."""
    texts = ["x", QUERIES[0], "word " * 400, "", *QUERIES[1:], QUERIES[0]]
    assert len(texts) > ONNX_BATCH  # more than one ONNX call
    together = onnx.encode(texts)
    alone = np.stack([onnx.encode([t])[0] for t in texts])
    assert np.allclose(together, alone, atol=1e-5)
    assert np.allclose(together[1], together[-1], atol=1e-6)
    light = LightMiniLMEmbedder().encode(texts)
    assert float(np.min(np.sum(together * light, axis=1))) >= 0.999
    assert onnx.encode([]).shape == (0, 384)


def test_env_picks_onnx_and_the_service_defaults_to_it(monkeypatch) -> None:
    default_embedder.cache_clear()
    try:
        monkeypatch.delenv(EMBEDDER_ENV, raising=False)
        assert isinstance(default_embedder(), LightMiniLMEmbedder)  # the cold CLI keeps numpy
        assert isinstance(default_embedder("onnx"), OnnxMiniLMEmbedder)  # what the service asks for
        monkeypatch.setenv(EMBEDDER_ENV, "numpy")
        default_embedder.cache_clear()
        assert isinstance(default_embedder("onnx"), LightMiniLMEmbedder)  # the user's choice wins
        monkeypatch.setenv(EMBEDDER_ENV, "ONNX ")
        default_embedder.cache_clear()
        assert isinstance(default_embedder(), OnnxMiniLMEmbedder)
    finally:
        default_embedder.cache_clear()
