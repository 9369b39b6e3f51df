"""A full disk and a read-only KB (issue 29): one clear line, nothing half-written, reads still work.

Disk-full is simulated where the bytes would be written (DuckDB's COMMIT, a Lance
merge_insert) by raising what the OS and the libraries raise; a read-only mount is
simulated through the store's one writability probe, since the tests run as root
(where file modes do not stop writes), and the KB directory is checked byte for
byte afterwards, so a write that slipped through would still fail the test.
"""

from __future__ import annotations

import errno
import json
import logging
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from remedy.cases import store as store_module
from remedy.cases.errors import DiskFullError, KBPathError
from remedy.cases.store import CaseStore
from remedy.kb import KnowledgeBase
from remedy.kb.cli import app as cli

from .conftest import corpus_cases, make_case

runner = CliRunner()
DUCKDB_ENOSPC = 'IO Error: Could not write file "remedy.duckdb.wal": No space left on device'


class _FullDiskConnection:
    """A real DuckDB connection whose COMMIT fails the way a full disk makes it fail."""

    def __init__(self, con: duckdb.DuckDBPyConnection, error: Exception) -> None:
        self._con, self._error = con, error

    def execute(self, sql: str, *args: object):
        if sql.strip().upper() == "COMMIT":
            raise self._error
        # DuckDB finds Arrow tables named in SQL among its caller's locals, and the caller is now this proxy
        for name, value in sys._getframe(1).f_locals.items():
            if isinstance(value, pa.Table) and name in sql:
                self._con.register(name, value)
        return self._con.execute(sql, *args)

    def __getattr__(self, name: str):
        return getattr(self._con, name)


@pytest.mark.parametrize(
    "error",
    [duckdb.IOException(DUCKDB_ENOSPC), OSError(errno.ENOSPC, "No space left on device")],
    ids=["duckdb-io-error", "oserror-enospc"],
)
def test_disk_full_at_a_store_commit_is_one_line_and_stores_nothing(tmp_path, monkeypatch, error):
    store = CaseStore(tmp_path / "remedy.duckdb")
    store.add_many(corpus_cases())
    before = {c.case_id: c for c in (store.get(i) for i in store.ids())}
    real = duckdb.connect
    monkeypatch.setattr(store_module.duckdb, "connect", lambda *a, **k: _FullDiskConnection(real(*a, **k), error))
    changed = before["c-lander-hover"].model_copy(update={"scenario": "changed"})
    with pytest.raises(DiskFullError) as info:
        store.add_many([make_case("c-new"), changed])
    message = str(info.value)
    assert message == (
        f"no space left on device writing {tmp_path / 'remedy.duckdb'}; free space and retry; nothing was stored"
    )
    monkeypatch.setattr(store_module.duckdb, "connect", real)
    assert store.ids() == set(before) and store.get("c-lander-hover") == before["c-lander-hover"]
    assert CaseStore(tmp_path / "remedy.duckdb").count() == 5  # reopens cleanly


def test_disk_full_at_a_lance_write_is_one_line_and_the_index_catches_up(kb_path, embedder, monkeypatch):
    with KnowledgeBase.open(kb_path, embedder=embedder) as kb:
        kb.add_many(corpus_cases())
        table_type = type(kb.index._table)

        def no_space(self, *args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

        with monkeypatch.context() as m:
            m.setattr(table_type, "merge_insert", no_space)
            with pytest.raises(DiskFullError) as info:
                kb.add(make_case("c-new", summary="The cart drifts off the track."))
            assert str(info.value).startswith(f"no space left on device writing {kb_path / 'index'}; free space")
            assert "\n" not in str(info.value)
        assert kb.index.count() == 5  # the index kept its last complete version
        assert kb.store.count() == 6  # the store of record has the case; the index is behind
    with KnowledgeBase.open(kb_path, embedder=embedder) as again:  # the next open reconciles
        assert again.index.ids() == again.store.ids() and "c-new" in again.index.ids()


def test_disk_full_at_the_first_write_of_an_import_is_one_line(kb_path, embedder, monkeypatch):
    with KnowledgeBase.open(kb_path, embedder=embedder) as kb:
        kb.add_many(corpus_cases())

        def no_space(self, *args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(Path, "write_text", no_space)  # the pending-write marker is written first
        with pytest.raises(DiskFullError, match="nothing was stored"):
            kb.add(make_case("c-new"))
        monkeypatch.undo()
        assert kb.store.count() == 5 and kb.index.count() == 5
        assert not list((kb_path / "index-pending").glob("*.json"))


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


@pytest.fixture
def read_only_kb(tmp_path, embedder, monkeypatch) -> Path:
    """A KB with the corpus, then 'mounted read-only': the writability probe says no."""
    root = tmp_path / "kb"
    with KnowledgeBase.open(root, embedder=embedder) as kb:
        kb.add_many(corpus_cases())
    monkeypatch.setattr(store_module, "_writable", lambda path: False)
    return root


def test_a_read_only_kb_can_be_read_and_refuses_writes_in_one_line(read_only_kb, embedder, caplog):
    before = _snapshot(read_only_kb)
    with caplog.at_level(logging.WARNING), KnowledgeBase.open(read_only_kb, embedder=embedder) as kb:
        assert kb.store.read_only and "read-only" in caplog.text
        assert kb.stats().store.total == 5
        assert kb.similar("the lander hovers above the pad", k=1)[0].case.case_id == "c-lander-hover"
        assert kb.get("c-walker-scale").subject.env_id == "BipedalWalker-v3"
        assert len(list(kb.cases())) == 5
        with pytest.raises(KBPathError, match="read-only"):
            kb.store.add(make_case("c-new"))
        with pytest.raises(KBPathError, match="read-only"):
            kb.index.upsert([make_case("c-new")])
        with pytest.raises(KBPathError, match="read-only"):
            kb.add(make_case("c-new"))
    assert _snapshot(read_only_kb) == before  # not a byte written, not even a lock file


def test_read_commands_work_on_a_read_only_kb(read_only_kb, tmp_path):
    before = _snapshot(read_only_kb)
    kb = str(read_only_kb)
    stats = runner.invoke(cli, ["kb", "stats", "--kb", kb, "--json"])
    assert stats.exit_code == 0, stats.output
    assert json.loads(stats.output)["store"]["total"] == 5
    query = runner.invoke(cli, ["query", "lander hovers above the pad", "--kb", kb, "--json"])
    assert query.exit_code == 0 and json.loads(query.output)[0]["case_id"] == "c-lander-hover", query.output
    show = runner.invoke(cli, ["case", "show", "c-pendulum-jitter", "--kb", kb])
    assert show.exit_code == 0 and "Pendulum-v1" in show.output
    out = tmp_path / "out.jsonl"
    assert runner.invoke(cli, ["kb", "export", str(out), "--kb", kb]).exit_code == 0
    assert len(out.read_text().splitlines()) == 5
    assert _snapshot(read_only_kb) == before
