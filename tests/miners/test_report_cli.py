"""`remedy report`: a KB's stored rules and the cases they cite, written as Markdown and HTML."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from remedy.cases.model import Case
from remedy.kb.cli import app, main
from remedy.kb.facade import KnowledgeBase
from remedy.miners.mine import MiningResult
from remedy.miners.model import Rule
from remedy.miners.store import RuleStore

from .report_cases import sample_cases, sample_rules


@pytest.fixture
def built_cases() -> list[Case]:
    """Six verified Pendulum cases (see :func:`sample_cases`)."""
    return sample_cases()


@pytest.fixture
def built_rules(built_cases: list[Case]) -> list[Rule]:
    """An accepted, a proposed, a flagged and a rejected rule over ``built_cases``."""
    return sample_rules(built_cases)


runner = CliRunner()


def _kb(root: Path, cases, rules=()) -> Path:
    """A KB holding ``cases`` in its store (the report reads no index) and ``rules`` as mined."""
    with KnowledgeBase.open(root, create=True, reconcile=False) as kb:
        kb.store.add_many(cases)
        if rules:
            RuleStore(kb.store).upsert_mined(MiningResult(rules=list(rules), tested=list(rules)))
    return root


def _run_main(monkeypatch, capsys, *args) -> tuple[int, str]:
    """``remedy ARGS`` through ``main()`` (where errors become one red line); returns (exit code, stderr)."""
    monkeypatch.setattr(sys, "argv", ["remedy", *map(str, args)])
    capsys.readouterr()
    try:
        main()
        code = 0
    except SystemExit as ex:
        code = ex.code if isinstance(ex.code, int) else 1
    return code, capsys.readouterr().err


def test_report_writes_the_kb_rules_with_their_cases(tmp_path, built_cases, built_rules):
    root = _kb(tmp_path / "kb", built_cases, built_rules)
    accepted = built_rules[0]
    with KnowledgeBase.open(root, create=False, reconcile=False) as kb:
        RuleStore(kb.store).review(accepted.id, "accepted", reviewer="alice", note="checked the runs")
    out = tmp_path / "reports"
    args = ["report", "--out", out, "--date", "2026-12-03", "--kb", root, "--json"]
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, (result.output, result.exception)
    got = json.loads(result.stdout)
    md = Path(got["markdown"])
    assert md == out / "heuristics-2026-12-03.md" and Path(got["html"]).is_file()
    assert got["rules"]["accepted"] >= 1 and sum(got["rules"].values()) == len(built_rules)
    text = md.read_text()
    accepted_section = text.split("## Accepted rules")[1].split("## Rules awaiting review")[0]
    assert f"### {accepted.id}:" in accepted_section and "accepted by alice" in accepted_section
    assert "| verified cases in the KB | 6 |" in text
    # the cited cases came from the KB: the appendix has their patches, not "not in this KB"
    assert "not in this KB" not in text and "patch: action smoothness penalty 0.1" in text
    assert all((md.parent / rel).is_file() for rel in re.findall(r"!\[[^]]*\]\(([^)]+)\)", text))


def test_report_of_a_kb_without_rules_says_how_to_mine(tmp_path, built_cases):
    root = _kb(tmp_path / "kb", built_cases)
    result = runner.invoke(app, ["report", "--out", str(tmp_path / "r"), "--date", "2026-12-03", "--kb", str(root)])
    assert result.exit_code == 0, (result.output, result.exception)
    assert "nothing mined yet" in result.output and "remedy mine" in result.output
    assert str(tmp_path / "r" / "heuristics-2026-12-03.html") in result.output.replace("\n", "")
    assert "**Nothing mined yet**" in (tmp_path / "r" / "heuristics-2026-12-03.md").read_text()


def test_report_into_a_file_is_one_error_line_and_writes_nothing(tmp_path, monkeypatch, capsys, built_cases):
    root = _kb(tmp_path / "kb", built_cases)
    target = tmp_path / "taken"
    target.write_text("keep me")
    code, err = _run_main(monkeypatch, capsys, "report", "--out", target, "--kb", root)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "taken is a file, not a directory" in " ".join(err.split()) and "--out" in err
    assert target.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kb", "taken"]


def test_report_of_a_missing_kb_is_one_error_line(tmp_path, monkeypatch, capsys):
    code, err = _run_main(monkeypatch, capsys, "report", "--out", tmp_path / "r", "--kb", tmp_path / "nope")
    assert code == 1 and err.startswith("error: ") and "Traceback" not in err
    assert not (tmp_path / "r").exists()
