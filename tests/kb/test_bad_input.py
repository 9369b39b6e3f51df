"""Bad input through the CLI and the KnowledgeBase API: one clear error, nothing changed.

Each input must end in a non-zero exit (CLI, through the real ``main()`` error handler) or a
raised RemedyError (API) whose message names the problem, never a traceback, and the KB must be
byte-for-byte unchanged afterwards (every file under it hashed before and after).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from remedy.cases.errors import CaseNotFoundError, KBPathError, RemedyError, ValidationError
from remedy.cases.io import ImportLimits, case_to_json
from remedy.kb.cli import main
from remedy.kb.facade import KnowledgeBase

from .conftest import corpus_cases, make_case


def _snapshot(root: Path) -> dict[str, str]:
    """Path -> SHA-256 of every file under ``root`` (a KB directory, or a single file)."""
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _run(monkeypatch, capsys, *args) -> tuple[int, str]:
    """Run ``remedy ARGS`` in-process through ``main()``; returns (exit code, stderr)."""
    monkeypatch.setattr(sys, "argv", ["remedy", *map(str, args)])
    capsys.readouterr()
    try:
        main()
        code = 0
    except SystemExit as ex:
        code = ex.code if isinstance(ex.code, int) else 1
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def kb_root(tmp_path_factory, embedder) -> Path:
    """A KB holding the five-case corpus (read-only for these tests: each checks it is unchanged)."""
    root = tmp_path_factory.mktemp("bad") / "kb"
    with KnowledgeBase.open(root, embedder=embedder) as kb:
        kb.add_many(corpus_cases())
    return root


@pytest.fixture
def cli(kb_root, monkeypatch, capsys, embedder):
    """``cli(*args, code=1, says=...)``: runs the command, checks the error and that the KB is unchanged."""
    import remedy.kb.facade as facade

    monkeypatch.setattr(facade, "default_embedder", lambda: embedder)  # the session's model, loaded once

    def check(*args, code: int = 1, says: tuple[str, ...] = ()) -> str:
        before = _snapshot(kb_root)
        got, err = _run(monkeypatch, capsys, *args)
        assert got == code, err
        assert "Traceback" not in err
        if code == 1:
            lines = [ln for ln in err.splitlines() if ln.strip()]
            assert len(lines) == 1 and lines[0].startswith("error: "), err
        for fragment in says:
            assert fragment in " ".join(err.split()), err
        assert _snapshot(kb_root) == before, "the KB changed"
        return err

    return check


def _case_dict(**changes) -> dict:
    data = json.loads(case_to_json(make_case("bad-1")))
    for dotted, value in changes.items():
        node = data
        *path, last = dotted.split(".")
        for key in path:
            node = node[key]
        node[last] = value
    return data


def _jsonl(tmp_path: Path, *records, name: str = "in.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return p


# -- usage errors: typer's own (vendored click) exceptions, exit 2, usage line, no traceback ------

USAGE = [
    (["query", "lander", "--k", "x"], "Invalid value for '--k'"),
    (["query"], "Missing argument"),
    (["query", "lander", "--mode", "psychic"], "Invalid value for '--mode'"),
    (["query", "lander", "--action-space", "both"], "Invalid value for '--action-space'"),
    (["kb", "stats", "--bogus"], "No such option: --bogus"),
    (["kb", "import", "x.jsonl", "--max-cases", "0"], "Invalid value for '--max-cases'"),
    (["no-such-command"], "No such command"),
]


@pytest.mark.parametrize(("args", "says"), USAGE, ids=[" ".join(a) for a, _ in USAGE])
def test_usage_errors(cli, kb_root, args, says):
    cli(*args, "--kb", kb_root, code=2, says=(says,)) if args[0] != "no-such-command" else cli(
        *args, code=2, says=(says,)
    )


# -- query and case show ------------------------------------------------------------------------


def test_empty_query(cli, kb_root):
    cli("query", "   ", "--kb", kb_root, says=("query is empty",))


def test_nan_min_effect(cli, kb_root):
    cli("query", "lander", "--min-effect", "nan", "--kb", kb_root, says=("min_effect must be a finite number",))


def test_unknown_case_id(cli, kb_root):
    cli("case", "show", "c-nope", "--kb", kb_root, says=("no case 'c-nope'",))


# -- import: every format, every limit; nothing imported ----------------------------------------

BAD_RECORDS = [
    ("nan-effect", {"verification.effect.diff": "NaN"}, "verification.effect.diff"),
    ("inf-treatment", {"verification.effect.treatment": "Infinity"}, "verification.effect.treatment"),
    (
        "ci-reversed",
        {"verification.effect.ci_low": 9.0, "verification.effect.ci_high": 1.0},
        "ci_low (9.0) must not exceed",
    ),
    ("negative-seeds", {"verification.seeds": -2}, "verification.seeds"),
    ("negative-budget", {"verification.budget_steps": -100}, "verification.budget_steps"),
    ("negative-train-steps", {"subject.train_steps": -1}, "subject.train_steps"),
    ("unknown-status", {"verification.status": "great"}, "verification.status"),
    ("unknown-cause", {"diagnosis.causes": [{"cause": "gremlins", "confidence": 0.5}]}, "diagnosis.causes.0.cause"),
    (
        "confidence-nan",
        {"diagnosis.causes": [{"cause": "unknown", "confidence": "NaN"}]},
        "diagnosis.causes.0.confidence",
    ),
    ("empty-id", {"case_id": ""}, "case_id"),
    ("unknown-field", {"colour": "red"}, "colour"),
]


@pytest.mark.parametrize(("name", "changes", "says"), BAD_RECORDS, ids=[b[0] for b in BAD_RECORDS])
def test_import_refuses_bad_records(cli, kb_root, tmp_path, name, changes, says):
    path = _jsonl(tmp_path, json.loads(case_to_json(make_case("good-1"))), _case_dict(**changes))
    cli("kb", "import", path, "--kb", kb_root, says=("line 2", says, "nothing imported"))


def test_import_not_json(cli, kb_root, tmp_path):
    cli("kb", "import", _jsonl(tmp_path, "{not json"), "--kb", kb_root, says=("line 1: not valid JSON",))


def test_import_line_is_not_an_object(cli, kb_root, tmp_path):
    cli("kb", "import", _jsonl(tmp_path, "[1, 2]"), "--kb", kb_root, says=("expected a JSON object, got list",))


def test_import_duplicate_ids(cli, kb_root, tmp_path):
    rec = json.loads(case_to_json(make_case("dup")))
    cli("kb", "import", _jsonl(tmp_path, rec, rec), "--kb", kb_root, says=("duplicate case_id 'dup'",))


def test_import_missing_file(cli, kb_root, tmp_path):
    cli("kb", "import", tmp_path / "absent.jsonl", "--kb", kb_root, says=("no such file",))


def test_import_unknown_extension(cli, kb_root, tmp_path):
    p = tmp_path / "cases.csv"
    p.write_text("a,b\n")
    cli("kb", "import", p, "--kb", kb_root, says=("unknown file type '.csv'",))


def test_import_huge_line_is_refused_without_reading_it_whole(cli, kb_root, tmp_path):
    p = tmp_path / "huge.jsonl"
    with p.open("w") as fh:
        fh.write('{"case_id": "' + "x" * (3 << 20) + '"}\n')
    cli("kb", "import", p, "--kb", kb_root, says=("line 1 is longer than 1,048,576 bytes", "--max-line-bytes"))


def test_import_line_limit_flag(cli, kb_root, tmp_path):
    p = _jsonl(tmp_path, json.loads(case_to_json(make_case("small"))))
    cli(
        "kb",
        "import",
        p,
        "--kb",
        kb_root,
        "--max-line-bytes",
        "100",
        says=("over the limit of 100", "--max-line-bytes"),
    )


def test_import_too_many_cases(cli, kb_root, tmp_path):
    recs = [json.loads(case_to_json(make_case(f"n{i}"))) for i in range(3)]
    cli(
        "kb",
        "import",
        _jsonl(tmp_path, *recs),
        "--kb",
        kb_root,
        "--max-cases",
        "2",
        says=("more than 2 records", "--max-cases"),
    )


def test_import_field_too_long(cli, kb_root, tmp_path):
    rec = _case_dict(**{"signature.summary": "s" * 200_001})
    cli(
        "kb",
        "import",
        _jsonl(tmp_path, rec),
        "--kb",
        kb_root,
        says=("field 'signature.summary' holds 200,001 characters", "--max-field-chars"),
    )


def test_import_too_many_items(cli, kb_root, tmp_path):
    rec = _case_dict(**{"signature.features": {f"f{i}": 1.0 for i in range(60)}})
    cli(
        "kb",
        "import",
        _jsonl(tmp_path, rec),
        "--kb",
        kb_root,
        "--max-items",
        "50",
        says=("field 'signature.features' holds 60 items", "--max-items"),
    )


def test_import_json_not_an_array(cli, kb_root, tmp_path):
    p = tmp_path / "cases.json"
    p.write_text("42")
    cli("kb", "import", p, "--kb", kb_root, says=("expected a JSON array of cases",))


def test_import_json_malformed(cli, kb_root, tmp_path):
    p = tmp_path / "cases.json"
    p.write_text("[{")
    cli("kb", "import", p, "--kb", kb_root, says=("not valid JSON",))


def test_import_json_bad_item(cli, kb_root, tmp_path):
    p = tmp_path / "cases.json"
    p.write_text(
        json.dumps([json.loads(case_to_json(make_case("ok"))), _case_dict(**{"verification.effect.diff": "NaN"})])
    )
    cli("kb", "import", p, "--kb", kb_root, says=("item 2", "verification.effect.diff"))


def test_import_parquet_wrong_column_type(cli, kb_root, tmp_path):
    p = tmp_path / "cases.parquet"
    pq.write_table(pa.table({"case_json": pa.array([1, 2], type=pa.int64())}), p)
    cli("kb", "import", p, "--kb", kb_root, says=("column 'case_json' has type int64",))


def test_import_parquet_without_case_json(cli, kb_root, tmp_path):
    p = tmp_path / "cases.parquet"
    pq.write_table(pa.table({"summary": ["x"]}), p)
    cli("kb", "import", p, "--kb", kb_root, says=("no 'case_json' column", "columns: summary"))


def test_import_parquet_that_is_not_parquet(cli, kb_root, tmp_path):
    p = tmp_path / "cases.parquet"
    p.write_bytes(b"PK\x03\x04 definitely not parquet" * 10)
    cli("kb", "import", p, "--kb", kb_root, says=("not a Remedy Parquet file",))


def test_import_parquet_bad_row(cli, kb_root, tmp_path):
    p = tmp_path / "cases.parquet"
    bad = json.dumps(_case_dict(**{"verification.seeds": -1}))
    pq.write_table(pa.table({"case_json": [case_to_json(make_case("ok")), bad]}), p)
    cli("kb", "import", p, "--kb", kb_root, says=("row 2", "verification.seeds"))


# -- foreign files given as the KB: refused, left byte-for-byte unchanged -------------------------


@pytest.fixture
def foreign(tmp_path) -> Callable[[str], Path]:
    def make(kind: str) -> Path:
        root = tmp_path / f"foreign-{kind}"
        root.mkdir()
        db = root / "remedy.duckdb"
        if kind == "sqlite":
            con = sqlite3.connect(db)
            con.execute("CREATE TABLE orders (id INTEGER, total REAL)")
            con.execute("INSERT INTO orders VALUES (1, 9.5)")
            con.commit()
            con.close()
        elif kind == "duckdb":
            con = duckdb.connect(str(db))
            con.execute("CREATE TABLE sales (region VARCHAR, amount DOUBLE)")
            con.execute("INSERT INTO sales VALUES ('north', 3.0)")
            con.close()
        elif kind == "duckdb-meta":
            con = duckdb.connect(str(db))
            con.execute("CREATE TABLE meta (k INTEGER, v INTEGER)")
            con.close()
        else:
            db.write_text("just some notes\n")
        return root

    return make


FOREIGN = [
    ("sqlite", "is an SQLite database"),
    ("duckdb", "made by another program (tables sales)"),
    ("duckdb-meta", "made by another program (tables meta)"),
    ("text", "is not a DuckDB file"),
]


@pytest.mark.parametrize(("kind", "says"), FOREIGN, ids=[k for k, _ in FOREIGN])
@pytest.mark.parametrize("command", [["kb", "stats"], ["kb", "import", "{file}"], ["query", "lander"]])
def test_foreign_file_as_kb_is_refused_unchanged(cli, foreign, kind, says, command, tmp_path):
    root = foreign(kind)
    before = _snapshot(root)
    args = [str(_jsonl(tmp_path, json.loads(case_to_json(make_case("x"))))) if a == "{file}" else a for a in command]
    cli(*args, "--kb", root, says=(says, "left unchanged"))
    assert _snapshot(root) == before


def test_kb_path_is_a_file(cli, tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("hello")
    cli("kb", "stats", "--kb", f, says=("is a file, not a directory",))
    assert f.read_text() == "hello"


def test_kb_missing_for_a_read(cli, tmp_path):
    cli("case", "show", "c-1", "--kb", tmp_path / "none", says=("no KB at",))
    assert not (tmp_path / "none").exists()


# -- the Python API --------------------------------------------------------------------------------


@pytest.fixture
def api_kb(kb_root, embedder):
    before = _snapshot(kb_root)
    with KnowledgeBase.open(kb_root, embedder=embedder) as kb:
        yield kb
    assert _snapshot(kb_root) == before, "the KB changed"


@pytest.mark.parametrize(
    ("call", "error", "says"),
    [
        (lambda kb: kb.similar("", k=3), ValidationError, "query is empty"),
        (lambda kb: kb.similar("lander", k=0), ValidationError, "k must be at least 1"),
        (lambda kb: kb.similar("lander", mode="psychic"), ValidationError, "unknown search mode 'psychic'"),
        (lambda kb: kb.similar("lander", action_space="both"), ValidationError, "unknown action space 'both'"),
        (lambda kb: kb.similar("lander", min_effect=float("inf")), ValidationError, "finite"),
        (lambda kb: kb.get("c-nope"), CaseNotFoundError, "no case 'c-nope'"),
        (lambda kb: kb.import_file("x.txt"), ValidationError, "unknown file type '.txt'"),
        (
            lambda kb: kb.import_file("x.jsonl", limits=ImportLimits(max_cases=0)),
            ValidationError,
            "max_cases must be a positive",
        ),
    ],
    ids=["empty", "k0", "mode", "space", "inf-effect", "missing-id", "ext", "limit"],
)
def test_api_errors(api_kb, call, error, says):
    with pytest.raises(error, match=None) as info:
        call(api_kb)
    assert says in str(info.value) and isinstance(info.value, RemedyError)


def test_api_open_refuses_sqlite(foreign):
    root = foreign("sqlite")
    before = _snapshot(root)
    with pytest.raises(KBPathError, match="SQLite database"):
        KnowledgeBase.open(root)
    assert _snapshot(root) == before


# -- a damaged index: rebuilt from the store (the store is the truth) --------------------------------


def test_damaged_index_is_rebuilt_from_the_store(tmp_path, embedder):
    root = tmp_path / "kb"
    with KnowledgeBase.open(root, embedder=embedder) as kb:
        kb.add_many(corpus_cases())
    store_before = _snapshot(root / "remedy.duckdb")
    for f in (root / "index").rglob("data/*.lance"):
        f.write_bytes(b"\0garbage" * 8)
    with KnowledgeBase.open(root, embedder=embedder, reconcile=False) as kb:
        report = kb.reconcile()
        assert report.rebuilt and report.added == 5
        assert kb.index.ids() == kb.store.ids()
        assert kb.similar("lander hovers", k=2)
    assert _snapshot(root / "remedy.duckdb") == store_before


def test_damaged_index_on_search_says_reindex(tmp_path, embedder):
    root = tmp_path / "kb"
    with KnowledgeBase.open(root, embedder=embedder) as kb:
        kb.add_many(corpus_cases())
        for f in (root / "index").rglob("data/*.lance"):
            f.write_bytes(b"\0garbage" * 8)
        with pytest.raises(RemedyError, match="index at .* is damaged .*remedy kb reindex"):
            kb.similar("lander hovers", k=2)


def test_mark_imported_files_measured_cases_as_imported(tmp_path, embedder):
    from remedy.cases.io import write_cases

    path = tmp_path / "theirs.jsonl"
    write_cases(path, corpus_cases())
    with KnowledgeBase.open(tmp_path / "kb", embedder=embedder) as kb:
        kb.import_file(path, mark_imported=True)
        sources = {c.case_id: c.source.value for c in kb.cases()}
    expected = {
        c.case_id: ("imported" if c.source.value in ("verified", "bench") else c.source.value) for c in corpus_cases()
    }
    assert sources == expected and "imported" in sources.values()
