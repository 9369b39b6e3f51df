"""Several processes writing one KB's index: one writer at a time, one row per case, mismatches found.

Three concurrent `kb import` writers plus a `kb reindex` once left 8,880 index rows for 5,100
cases (duplicate query results), one writer died on a Lance "Retryable commit conflict", and
`kb stats --index` reported nothing wrong. Index writes now hold a file lock beside the index,
a reconcile removes duplicate rows, and `kb stats --index` checks ids against the store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from remedy.cases.errors import KBError
from remedy.cases.io import case_to_json
from remedy.kb.facade import KnowledgeBase
from remedy.retrieval.index import write_lock

from .conftest import invoke, make_case

REMEDY = Path(sys.executable).parent / "remedy"


def _env() -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    env.pop("REMEDY_KB", None)
    env.pop("REMEDY_SERVER", None)
    return env


def _files(tmp_path: Path, n_files: int = 3, per_file: int = 30, overlap: int = 10) -> tuple[list[Path], int]:
    """JSONL files whose neighbours share ``overlap`` identical cases; returns them and the distinct count."""
    total = (n_files - 1) * (per_file - overlap) + per_file
    lines = [
        case_to_json(make_case(case_id=f"c-w{i:03d}", summary=f"failure number {i}: the agent stalls"))
        for i in range(total)
    ]
    files = []
    for f in range(n_files):
        start = f * (per_file - overlap)
        path = tmp_path / f"part{f}.jsonl"
        path.write_text("\n".join(lines[start : start + per_file]) + "\n")
        files.append(path)
    return files, total


def _index_ids(kb_dir: Path) -> list[str]:
    """Every row's id, read straight from the Lance table (duplicates kept)."""
    import lancedb

    table = lancedb.connect(str(kb_dir / "index")).open_table("signatures")
    return table.to_arrow().column("id").to_pylist()


