"""Which `remedy serve` a cold `remedy query` may ask unasked: a live one on this machine, with a token set."""

from __future__ import annotations

import json
import os

import pytest

from remedy.cases.store import SERVE_MARKER
from remedy.kb.cli.connect import serving


def _marker(kb, url: str, pid: int) -> None:
    kb.mkdir(exist_ok=True)
    (kb / SERVE_MARKER).write_text(json.dumps({"url": url, "pid": pid}))


@pytest.mark.parametrize(
    ("url", "pid", "token", "expected"),
    [
        ("http://127.0.0.1:8765", "self", "rmd_x", "http://127.0.0.1:8765"),
        ("http://localhost:9000", "self", "rmd_x", "http://localhost:9000"),
        ("http://127.0.0.1:8765", "self", "", None),  # no token: the command opens the KB itself
        ("http://10.1.2.3:8765", "self", "rmd_x", None),  # the token never goes where a file says
        ("http://[::1", "self", "rmd_x", None),  # not a URL
        ("http://127.0.0.1:8765", "gone", "rmd_x", None),  # a stale marker: its service has stopped
    ],
)
def test_serving_follows_only_a_live_local_service(tmp_path, monkeypatch, capsys, url, pid, token, expected):
    gone = max(int(p) for p in os.listdir("/proc") if p.isdigit()) + 10_000
    _marker(tmp_path / "kb", url, os.getpid() if pid == "self" else gone)
    monkeypatch.setenv("REMEDY_TOKEN", token)
    assert serving(tmp_path / "kb") == expected
    assert ("asking `remedy serve`" in capsys.readouterr().err) == (expected is not None)


def test_no_marker_no_service(tmp_path, monkeypatch):
    monkeypatch.setenv("REMEDY_TOKEN", "rmd_x")
    assert serving(tmp_path / "kb") is None
