"""VectorIndex on a real Lance directory with the real embedding model."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from remedy.cases.errors import IndexMismatchError
from remedy.retrieval import Hit, MiniLMEmbedder, SearchFilters, VectorIndex, case_text

from .conftest import MakeCase, build_case

CORPUS = [
    (
        "hover",
        "LunarLander hovers above the landing pad until the 1000-step time limit; never lands.",
        ["hovering", "timeouts"],
    ),
    (
        "jerk",
        "BipedalWalker actions flip between the bounds every step; bang-bang gait.",
        ["jerky_actions", "saturated_actions"],
    ),
    (
        "sparse",
        "MountainCar never reaches the flag; reward is -1 every step and the car rocks at the bottom.",
        ["never_succeeds", "sparse_signal"],
    ),
    ("unstable", "HalfCheetah return collapses after 300k steps; approx_kl spikes above 0.1.", ["unstable_learning"]),
    ("obs", "Pendulum observations unscaled, values in the thousands; learning is flat.", ["unscaled_observations"]),
    (
        "entropy",
        "CartPole policy entropy collapsed early and return plateaued at 60.",
        ["collapsed_entropy", "premature_convergence"],
    ),
]


@pytest.fixture
def index(tmp_path: Path, embedder: MiniLMEmbedder) -> VectorIndex:
    return VectorIndex(tmp_path / "lance", embedder)


@pytest.fixture
def filled(index: VectorIndex, make_case: MakeCase) -> VectorIndex:
    index.upsert([make_case(cid, text, symptoms=tags) for cid, text, tags in CORPUS])
    return index


def _q(embedder: MiniLMEmbedder, text: str) -> np.ndarray:
    return embedder.encode([text])[0]


def test_paraphrase_ranks_first(filled: VectorIndex, embedder: MiniLMEmbedder) -> None:
    hits = filled.search(_q(embedder, "the lander floats over the pad and runs out the clock"), k=3)
    assert hits[0].case_id == "hover"
    assert [h.similarity for h in hits] == sorted((h.similarity for h in hits), reverse=True)
    assert 0.3 < hits[0].similarity <= 1.0


def test_similarity_is_the_cosine(filled: VectorIndex, embedder: MiniLMEmbedder, make_case: MakeCase) -> None:
    q = _q(embedder, "walker jitters")
    hit = filled.search(q, k=1)[0]
    stored = embedder.encode(
        [
            case_text(
                make_case(
                    hit.case_id,
                    dict((c, t) for c, t, _ in CORPUS)[hit.case_id],
                    symptoms=dict((c, s) for c, _, s in CORPUS)[hit.case_id],
                )
            )
        ]
    )[0]
    assert hit.similarity == pytest.approx(float(stored @ q), abs=1e-4)


def test_empty_index_returns_nothing(index: VectorIndex, embedder: MiniLMEmbedder) -> None:
    q = _q(embedder, "anything")
    assert index.count() == 0 and index.ids() == set()
    for mode in ("vector", "hybrid", "text"):
        assert index.search(q, text="anything", mode=mode) == []


def _filter_corpus(make_case: MakeCase) -> list:
    s = "agent fails to land"
    return [
        make_case("a", s, env_id="LunarLander-v3", algo="PPO", status="improved", effect=50.0),
        make_case(
            "b", s, env_id="LunarLander-v3", action_space="continuous", algo="SAC", status="improved", effect=5.0
        ),
        make_case("c", s, env_id="CartPole-v1", algo="DQN", status="worse", effect=-3.0),
        make_case("d", s, env_id="LunarLander-v3", algo="PPO", status=None, effect=None, source="example"),
        make_case("e", s, env_id="LunarLander-v3", algo="PPO", status="no_effect", effect=None, scenario="hover-bias"),
        make_case(
            "f",
            s,
            env_id="Pendulum-v1",
            action_space="continuous",
            algo="TD3",
            status="improved",
            effect=1.0,
            scenario="jerk",
        ),
    ]


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        (SearchFilters(), set("abcdef")),
        (SearchFilters(env_id="LunarLander-v3"), set("abde")),
        (SearchFilters(action_space="continuous"), set("bf")),
        (SearchFilters(algo="ppo"), set("ade")),
        (SearchFilters(status="worse"), {"c"}),
        (SearchFilters(status="unverified"), {"d"}),
        (SearchFilters(only_improved=True), set("abf")),
        (SearchFilters(min_effect=2.0), {"a", "b"}),
        (SearchFilters(min_effect=-10.0), set("abcf")),  # no measured effect -> excluded
        (SearchFilters(exclude_scenario="hover-bias"), set("abcdf")),  # null scenario kept
        (SearchFilters(exclude_ids=frozenset({"a", "c"})), set("bdef")),
        (SearchFilters(env_id="LunarLander-v3", only_improved=True, min_effect=10.0), {"a"}),
    ],
)
def test_filters(
    index: VectorIndex, make_case: MakeCase, embedder: MiniLMEmbedder, filters: SearchFilters, expected: set
) -> None:
    index.upsert(_filter_corpus(make_case))
    q = _q(embedder, "lander crashes")
    for mode in ("vector", "hybrid", "text"):
        got = {h.case_id for h in index.search(q, k=10, filters=filters, text="land", mode=mode)}
        assert got == expected, mode


def test_quotes_in_filter_values_and_text(index: VectorIndex, make_case: MakeCase, embedder: MiniLMEmbedder) -> None:
    odd = "O'Brien\"s-Env\\v0'; DROP TABLE signatures; --"
    # case ids keep to a safe alphabet (no quotes), but id filters still quote whatever they are given
    index.upsert(
        [make_case("q1", 'it\'s a "quoted" summary', env_id=odd, scenario=odd), make_case("plain", "plain summary")]
    )
    q = _q(embedder, "quoted summary")
    assert [h.case_id for h in index.search(q, filters=SearchFilters(env_id=odd))] == ["q1"]
    assert {h.case_id for h in index.search(q, filters=SearchFilters(exclude_scenario=odd))} == {"plain"}
    excluded = frozenset({"q1", "q'1", odd})
    assert {h.case_id for h in index.search(q, filters=SearchFilters(exclude_ids=excluded))} == {"plain"}
    assert index.search(q, text="it's \"quoted", mode="text")[0].case_id == "q1"
    index.delete(["q1", "q'1", odd])
    assert index.ids() == {"plain"}


def test_hybrid_and_text_find_the_exact_keyword(
    index: VectorIndex, make_case: MakeCase, embedder: MiniLMEmbedder
) -> None:
    cases = [make_case(cid, text, symptoms=tags) for cid, text, tags in CORPUS]
    # Semantically bland, but the only case naming the wrapper; the vector alone ranks it low.
    cases.append(make_case("kw", "Returns fine after the VecNormalize statistics were reloaded from disk."))
    index.upsert(cases)
    query = "VecNormalize"
    q = _q(embedder, "lander hovers over pad " + query)
    text_hits = index.search(q, text=query, mode="text")
    assert [h.case_id for h in text_hits] == ["kw"]
    assert text_hits[0].similarity == pytest.approx(float(q @ embedder.encode([case_text(cases[-1])])[0]), abs=1e-4)
    hybrid = [h.case_id for h in index.search(q, k=3, text=query, mode="hybrid")]
    assert "kw" in hybrid and "hover" in hybrid
    assert index.search(None, text=query, mode="text") == [Hit("kw", 0.0)]


def test_symptom_tags_are_searchable(filled: VectorIndex) -> None:
    assert filled.search(None, text="saturated_actions", mode="text")[0].case_id == "jerk"


def test_upsert_replaces_delete_ids_count(filled: VectorIndex, make_case: MakeCase, embedder: MiniLMEmbedder) -> None:
    assert filled.count() == len(CORPUS) and filled.ids() == {c for c, _, _ in CORPUS}
    filled.upsert([make_case("hover", "Pendulum swings wildly with torque at the limits")])
    assert filled.count() == len(CORPUS)
    hit = filled.search(_q(embedder, "pendulum torque at limits"), k=1)[0]
    assert hit.case_id == "hover"
    filled.delete(["hover", "jerk", "no-such-id"])
    assert filled.count() == len(CORPUS) - 2
    assert "hover" not in {h.case_id for h in filled.search(_q(embedder, "pendulum torque"), k=10)}


def test_upsert_with_given_vectors_checks_shape(index: VectorIndex, make_case: MakeCase) -> None:
    with pytest.raises(ValueError, match="shape"):
        index.upsert([make_case("x", "s")], vectors=np.zeros((1, 5), dtype=np.float32))
    assert index.count() == 0


def test_rebuild_replaces_everything(filled: VectorIndex, make_case: MakeCase, embedder: MiniLMEmbedder) -> None:
    seen: list[int] = []
    new = [make_case(f"n{i}", f"CartPole episode {i} ends early") for i in range(5)] + [make_case("n0", "dup")]
    assert filled.rebuild(iter(new), batch_size=2, progress=seen.append) == 5
    assert filled.ids() == {f"n{i}" for i in range(5)}
    assert seen == [2, 4, 5]
    assert filled.search(None, text="dup", mode="text") == []  # first occurrence of n0 kept
    assert filled.search(_q(embedder, "cartpole ends early"), k=1)[0].case_id.startswith("n")


def test_reopen_sees_rows_and_other_handles_writes(
    filled: VectorIndex, embedder: MiniLMEmbedder, make_case: MakeCase
) -> None:
    other = VectorIndex(filled.path, embedder)
    assert other.ids() == filled.ids()
    other.upsert([make_case("late", "a late arrival")])
    assert "late" in filled.ids()


def test_open_waits_for_a_reindex_that_drops_the_table_under_it(
    filled: VectorIndex, embedder: MiniLMEmbedder, make_case: MakeCase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reindex in another process dropped the table between an opener's listing and its open (CI saw
    "Table 'signatures' was not found" from a concurrent `kb import`); the opener waits for that writer."""
    from lancedb.db import LanceDBConnection

    real_open, real_drop = LanceDBConnection.open_table, LanceDBConnection.drop_table
    dropped, tried = threading.Event(), threading.Event()
    fresh = [make_case(f"r{i}", f"rebuilt case {i}") for i in range(3)]
    rebuilder = threading.Thread(target=filled.rebuild, args=(fresh,))

    def drop(self, *args, **kwargs):  # the reindex: drop, then stay inside the gap until the opener tried
        real_drop(self, *args, **kwargs)
        dropped.set()
        tried.wait(10)

    def open_(self, *args, **kwargs):
        if threading.current_thread() is threading.main_thread() and not rebuilder.is_alive() and not tried.is_set():
            rebuilder.start()
            dropped.wait(10)
            try:
                return real_open(self, *args, **kwargs)
            finally:
                tried.set()
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(LanceDBConnection, "drop_table", drop)
    monkeypatch.setattr(LanceDBConnection, "open_table", open_)
    other = VectorIndex(filled.path, embedder)
    rebuilder.join(30)
    assert tried.is_set()  # the race really happened
    assert other.ids() == {"r0", "r1", "r2"}