@pytest.mark.slow
def test_concurrent_imports_and_a_reindex_leave_one_row_per_case(tmp_path):
    kb_dir = tmp_path / "kb"
    init = subprocess.run([str(REMEDY), "kb", "init", "--no-examples", "--kb", str(kb_dir)], env=_env(), timeout=300)
    assert init.returncode == 0
    files, total = _files(tmp_path)
    procs = [
        subprocess.Popen(
            [str(REMEDY), "kb", "import", str(f), "--kb", str(kb_dir)],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for f in files
    ]
    procs.append(
        subprocess.Popen(
            [str(REMEDY), "kb", "reindex", "--kb", str(kb_dir)],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    )
    for p in procs:
        _, err = p.communicate(timeout=600)
        # a DuckDB lock held past its retry window is the only acceptable failure, and it stores nothing
        assert p.returncode == 0 or "locked by" in err, err
        assert "Traceback" not in err and "conflict" not in err.lower(), err
    for f, p in zip(files, procs):
        if p.returncode != 0:  # retry what lost the DuckDB race, as a user would
            subprocess.run([str(REMEDY), "kb", "import", str(f), "--kb", str(kb_dir)], env=_env(), check=True)
    ids = _index_ids(kb_dir)
    assert len(ids) == len(set(ids)) == total
    stats = subprocess.run(
        [str(REMEDY), "kb", "stats", "--index", "--json", "--kb", str(kb_dir)],
        env=_env(),
        capture_output=True,
        text=True,
    )
    data = json.loads(stats.stdout)
    assert stats.returncode == 0 and data["index_rows"] == data["store"]["total"] == total, data


def _duplicate_a_row(kb: KnowledgeBase, case_id: str) -> None:
    """What racing writers left: a second row for an indexed id (appended behind the lock's back)."""
    table = kb.index._table
    row = table.search().where(f"id = '{case_id}'").limit(1).to_arrow()
    table.add(pa.Table.from_batches(row.select(table.schema.names).to_batches(), schema=table.schema))


def _kb(path: Path, embedder) -> KnowledgeBase:
    kb = KnowledgeBase.open(path, embedder=embedder)
    cases = [make_case(case_id=f"c-{i}", summary=f"case {i} stalls") for i in range(4)]
    kb.add_many(cases)
    return kb


def test_stats_flags_duplicates_and_reopen_repairs_them(tmp_path, embedder, monkeypatch, capsys):
    kb = _kb(tmp_path / "kb", embedder)
    _duplicate_a_row(kb, "c-2")
    assert kb.index.count() == 5
    stats = kb.stats()
    assert stats.index_duplicates == 1 and stats.index_missing == stats.index_extra == 0
    assert "1 id(s) with duplicate rows" in stats.index_problem and "remedy kb reindex" in stats.index_problem
    code, out = _cli(monkeypatch, capsys, "kb", "stats", "--index", "--kb", str(kb.root))
    assert code == 1 and "remedykbreindex" in "".join(out.split())
    hits = kb.similar("case 2 stalls", k=10, mode="vector")
    assert len(hits) == 5 and [h.case.case_id for h in hits].count("c-2") == 2  # the finding: duplicate results
    kb.close()

    with KnowledgeBase.open(tmp_path / "kb", embedder=embedder) as reopened:  # reconcile on open repairs it
        assert sorted(_index_ids(reopened.root)) == ["c-0", "c-1", "c-2", "c-3"]
        assert reopened.stats().index_problem == ""
        assert [h.case.case_id for h in reopened.similar("case 2 stalls", k=10, mode="vector")].count("c-2") == 1


def test_stats_flags_missing_and_extra_ids_and_reindex_repairs_them(tmp_path, embedder, monkeypatch, capsys):
    kb = _kb(tmp_path / "kb", embedder)
    kb.index.delete(["c-1"])  # a case the index lost
    kb.index.upsert([make_case(case_id="c-ghost")])  # a row whose case is gone
    _duplicate_a_row(kb, "c-3")
    stats = kb.stats()
    assert (stats.index_missing, stats.index_extra, stats.index_duplicates) == (1, 1, 1)
    assert stats.index_rows == 5 and stats.store.total == 4
    kb.reindex()
    assert sorted(_index_ids(kb.root)) == ["c-0", "c-1", "c-2", "c-3"] and kb.stats().index_problem == ""
    code, out = _cli(monkeypatch, capsys, "kb", "stats", "--index", "--json", "--kb", str(kb.root))
    assert code == 0 and json.loads(out)["index_duplicates"] == 0


def test_a_commit_conflict_becomes_a_reconcile(tmp_path, embedder, monkeypatch):
    kb = _kb(tmp_path / "kb", embedder)
    real = type(kb.index).upsert
    calls = []

    def conflicting(self, cases, vectors=None):
        calls.append(len(cases))
        if len(calls) == 1:  # what Lance raised in a writer racing others
            raise RuntimeError("lance error: Retryable commit conflict for version 7: This MergeInsert transaction")
        return real(self, cases, vectors)

    monkeypatch.setattr(type(kb.index), "upsert", conflicting)
    assert kb.add_many([make_case(case_id="c-new", summary="a new case")]).added == 1
    assert "c-new" in kb.index.ids() and kb.stats().index_problem == ""
    assert not list((kb.root / "index-pending").glob("*.json"))  # nothing left to repair


def test_a_conflict_that_reconcile_cannot_fix_is_one_clean_line(tmp_path, embedder, monkeypatch):
    kb = _kb(tmp_path / "kb", embedder)

    def conflicting(self, cases, vectors=None):
        raise RuntimeError("lance error: Retryable commit conflict for version 7")

    monkeypatch.setattr(type(kb.index), "upsert", conflicting)
    with pytest.raises(KBError, match=r"conflicted with another writer.*1 case\(s\) are stored.*remedy kb reindex"):
        kb.add_many([make_case(case_id="c-new")])
    assert "c-new" in kb.store.ids()


def test_a_writer_waits_for_the_lock_held_by_another_process(tmp_path, embedder):
    kb = _kb(tmp_path / "kb", embedder)
    lock = write_lock(kb.root / "index")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time, filelock\n"
            "with filelock.FileLock(sys.argv[1]):\n"
            "    print('held', flush=True); time.sleep(60)\n",
            lock.lock_file,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        lock.timeout = 0.3
        with pytest.raises(KBError, match="busy with another writer.*retry"):
            kb.add_many([make_case(case_id="c-late")])
    finally:
        lock.timeout = 900.0
        holder.kill()
        holder.wait()
    kb.close()
    with KnowledgeBase.open(tmp_path / "kb", embedder=embedder) as reopened:  # the stored case is indexed
        assert "c-late" in reopened.index.ids()


def _cli(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    code, out, _ = invoke(monkeypatch, capsys, *args)
    return code, out
