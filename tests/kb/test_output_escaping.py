"""Text from stored cases never drives the terminal: escape sequences and rich markup print as written.

`case show` and `query` printed a case's text raw: an ANSI/OSC escape sequence in a summary
reached the terminal, a right-to-left override reordered what was shown, and ``[red]...[/]``
was read as rich markup. Everything printed from case text now goes through one helper
(:func:`remedy.kb.cli.common.shown`); ``--json`` stays exact.
"""

from __future__ import annotations

import io
import json
import sys

import pytest
from rich.console import Console

from remedy.kb.cli.common import shown, shown_cell
from remedy.kb.facade import KnowledgeBase

from .conftest import make_case

HOSTILE = "lander \x1b[31mRED\x1b[0m hovers \x1b]0;pwned\x07 [red]markup[/] \u202eevil\rover"
ENV = "Evil\x1b[2J-v0"


@pytest.fixture
def hostile_kb(kb_path, embedder):
    case = make_case(case_id="c-hostile", env_id=ENV, summary=HOSTILE, algo="[bold]PPO[/]", symptoms=["hovering"])
    with KnowledgeBase.open(kb_path, embedder=embedder) as kb:
        kb.add(case)
    return kb_path


def _cli(monkeypatch, capsys, *args: str, terminal: bool = False) -> str:
    """stdout of ``remedy ARGS``; ``terminal`` renders the rich tables as on a terminal (no colours), else as
    into a pipe."""
    from remedy.kb import cli
    from remedy.kb.cli import kb as kb_cli
    from remedy.kb.cli import render

    screen = io.StringIO()
    fake = Console(file=screen, force_terminal=terminal, color_system=None, width=300)
    for module in (kb_cli, render):  # the commands print and the renderers print
        monkeypatch.setattr(module, "console", fake)
    monkeypatch.setattr(sys, "argv", ["remedy", *args])
    capsys.readouterr()
    try:
        cli.main()
    except SystemExit as ex:
        assert not ex.code, capsys.readouterr().err
    return screen.getvalue() + capsys.readouterr().out


def _assert_inert(out: str) -> None:
    assert "\x1b" not in out and "\u202e" not in out and "\r" not in out and "\x07" not in out
    assert "\\x1b[31mRED" in out and "\\u202eevil" in out  # shown as escapes, not dropped
    assert "[red]markup[/]" in out  # markup printed as written, not applied


def test_case_show_escapes_case_text(hostile_kb, monkeypatch, capsys):
    out = _cli(monkeypatch, capsys, "case", "show", "c-hostile", "--kb", str(hostile_kb), terminal=True)
    _assert_inert(out)
    assert "Evil\\x1b[2J-v0" in out and "[bold]PPO[/]" in out


def test_query_table_and_pipe_escape_case_text(hostile_kb, monkeypatch, capsys):
    table = _cli(monkeypatch, capsys, "query", "lander hovers", "--kb", str(hostile_kb), terminal=True)
    assert "\x1b" not in table and "Evil\\x1b[2J-v0" in table and "[bold]PPO[/]" in table
    piped = _cli(monkeypatch, capsys, "query", "lander hovers", "--kb", str(hostile_kb))
    row = piped.splitlines()[1].split("\t")
    assert row[0] == "c-hostile" and row[3] == "Evil\\x1b[2J-v0" and "\x1b" not in piped


def test_json_output_stays_exact(hostile_kb, monkeypatch, capsys):
    case = json.loads(_cli(monkeypatch, capsys, "case", "show", "c-hostile", "--kb", str(hostile_kb), "--json"))
    assert case["signature"]["summary"] == HOSTILE and case["subject"]["env_id"] == ENV
    hits = json.loads(_cli(monkeypatch, capsys, "query", "lander hovers", "--kb", str(hostile_kb), "--json"))
    assert hits[0]["summary"] == HOSTILE


def test_shown_keeps_ordinary_text():
    assert shown("Pendulum-v1 · é 中 😀\n\tnext") == "Pendulum-v1 · é 中 😀\n\tnext"
    assert shown("a\x00b\u200bc\x9bd") == "a\\x00b\\u200bc\\x9bd"
    assert shown("[link=file:///etc]x[/link]") == "\\[link=file:///etc]x\\[/link]"
    assert shown_cell("a\tb\nc\x1b") == "a b c\\x1b"