def test_model_mismatch_is_refused(filled: VectorIndex, embedder: MiniLMEmbedder) -> None:
    class Other:
        name, dim = "other-model", 16

        def encode(self, texts):  # pragma: no cover - never reached
            return np.zeros((len(texts), 16), dtype=np.float32)

    with pytest.raises(
        IndexMismatchError, match=r"all-MiniLM-L6-v2 \(384 dims\).*other-model \(16 dims\).*remedy kb reindex"
    ):
        VectorIndex(filled.path, Other())
    fresh = VectorIndex(filled.path, Other(), reset=True)
    assert fresh.count() == 0
    with pytest.raises(IndexMismatchError):
        VectorIndex(filled.path, embedder)


def test_bad_mode_and_query_dim(filled: VectorIndex) -> None:
    with pytest.raises(ValueError, match="mode"):
        filled.search(np.ones(384, dtype=np.float32), mode="fuzzy")
    with pytest.raises(ValueError, match="dims"):
        filled.search(np.ones(3, dtype=np.float32))


def _clustered(n: int, dim: int, n_clusters: int, rng: np.random.Generator) -> np.ndarray:
    centers = rng.normal(size=(n_clusters, dim))
    x = centers[rng.integers(n_clusters, size=n)] + 0.35 * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_ann_index_recall_against_exact_scan(tmp_path: Path, embedder: MiniLMEmbedder) -> None:
    rng = np.random.default_rng(7)
    n, dim = 3_000, embedder.dim
    vecs = _clustered(n + 50, dim, 40, rng)
    cases = [build_case(f"s{i}", f"synthetic {i}", env_id="CartPole-v1" if i % 2 else "Pendulum-v1") for i in range(n)]
    index = VectorIndex(tmp_path / "big", embedder, ann_min_rows=1_000)
    index.upsert(cases[:1_500], vectors=vecs[:1_500])
    index.upsert(cases[1_500:], vectors=vecs[1_500:n])
    assert index.has_ann_index() and index.count() == n
    queries, base = vecs[n:], vecs[:n]
    recalls = []
    for q in queries:
        truth = set(np.argsort(-(base @ q))[:10])
        got = {int(h.case_id[1:]) for h in index.search(q, k=10)}
        recalls.append(len(got & truth) / 10)
    assert np.mean(recalls) >= 0.9
    # A filter keeps results inside it, through the index, still near the exact answer.
    pend = SearchFilters(env_id="Pendulum-v1")
    hits = index.search(queries[0], k=10, filters=pend)
    assert len(hits) == 10 and all(int(h.case_id[1:]) % 2 == 0 for h in hits)
    # Rows written after the index build are found before any refresh.
    index.upsert([build_case("fresh", "fresh row")], vectors=queries[1:2])
    assert index.search(queries[1], k=1)[0].case_id == "fresh"


def test_equally_similar_cases_are_cut_by_case_id(index: VectorIndex, make_case: MakeCase, embedder: MiniLMEmbedder):
    # every attempt on one patient stores the same signature: the k-th place falls inside a tie, and the
    # engine's order among ties changed from query to query (a diagnosis depended on earlier searches)
    same = "pendulum swings down and never balances; torque saturates"
    index.upsert([make_case(f"t{i}", same) for i in (5, 4, 3, 2, 1)] + [make_case("other", "cartpole falls")])
    q = _q(embedder, same)
    from remedy.retrieval.resident import ResidentIndex  # the service's copy cuts them the same way

    for searcher in (index, ResidentIndex(index)):
        for mode in ("vector", "hybrid"):
            assert [h.case_id for h in searcher.search(q, k=2, text=same, mode=mode)] == ["t1", "t2"], mode
