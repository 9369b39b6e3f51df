"""A write stopped between the store and the index leaves a pending file; the next open repairs the index.

The case that matters is a *changed* case (same id, new content): its id is already in the
index, so comparing id sets cannot see that the row still holds the old status and effect.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from remedy.cases.io import write_cases
from remedy.kb.facade import PENDING_DIR, KnowledgeBase

from .conftest import make_case

SUMMARY = "The pole falls after a few dozen steps; learning stopped improving early."

# Killed with SIGKILL by its own progress hook, which add_many calls once the store write returned.
_KILLED_AFTER_STORE = """
import os, signal, sys
from remedy.cases.io import read_cases
from remedy.kb.facade import KnowledgeBase

cases, _ = read_cases(sys.argv[2])
with KnowledgeBase.open(sys.argv[1]) as kb:
    kb.add_many(cases, progress=lambda done, total: os.kill(os.getpid(), signal.SIGKILL))
print("not killed")
"""


def _old_and_new():
    old = make_case("c-pole", summary=SUMMARY, status="no_effect", effect=None)
    return old, make_case("c-pole", summary=SUMMARY, status="improved", effect=30.0)


def _improved_hits(kb: KnowledgeBase) -> list[str]:
    """Ids the index returns under the status filter: what the index row says, not the store."""
    return [h.case.case_id for h in kb.similar("the pole falls", k=5, status="improved")]


def test_changed_case_killed_between_store_and_index_is_reindexed_on_next_open(kb_path, embedder, tmp_path):
    old, new = _old_and_new()
    with KnowledgeBase.open(kb_path, embedder=embedder) as kb:
        kb.add(old)
    path = tmp_path / "new.jsonl"
    write_cases(path, [new])
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_AFTER_STORE, str(kb_path), str(path)],
        capture_output=True,
        text=True,
        env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"),
        timeout=600,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]  # killed, after the store write and before the index one
    assert list((kb_path / PENDING_DIR).iterdir())  # the dead write's ids are on disk
    with KnowledgeBase.open(kb_path, embedder=embedder, reconcile=False) as kb:
        assert kb.get("c-pole").status == "improved" and _improved_hits(kb) == []  # the crash left the index stale
    with KnowledgeBase.open(kb_path, embedder=embedder) as kb:  # the next ordinary open repairs it
        assert _improved_hits(kb) == ["c-pole"]
        assert kb.reconcile().in_sync
    assert list((kb_path / PENDING_DIR).iterdir()) == []


def test_failed_index_write_of_a_changed_case_is_refreshed_by_reconcile(kb, embedder, monkeypatch):
    old, new = _old_and_new()
    kb.add(old)

    def disk_full(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(type(kb.index), "upsert", disk_full)
    with pytest.raises(OSError):
        kb.add(new)
    monkeypatch.undo()
    assert _improved_hits(kb) == []
    report = kb.reconcile()
    assert (report.added, report.removed, report.refreshed) == (0, 0, 1) and not report.in_sync
    assert _improved_hits(kb) == ["c-pole"]


def test_writes_that_finish_or_fail_in_the_store_leave_no_pending_file(kb, corpus, monkeypatch):
    kb.add_many(corpus)
    kb.add_many(corpus)  # unchanged: no index write at all

    def locked(*a, **k):
        raise OSError("store locked")

    monkeypatch.setattr(type(kb.store), "upsert", locked)
    with pytest.raises(OSError):
        kb.add(corpus[0])
    assert list((kb.root / PENDING_DIR).iterdir()) == []


def test_pending_file_of_a_live_writer_is_left_alone(kb, corpus):
    kb.add_many(corpus[:2])
    writer = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        pending = kb.root / PENDING_DIR / f"{writer.pid}-0.json"
        pending.write_text(json.dumps([corpus[0].case_id]))
        assert kb.reconcile().in_sync and pending.exists()  # its index write may still be coming
    finally:
        writer.communicate(b"")  # the writer ends (and is reaped)
    assert kb.reconcile().refreshed == 1 and not pending.exists()
