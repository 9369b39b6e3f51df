"""The in-memory BM25 analyses and scores as a Lance full-text index does (checked against a real one)."""

from __future__ import annotations

from pathlib import Path

import lancedb
import numpy as np
import pyarrow as pa
import pytest
from lancedb.index import FTS

from remedy.cases.io import read_cases
from remedy.kb.facade import example_files
from remedy.retrieval import case_text
from remedy.retrieval.keywords import (
    SEARCHABLE_SINCE_041,
    STOP_WORDS,
    STOP_WORDS_BEFORE_041,
    KeywordIndex,
    analyze,
)

ODD = [
    "hovering landers",
    "the agent is very jerky",
    "café naïve résumé",
    "sb3_ppo-lr=3e-4 clip_range 0.2",
    "x" * 45 + " short",
    "a b c y z",
    "HalfCheetah-v4 PPO PPO",
]
QUERIES = [
    "hover",
    "lander hovers above the pad",
    "very",
    "cafe naive",
    "ppo ppo walker",
    "3e 4 lr",
    "clip range",
    "approx_kl spikes; entropy collapses",
    "the lander hovers above the pad and never lands",
    "bang-bang torque on Pendulum",
    "reward goes up but the task is not solved",
]


def test_analysis_follows_lance_defaults() -> None:
    assert analyze("The Lander is HOVERING; very jerky!") == ["lander", "hover", "veri", "jerki"]
    assert analyze("sb3_ppo-lr=3e-4") == ["sb3", "ppo", "lr", "3e", "4"]
    assert analyze("x" * 40 + " ok") == ["ok"]  # 40 bytes or more: dropped
    assert analyze("café") == ["cafe"]
    assert analyze("a the was") == []


def test_stop_words_are_the_installed_lance_ones(tmp_path: Path) -> None:
    """Every word of either lancedb's list, indexed alone: Lance finds it exactly when it is not a stop word here."""
    words = sorted(STOP_WORDS_BEFORE_041 | SEARCHABLE_SINCE_041 | {"could", "ought", "would", "cannot", "very"})
    docs = [f"qqq {w}" for w in words]
    table = lancedb.connect(str(tmp_path)).create_table("t", pa.table({"row": list(range(len(docs))), "text": docs}))
    table.create_index("text", config=FTS(), name="text_idx")
    found = {
        w
        for i, w in enumerate(words)
        if i in {r["row"] for r in table.search(w, query_type="fts").select(["row"]).limit(5).to_arrow().to_pylist()}
    }
    assert found == {w for w in words if analyze(w)}
    assert STOP_WORDS_BEFORE_041 - found == STOP_WORDS


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return [case_text(c) for path in example_files() for c in read_cases(path)[0]] + ODD


def test_scores_equal_a_lance_index(tmp_path: Path, corpus: list[str]) -> None:
    table = lancedb.connect(str(tmp_path)).create_table(
        "t", pa.table({"row": list(range(len(corpus))), "text": corpus})
    )
    table.create_index("text", config=FTS(), name="text_idx")
    mine = KeywordIndex(corpus)
    checked = 0
    for q in QUERIES:
        lance = table.search(q, query_type="fts").select(["row", "_score"]).limit(len(corpus)).to_arrow().to_pylist()
        scores = mine.scores(q)
        assert scores is not None, q
        assert {r["row"] for r in lance} == {int(i) for i in (scores > 0).nonzero()[0]}, q  # the same matches
        for r in lance:
            assert scores[r["row"]] == pytest.approx(r["_score"], rel=1e-4, abs=1e-4), (q, r)
            checked += 1
        ranked = mine.top(q, 10)
        assert [scores[i] for i in ranked] == pytest.approx([r["_score"] for r in lance[:10]], rel=1e-4), q
    assert checked > 100


def test_no_known_term_and_filters() -> None:
    index = KeywordIndex(["walker falls", "lander hovers", "walker jerks"])
    assert index.scores("zzz qqq") is None and index.top("zzz", 5) == []
    assert index.top("walker", 5) == [0, 2] or index.top("walker", 5) == [2, 0]
    assert index.top("walker", 5, keep=np.array([False, True, True])) == [2]
    assert KeywordIndex([]).top("walker", 3) == []
