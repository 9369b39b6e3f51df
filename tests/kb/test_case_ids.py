"""Case ids and re-imports: a conflicting re-import is refused, ids keep to a safe alphabet.

Re-importing an existing id with different content used to overwrite it and report ``added: 1``;
ids holding NUL, ``../`` or a right-to-left override were accepted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pydantic
import pytest

from remedy.cases.errors import ImportFileError, ValidationError
from remedy.cases.io import case_to_json, read_cases
from remedy.cases.model import CASE_ID_PATTERN, Case
from remedy.kb.facade import KnowledgeBase, example_files

from .conftest import invoke as _cli
from .conftest import make_case

REPORTS = Path(__file__).parents[2] / "reports" / "kb"


def _write(path: Path, cases: list[Case]) -> Path:
    path.write_text("".join(case_to_json(c) + "\n" for c in cases))
    return path


def test_a_conflicting_reimport_is_refused_whole(kb, tmp_path):
    first = [make_case(case_id="c-a", summary="first words"), make_case(case_id="c-b")]
    kb.add_many(first)
    before = {c.case_id: c.to_json() for c in kb.cases()}
    changed = make_case(case_id="c-a", summary="other words")
    fresh = make_case(case_id="c-new")
    with pytest.raises(
        ValidationError, match=r"1 case id\(s\) already stored with different content \(c-a\).*--replace"
    ):
        kb.import_file(_write(tmp_path / "clash.jsonl", [fresh, changed, first[1]]))
    assert {c.case_id: c.to_json() for c in kb.cases()} == before  # nothing imported, not even c-new
    assert "c-new" not in kb.index.ids()


def test_identical_reimport_is_unchanged_and_replace_overwrites(kb, tmp_path):
    cases = [make_case(case_id="c-a", summary="first words"), make_case(case_id="c-b")]
    same = _write(tmp_path / "same.jsonl", cases)
    assert kb.import_file(same).added == 2
    again = kb.import_file(same)
    assert (again.added, again.unchanged, again.replaced) == (0, 2, 0)
    changed = _write(tmp_path / "changed.jsonl", [make_case(case_id="c-a", summary="other words"), cases[1]])
    report = kb.import_file(changed, replace=True)
    assert (report.added, report.replaced, report.unchanged) == (0, 1, 1)
    assert kb.get("c-a").signature.summary == "other words"
    assert [h.case.case_id for h in kb.similar("other words", k=1)] == ["c-a"]


def test_cli_import_refuses_a_conflict_in_one_line(kb_path, embedder, tmp_path, monkeypatch, capsys):
    with KnowledgeBase.open(kb_path, embedder=embedder) as kb:
        kb.add(make_case(case_id="c-a", summary="first words"))
    clash = _write(tmp_path / "clash.jsonl", [make_case(case_id="c-a", summary="other words")])
    code, out, err = _cli(monkeypatch, capsys, "kb", "import", str(clash), "--kb", str(kb_path))
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "c-a" in err and "--replace" in err
    code, out, err = _cli(monkeypatch, capsys, "kb", "import", str(clash), "--kb", str(kb_path), "--replace")
    assert code == 0 and "0 added, 1 replaced, 0 unchanged" in out, err
    code, out, _ = _cli(monkeypatch, capsys, "kb", "import", str(clash), "--kb", str(kb_path))
    assert code == 0 and "0 added, 1 unchanged" in out


@pytest.mark.parametrize(
    "bad",
    [
        "c-\x00x",
        "../etc/passwd",
        "a/b",
        "c-\u202egnp.exe",
        "c-\u200bzero",
        "[red]x[/]",
        "c-\x1b[31m",
        "..",
        "",
        "x" * 129,
    ],
)
def test_unsafe_ids_are_refused_at_the_model(bad):
    with pytest.raises(pydantic.ValidationError, match="case_id .* is not allowed"):
        make_case(case_id=bad)


def test_unsafe_ids_in_an_import_file_are_one_clear_problem(tmp_path):
    good = json.loads(case_to_json(make_case(case_id="c-good")))
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({**good, "case_id": "c-\u202eevil"}) + "\n")
    with pytest.raises(ImportFileError) as err:
        read_cases(path)
    assert "line 1" in str(err.value) and "is not allowed" in str(err.value)
    assert "\u202e" not in str(err.value)  # the message shows the escape, not the character itself


def test_every_shipped_and_generated_id_is_allowed():
    files = [*example_files(), *sorted(REPORTS.glob("*.jsonl"))]
    assert files
    for path in files:
        for line in path.read_text().splitlines():
            if line.strip():
                assert CASE_ID_PATTERN.fullmatch(json.loads(line)["case_id"]), (path, line[:80])
    from remedy.cases.model import new_case_id

    assert CASE_ID_PATTERN.fullmatch(new_case_id("run", 1, {"x": 2}))


def test_a_rerun_of_the_same_computation_is_the_stored_case_not_a_conflict(kb, tmp_path):
    """Two exports of one verification (same id) differ in when and how fast it ran: unchanged, not refused."""
    case = make_case(case_id="c-rerun", summary="the same episode")
    kb.add_many([case])
    data = json.loads(case_to_json(case))
    data["provenance"]["created_at"] = "2030-01-01T00:00:00Z"
    if data.get("verification"):
        data["verification"]["wall_time_s"] = 123.0
    (tmp_path / "rerun.jsonl").write_text(json.dumps(data) + "\n")
    report = kb.import_file(tmp_path / "rerun.jsonl")
    assert (report.added, report.unchanged) == (0, 1)
    assert kb.get("c-rerun").to_json() == case.to_json()  # the stored one stays as it was
