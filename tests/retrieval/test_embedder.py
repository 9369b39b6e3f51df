"""The bundled MiniLM embedder: shape, norm, determinism, semantics, caching."""

from __future__ import annotations

import numpy as np

from remedy.retrieval import Embedder, MiniLMEmbedder, default_embedder


def test_encode_gives_unit_norm_float32_rows(embedder: MiniLMEmbedder) -> None:
    vecs = embedder.encode(["the lander hovers above the pad", "cartpole falls over quickly"])
    assert vecs.dtype == np.float32
    assert vecs.shape == (2, embedder.dim)
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)


def test_encode_empty_input(embedder: MiniLMEmbedder) -> None:
    assert embedder.encode([]).shape == (0, embedder.dim)


def test_name_dim_and_protocol(embedder: MiniLMEmbedder) -> None:
    assert embedder.name == "all-MiniLM-L6-v2"
    assert embedder.dim == 384
    assert isinstance(embedder, Embedder)


def test_encode_is_deterministic_and_batch_independent(embedder: MiniLMEmbedder) -> None:
    texts = [f"episode {i} ends by timeout with jerky actions" for i in range(5)]
    together = embedder.encode(texts)
    alone = np.vstack([embedder.encode([t]) for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_paraphrase_is_closer_than_unrelated_text(embedder: MiniLMEmbedder) -> None:
    a, para, other = embedder.encode(
        [
            "the lunar lander hovers above the landing pad until the time limit",
            "lander keeps floating over the pad and never touches down before timeout",
            "the walker's actions are jerky and saturate at the bounds",
        ]
    )
    assert float(a @ para) > float(a @ other) + 0.1


def test_default_embedder_is_cached(embedder: MiniLMEmbedder) -> None:
    assert default_embedder() is embedder
