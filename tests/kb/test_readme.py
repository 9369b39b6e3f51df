"""The README's claims, checked against the code: its command list against the CLI, its links, its Python snippet."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer

from remedy.kb import KnowledgeBase
from remedy.kb.cli import app

ROOT = Path(__file__).parents[2]
README = (ROOT / "README.md").read_text()
#: the README stays a user's page; figures and history live in docs/
MAX_README_LINES = 400


def _registered() -> set[tuple[str, ...]]:
    """Every command path the CLI registers: ("query",), ("kb", "init"), ..."""
    root: Any = typer.main.get_command(app)  # a group; typer may bring its own click, so no isinstance
    paths: set[tuple[str, ...]] = set()
    for name, cmd in root.commands.items():
        if hasattr(cmd, "commands"):
            paths.update((name, sub) for sub in cmd.commands)
        else:
            paths.add((name,))
    return paths


def _commands_table() -> str:
    section = README.split("## Commands", 1)[1]
    return section.split("\n## ", 1)[0]


def test_readme_stays_short() -> None:
    assert len(README.splitlines()) <= MAX_README_LINES


def test_every_registered_command_is_in_the_readme() -> None:
    table = _commands_table()
    missing = [" ".join(p) for p in sorted(_registered()) if not re.search(rf"`(remedy )?{' '.join(p)}\b", table)]
    assert not missing, f"commands missing from the README's Commands table: {missing}"


def test_every_command_the_readme_names_exists() -> None:
    registered = _registered()
    groups = {p[0] for p in registered if len(p) == 2}
    named = re.findall(r"`remedy ([a-z-]+)(?: ([a-z-]+))?", _commands_table())
    unknown = []
    for first, second in named:
        path = (first, second) if first in groups else (first,)
        if path not in registered:
            unknown.append(" ".join(path))
    assert not unknown, f"the README names commands the CLI does not have: {unknown}"


def test_relative_links_point_at_files() -> None:
    links = re.findall(r"\]\(((?!https?://)[^)#]+)\)", README)
    assert links, "the README links its docs/"
    assert [link for link in links if not (ROOT / link).exists()] == []


def test_python_api_snippet_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, embedder, corpus) -> None:
    with KnowledgeBase.open(tmp_path / ".remedy", embedder=embedder) as kb:
        kb.add_many(corpus)
    snippet = next(b for b in re.findall(r"```python\n(.*?)```", README, re.S) if "KnowledgeBase.open" in b)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(snippet, "README.md", "exec"), namespace)  # the README's own example, as a user would run it
    assert namespace["report"].diagnosis.causes
