"""ResidentIndex (the service's in-memory search) answers what VectorIndex answers, and sees writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from remedy.cases.io import read_cases
from remedy.kb import KnowledgeBase
from remedy.kb.facade import example_files
from remedy.retrieval import MiniLMEmbedder, SearchFilters, VectorIndex
from remedy.retrieval.resident import ResidentIndex, _rrf

from .conftest import MakeCase
from .test_index import _filter_corpus

QUERIES = [
    "the lander hovers above the pad and never lands",
    "pendulum torque chatters between the bounds",
    "cartpole falls after a few steps",
    "mountain car never reaches the flag",
    "reward goes up but the task is not solved",
    "training diverges with nan losses, approx_kl spikes",
]
FILTERS = [
    SearchFilters(),
    SearchFilters(only_improved=True),
    SearchFilters(action_space="continuous"),
    SearchFilters(algo="ppo", min_effect=0.0),
    SearchFilters(env_id="LunarLander-v3"),
]


@pytest.fixture(scope="module")
def examples_index(tmp_path_factory: pytest.TempPathFactory, embedder: MiniLMEmbedder) -> VectorIndex:
    index = VectorIndex(tmp_path_factory.mktemp("resident") / "lance", embedder)
    index.upsert([c for path in example_files() for c in read_cases(path)[0]])
    return index


@pytest.mark.parametrize("mode", ["vector", "hybrid"])
def test_same_answers_as_the_index_on_the_bundled_examples(
    examples_index: VectorIndex, embedder: MiniLMEmbedder, mode: str
) -> None:
    resident = ResidentIndex(examples_index)
    vectors = embedder.encode(QUERIES)
    compared = 0
    for text, q in zip(QUERIES, vectors):
        for filters in FILTERS:
            want = examples_index.search(q, k=10, filters=filters, text=text, mode=mode)
            got = resident.search(q, k=10, filters=filters, text=text, mode=mode)
            assert [h.case_id for h in got] == [h.case_id for h in want], (text, filters)
            assert [h.similarity for h in got] == pytest.approx([h.similarity for h in want], abs=1e-5)
            compared += bool(want)
    assert compared >= len(QUERIES) * 3  # the filters leave real answers to compare


@pytest.mark.parametrize(
    "filters",
    [
        SearchFilters(env_id="LunarLander-v3"),
        SearchFilters(algo="ppo"),
        SearchFilters(status="unverified"),
        SearchFilters(min_effect=-10.0),
        SearchFilters(exclude_scenario="hover-bias"),
        SearchFilters(exclude_ids=frozenset({"a", "c", "nope"})),
        SearchFilters(env_id="LunarLander-v3", only_improved=True, min_effect=10.0),
        SearchFilters(env_id="no-such-env"),
    ],
)
def test_filters_keep_the_sql_meaning(
    tmp_path: Path, make_case: MakeCase, embedder: MiniLMEmbedder, filters: SearchFilters
) -> None:
    index = VectorIndex(tmp_path / "lance", embedder)
    index.upsert(_filter_corpus(make_case))
    q = embedder.encode(["lander crashes"])[0]
    for mode in ("vector", "hybrid"):
        want = {h.case_id for h in index.search(q, k=10, filters=filters, text="land", mode=mode)}
        got = {h.case_id for h in ResidentIndex(index).search(q, k=10, filters=filters, text="land", mode=mode)}
        assert got == want, mode


def test_writes_by_another_handle_are_seen_on_the_next_search(
    tmp_path: Path, make_case: MakeCase, embedder: MiniLMEmbedder
) -> None:
    index = VectorIndex(tmp_path / "lance", embedder)
    index.upsert([make_case("old", "CartPole falls over after ten steps")])
    resident = ResidentIndex(index)
    q = embedder.encode(["the lander hovers over the pad"])[0]
    assert [h.case_id for h in resident.search(q, k=5)] == ["old"]
    other = VectorIndex(tmp_path / "lance", embedder)  # another process's import, in effect
    other.upsert([make_case("new", "LunarLander hovers above the pad and never lands")])
    assert [h.case_id for h in resident.search(q, k=5)] == ["new", "old"]
    other.delete(["new"])
    assert [h.case_id for h in resident.search(q, k=5, text="hovers", mode="hybrid")] == ["old"]


def test_text_mode_and_a_kb_too_large_to_hold_ask_the_index(
    tmp_path: Path, make_case: MakeCase, embedder: MiniLMEmbedder
) -> None:
    index = VectorIndex(tmp_path / "lance", embedder)
    index.upsert([make_case("kw", "Returns fine after VecNormalize was reloaded"), make_case("x", "walker falls")])
    q = embedder.encode(["walker falls over"])[0]
    small = ResidentIndex(index, max_rows=1)
    assert not small.available()
    assert small.search(q, k=2) == index.search(q, k=2)
    assert [h.case_id for h in ResidentIndex(index).search(q, text="VecNormalize", mode="text")] == ["kw"]
    with pytest.raises(ValueError, match="unknown search mode"):
        ResidentIndex(index).search(q, text="x", mode="fuzzy")


def test_rrf_fuses_as_lancedb_does() -> None:
    # 7 is first in both lists; 3 (vector rank 2) and 9 (keyword rank 2) tie: the vector hit comes first
    assert _rrf([7, 3, 5], [7, 9]) == [7, 3, 9, 5]
    assert _rrf([], [4, 2]) == [4, 2]


def test_knowledge_base_held_in_memory_answers_the_same(tmp_path: Path) -> None:
    with KnowledgeBase.open(tmp_path / "kb") as kb:
        kb.load_examples()
        before = [(s.case.case_id, s.similarity) for s in kb.similar("lander hovers and never lands", k=8)]
        kb.hold_in_memory()
        after = [(s.case.case_id, s.similarity) for s in kb.similar("lander hovers and never lands", k=8)]
        assert [c for c, _ in after] == [c for c, _ in before]
        assert np.allclose([s for _, s in after], [s for _, s in before], atol=1e-5)


def test_held_cases_follow_writes(tmp_path: Path, make_case: MakeCase) -> None:
    with KnowledgeBase.open(tmp_path / "kb") as kb:
        kb.add_many([make_case("c1", "LunarLander hovers above the pad", effect=1.0), make_case("c2", "walker falls")])
        kb.hold_in_memory()
        first = kb.similar("lander hovers", k=1)[0]
        assert (first.case.case_id, first.case.effect_value) == ("c1", 1.0)
        kb.add_many([make_case("c1", "LunarLander hovers above the pad", effect=7.0)], replace=True)
        assert kb.similar("lander hovers", k=1)[0].case.effect_value == 7.0  # the held copy was dropped
        kb.delete(["c1"])
        assert [s.case.case_id for s in kb.similar("lander hovers", k=5)] == ["c2"]
