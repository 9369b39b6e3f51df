"""The KnowledgeBase facade: store + index together, search with filters, import/export, bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from remedy.cases.io import case_to_json, write_cases
from remedy.cases.store import STORE_SCHEMA_VERSION
from remedy.kb import (
    CaseNotFoundError,
    ImportFileError,
    IndexMismatchError,
    KBLockedError,
    KBNotFoundError,
    KBPathError,
    KBVersionError,
    KnowledgeBase,
    SimilarCase,
    ValidationError,
)


class TinyEmbedder:
    """A test double of the Embedder protocol with another model name and dimension."""

    name = "tiny-test-embedder"
    dim = 8

    def encode(self, texts):
        rng = np.random.default_rng(0)
        v = rng.normal(size=(len(texts), self.dim)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)


def _ids(hits: list[SimilarCase]) -> list[str]:
    return [h.case.case_id for h in hits]


def test_add_get_similar(kb, corpus):
    assert kb.add_many(corpus) == (5, 0)
    assert kb.add_many(corpus) == (0, 5)
    assert kb.get("c-pendulum-jitter") == corpus[1]
    hits = kb.similar("the lander hovers over the landing pad until the time limit", k=3)
    assert len(hits) == 3 and hits[0].case.case_id == "c-lander-hover"
    assert [h.rank for h in hits] == [1, 2, 3]
    assert -1.0 <= hits[-1].similarity <= hits[0].similarity <= 1.0
    for mode in ("vector", "text"):
        assert kb.similar("lander hovers above the pad", k=1, mode=mode)[0].case.case_id == "c-lander-hover"


def test_similar_filters(filled_kb):
    kb = filled_kb
    q = "the agent fails"
    assert set(_ids(kb.similar(q, action_space="continuous"))) == {"c-pendulum-jitter", "c-walker-scale"}
    assert _ids(kb.similar(q, env_id="MountainCar-v0")) == ["c-mountaincar-stuck"]
    assert set(_ids(kb.similar(q, algo="ppo"))) == {"c-lander-hover", "c-cartpole-short", "c-walker-scale"}
    assert set(_ids(kb.similar(q, only_improved=True))) == {"c-lander-hover", "c-pendulum-jitter"}
    assert _ids(kb.similar(q, min_effect=100)) == ["c-lander-hover"]
    assert _ids(kb.similar(q, only_improved=True, action_space="discrete")) == ["c-lander-hover"]


def test_similar_to_case_and_signature(filled_kb, corpus):
    kb = filled_kb
    hits = kb.similar(corpus[1], k=5)
    assert "c-pendulum-jitter" not in _ids(hits) and len(hits) == 4  # the query case itself is excluded
    assert kb.similar(corpus[1].signature, k=1)[0].case.case_id == "c-pendulum-jitter"
    d = kb.similar(corpus[0].signature, k=1)[0].as_dict()
    assert d["case_id"] == "c-lander-hover" and d["effect"]["diff"] == 180.0
    assert d["patch"]["parts"][0]["kind"] == "training_budget" and d["root_causes"] == ["reward_misspecification"]


def test_bad_queries(filled_kb):
    kb = filled_kb
    for kwargs, msg in (
        ({"mode": "fuzzy"}, "unknown search mode"),
        ({"k": 0}, "k must be at least 1"),
        ({"action_space": "cont"}, "unknown action space"),
        ({"min_effect": float("nan")}, "finite"),
    ):
        with pytest.raises(ValidationError, match=msg):
            kb.similar("x", **kwargs)
    with pytest.raises(ValidationError, match="query is empty"):
        kb.similar("   ")
    with pytest.raises(CaseNotFoundError):
        kb.get("c-nope")


def test_import_export_roundtrip(filled_kb, tmp_path, embedder):
    assert filled_kb.export(tmp_path / "all.jsonl") == 5
    assert filled_kb.export(tmp_path / "two.parquet", ids=["c-walker-scale", "c-lander-hover"]) == 2
    with KnowledgeBase.open(tmp_path / "other", embedder=embedder) as other:
        report = other.import_file(tmp_path / "all.jsonl")
        assert (report.read, report.added, report.unchanged, report.skipped) == (5, 5, 0, 0)
        report = other.import_file(tmp_path / "two.parquet")  # re-importing the same ids changes nothing
        assert (report.read, report.added, report.unchanged) == (2, 0, 2)
        assert list(other.cases()) == list(filled_kb.cases())
        assert other.index.count() == 5


def test_invalid_file_imports_nothing(kb, corpus, tmp_path):
    kb.add(corpus[0])
    bad = json.loads(case_to_json(corpus[2]))
    bad["diagnosis"]["causes"][0]["cause"] = "bad_luck"
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join([case_to_json(corpus[1]), json.dumps(bad), "{oops"]) + "\n")
    with pytest.raises(ImportFileError) as info:
        kb.import_file(path)
    assert [n for n, _ in info.value.problems] == [2, 3] and "bad_luck" in str(info.value)
    assert kb.store.ids() == {"c-lander-hover"} and kb.index.ids() == {"c-lander-hover"}
    report = kb.import_file(path, skip_invalid=True)
    assert report.added == 1 and report.skipped == 2
    assert kb.store.ids() == {"c-lander-hover", "c-pendulum-jitter"}


def test_index_failure_keeps_store_and_reconciles(kb_path, corpus, embedder, monkeypatch):
    with KnowledgeBase.open(kb_path, embedder=embedder) as kb:
        kb.add(corpus[0])

        def boom(*a, **k):
            raise OSError("disk full")

        monkeypatch.setattr(type(kb.index), "upsert", boom)
        with pytest.raises(OSError):
            kb.add_many(corpus[1:])
        monkeypatch.undo()
        assert kb.store.count() == 5 and kb.index.count() == 1
        kb.store.delete(["c-lander-hover"])  # an index row with no case
    with KnowledgeBase.open(kb_path, embedder=embedder) as kb:
        assert kb.index.ids() == kb.store.ids() == {c.case_id for c in corpus[1:]}
        assert kb.reconcile().in_sync


def test_reindex(kb, corpus):
    kb.add_many(corpus)
    seen = []
    assert kb.reindex(progress=lambda done, total: seen.append((done, total))) == 5
    assert seen[-1] == (5, 5)
    assert kb.similar("chattering torque", k=1)[0].case.case_id == "c-pendulum-jitter"


def test_stats(filled_kb):
    s = filled_kb.stats()
    assert s.store.total == 5 and s.index_rows == 5 and s.schema_version == STORE_SCHEMA_VERSION


# -- bad input ------------------------------------------------------------------------------


def test_kb_path_is_a_file(tmp_path):
    f = tmp_path / "kbfile"
    f.write_text("x")
    with pytest.raises(KBPathError, match="is a file"):
        KnowledgeBase.open(f)
    assert f.read_text() == "x"


def test_missing_kb_without_create(tmp_path):
    with pytest.raises(KBNotFoundError, match="remedy kb init"):
        KnowledgeBase.open(tmp_path / "nowhere", create=False)
    assert not (tmp_path / "nowhere").exists()


def test_default_path_from_env(tmp_path, monkeypatch, embedder):
    monkeypatch.setenv("REMEDY_KB", str(tmp_path / "envkb"))
    with KnowledgeBase.open(embedder=embedder) as kb:
        assert kb.root == tmp_path / "envkb" and (kb.root / "remedy.duckdb").is_file()


def test_newer_kb_is_refused(kb_path, corpus, embedder):
    import duckdb

    with KnowledgeBase.open(kb_path, embedder=embedder) as kb:
        kb.add(corpus[0])
    con = duckdb.connect(str(kb_path / "remedy.duckdb"))
    con.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    con.close()
    with pytest.raises(KBVersionError, match="newer Remedy .*upgrade remedy"):
        KnowledgeBase.open(kb_path, embedder=embedder)


def test_locked_kb(kb_path, corpus, embedder):
    with KnowledgeBase.open(kb_path, embedder=embedder) as kb:
        kb.add_many(corpus)
    code = "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('ready', flush=True); time.sleep(120)"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(kb_path / "remedy.duckdb")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        with pytest.raises(
            KBLockedError, match=rf"KB at .* is locked by PID {proc.pid}; stop that process or use `remedy serve`"
        ):
            KnowledgeBase.open(kb_path, embedder=embedder)
    finally:
        proc.kill()
        proc.wait()
    with KnowledgeBase.open(kb_path, embedder=embedder) as kb:
        assert kb.count() == 5 and kb.index.count() == 5


def test_embedding_dimension_mismatch(kb_path, corpus, embedder):
    with KnowledgeBase.open(kb_path, embedder=embedder) as kb:
        kb.add_many(corpus)
    with pytest.raises(IndexMismatchError, match=r"8 dims.*remedy kb reindex"):
        KnowledgeBase.open(kb_path, embedder=TinyEmbedder())
    with KnowledgeBase.open(kb_path, embedder=embedder) as kb:  # nothing lost
        assert kb.count() == 5 and kb.index.count() == 5
    # Switching models on purpose: reindex (the store is untouched, the index rebuilt)
    with KnowledgeBase.open(kb_path, embedder=TinyEmbedder(), reconcile=False) as kb:
        assert kb.reindex() == 5
        assert kb.similar("anything", k=2, mode="vector")[0].similarity <= 1.0


def test_invalid_case_is_not_half_written(kb, corpus, tmp_path):
    path = tmp_path / "x.csv"
    with pytest.raises(ValidationError, match=r"\.jsonl, \.json, \.parquet"):
        kb.import_file(path)
    with pytest.raises(ValidationError):
        kb.export(path)
    write_cases(tmp_path / "ok.jsonl", corpus)
    assert kb.import_file(tmp_path / "ok.jsonl").added == 5
