"""The serve marker read by lock errors: it names the service only when that service holds the lock."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from remedy.cases.store import SERVE_MARKER, _served_by


def _marker(tmp_path, pid: int) -> object:
    path = tmp_path / SERVE_MARKER
    path.write_text(json.dumps({"url": "http://127.0.0.1:8765", "pid": pid}))
    return path


def test_marker_of_the_lock_holder_names_the_service(tmp_path):
    assert _served_by(_marker(tmp_path, 4242), 4242) == "http://127.0.0.1:8765"


def test_marker_of_another_process_is_ignored(tmp_path):
    assert _served_by(_marker(tmp_path, 4242), 999) == ""


def test_stale_marker_of_a_dead_process_is_ignored_when_the_holder_is_unknown(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert _served_by(_marker(tmp_path, int(dead.stdout)), None) == ""
    assert _served_by(_marker(tmp_path, os.getpid()), None) == "http://127.0.0.1:8765"


def test_missing_or_garbled_marker_is_ignored(tmp_path):
    assert _served_by(tmp_path / SERVE_MARKER, 1) == ""
    (tmp_path / SERVE_MARKER).write_text("{not json")
    assert _served_by(tmp_path / SERVE_MARKER, 1) == ""
