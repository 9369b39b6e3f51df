"""The numpy MiniLM gives the sentence-transformers vectors and answers; batching shares encoder calls."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from remedy.cases.io import read_cases
from remedy.kb.facade import example_files
from remedy.retrieval import MiniLMEmbedder, case_text
from remedy.retrieval.batching import BatchingEmbedder
from remedy.retrieval.embedder import EMBEDDER_ENV, default_embedder
from remedy.retrieval.light_embedder import LightMiniLMEmbedder

QUERIES = [
    "the lander hovers above the pad and never lands",
    "pendulum torque chatters between the bounds",
    "cartpole falls after a few steps",
    "mountain car never reaches the flag",
    "the walker falls over immediately",
    "reward goes up but the task is not solved",
    "training diverges with nan losses",
]


@pytest.fixture(scope="module")
def example_texts() -> list[str]:
    return [case_text(c) for path in example_files() for c in read_cases(path)[0]]


@pytest.fixture(scope="module")
def both(example_texts):
    light, full = LightMiniLMEmbedder(), MiniLMEmbedder()
    return {name: (e.encode(example_texts), e.encode(QUERIES)) for name, e in (("light", light), ("full", full))}


def test_vectors_match_sentence_transformers(both, example_texts) -> None:
    (light_docs, light_q), (full_docs, full_q) = both["light"], both["full"]
    assert light_docs.shape == full_docs.shape == (len(example_texts), 384)
    assert float(np.min(np.sum(light_docs * full_docs, axis=1))) >= 0.999
    assert float(np.min(np.sum(light_q * full_q, axis=1))) >= 0.999


def test_top10_equals_the_full_path(both) -> None:
    (light_docs, light_q), (full_docs, full_q) = both["light"], both["full"]
    light_top = np.argsort(-(light_q @ light_docs.T), axis=1)[:, :10]
    full_top = np.argsort(-(full_q @ full_docs.T), axis=1)[:, :10]
    assert light_top.tolist() == full_top.tolist()


def test_default_embedder_is_light_and_env_picks(monkeypatch) -> None:
    default_embedder.cache_clear()
    try:
        assert isinstance(default_embedder(), LightMiniLMEmbedder)
        default_embedder.cache_clear()
        monkeypatch.setenv(EMBEDDER_ENV, "tensorflow")
        with pytest.raises(Exception, match="REMEDY_EMBEDDER"):
            default_embedder()
    finally:
        default_embedder.cache_clear()


class _Slow:
    """The real light embedder, made slow enough that concurrent callers overlap."""

    def __init__(self, inner: LightMiniLMEmbedder, fail_on: str | None = None) -> None:
        self.inner, self.name, self.dim, self.fail_on = inner, inner.name, inner.dim, fail_on

    def encode(self, texts):
        time.sleep(0.05)
        if self.fail_on is not None and self.fail_on in texts:
            raise RuntimeError("encoder broke")
        return self.inner.encode(texts)


def _concurrently(embedder, texts: list[str]) -> list:
    out: list = [None] * len(texts)
    start = threading.Barrier(len(texts))

    def run(i: int) -> None:
        start.wait()
        try:
            out[i] = embedder.encode([texts[i]])
        except Exception as ex:
            out[i] = ex

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_batching_shares_calls_and_keeps_each_callers_vectors() -> None:
    light = LightMiniLMEmbedder()
    batching = BatchingEmbedder(_Slow(light))
    texts = QUERIES * 2
    got = _concurrently(batching, texts)
    alone = light.encode(texts)
    for i, vec in enumerate(got):
        np.testing.assert_allclose(vec[0], alone[i], atol=1e-5)
    assert batching.texts == len(texts)
    assert batching.calls < len(texts)  # arrivals during a call were encoded together


def test_batching_respects_max_batch_and_empty_input() -> None:
    batching = BatchingEmbedder(_Slow(LightMiniLMEmbedder()), max_batch=2)
    got = _concurrently(batching, QUERIES)
    assert all(v.shape == (1, 384) for v in got)
    assert batching.calls >= (len(QUERIES) + 1) // 2
    assert batching.encode([]).shape == (0, 384)


def test_batching_gives_the_error_to_every_caller_of_the_batch() -> None:
    batching = BatchingEmbedder(_Slow(LightMiniLMEmbedder(), fail_on="boom"))
    got = _concurrently(batching, ["boom", *QUERIES[:3]])
    assert isinstance(got[0], RuntimeError)
    assert batching.encode(["still works"]).shape == (1, 384)  # the embedder is not left busy


def test_a_batch_encodes_each_sentence_as_alone() -> None:
    """Sentences of a batch share the dense layers (packed, no padding) but never attend to each other."""
    light = LightMiniLMEmbedder()
    texts = [*QUERIES, *QUERIES[:3]] * 3  # 30 sentences: enough tokens for the threaded batch path
    together = light.encode(texts)
    alone = np.stack([light.encode([t])[0] for t in texts])
    assert np.allclose(together, alone, atol=1e-5)
    assert float(together[0] @ together[1]) < 0.95  # different sentences stay apart
