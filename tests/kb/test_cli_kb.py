"""`remedy kb ...`, `remedy query`, `remedy case show`: in-process (CliRunner) and, for the
error paths that go through ``main()``, as the real console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from remedy.cases.errors import ImportFileError, KBNotFoundError, KBVersionError
from remedy.cases.io import case_to_json
from remedy.kb.cli import app
from remedy.kb.facade import example_files

REMEDY = Path(sys.executable).parent / "remedy"
runner = CliRunner()


def _ok(*args: str):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def _script(*args: str) -> subprocess.CompletedProcess:
    """Run the installed console script (errors are mapped by ``main()``)."""
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([str(REMEDY), *map(str, args)], capture_output=True, text=True, env=env, timeout=120)


def _assert_one_error_line(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 1, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    """Tables wider than the runner's 80 columns, so cell text is not folded across lines."""
    from remedy.kb.cli.common import console

    monkeypatch.setattr(console, "width", 200)


def _make_kb(kb: Path, corpus_file: Path) -> Path:
    _ok("kb", "init", "--kb", kb, "--no-examples")
    assert "5 added, 0 unchanged" in _ok("kb", "import", corpus_file, "--kb", kb).output
    return kb


@pytest.fixture(scope="module")
def cli_kb(tmp_path_factory, corpus_file) -> Path:
    """A KB created through the CLI with the five corpus cases imported (read-only tests)."""
    return _make_kb(tmp_path_factory.mktemp("cli") / "kb", corpus_file)


@pytest.fixture
def fresh_kb(tmp_path, corpus_file) -> Path:
    """Like ``cli_kb`` but private to one test, which may change it."""
    return _make_kb(tmp_path / "kb", corpus_file)


def test_import_is_idempotent_and_export(cli_kb, corpus_file, tmp_path):
    assert "0 added, 5 unchanged" in _ok("kb", "import", corpus_file, "--kb", cli_kb).output
    _ok("kb", "export", tmp_path / "out.parquet", "--kb", cli_kb)
    assert pq.read_table(tmp_path / "out.parquet").num_rows == 5
    stats = json.loads(_ok("kb", "stats", "--kb", cli_kb, "--json", "--index").output)
    assert stats["store"]["total"] == 5 and stats["index_rows"] == 5
    assert "LunarLander-v3" in _ok("kb", "stats", "--kb", cli_kb).output


def test_query_json_and_table(cli_kb):
    out = _ok("query", "lander hovers above the pad", "--kb", cli_kb, "--k", "3", "--json").output
    rows = json.loads(out)
    assert len(rows) == 3 and rows[0]["case_id"] == "c-lander-hover"
    for key in ("case_id", "similarity", "env_id", "root_causes", "patch", "effect", "status", "symptoms", "source"):
        assert key in rows[0]
    assert rows[0]["effect"] == {"diff": 180.0, "ci_low": 175.0, "ci_high": 185.0, "metric": "return_iqm"}
    assert rows[0]["patch"]["summary"] == "+50,000 training steps"
    filtered = json.loads(
        _ok("query", "it fails", "--kb", cli_kb, "--action-space", "continuous", "--only-improved", "--json").output
    )
    assert [r["case_id"] for r in filtered] == ["c-pendulum-jitter"]
    assert json.loads(_ok("query", "x", "--kb", cli_kb, "--min-effect", "1000", "--json").output) == []
    table = _ok("query", "torque chatters", "--kb", cli_kb, "--algo", "sac").output
    assert "Pendulum-v1" in table and "action_jitter" in table
    bad = runner.invoke(app, ["query", "x", "--kb", str(cli_kb), "--action-space", "sideways"])
    assert bad.exit_code == 2


def test_case_show(cli_kb):
    data = json.loads(_ok("case", "show", "c-pendulum-jitter", "--kb", cli_kb, "--json").output)
    assert data["case_id"] == "c-pendulum-jitter" and data["patch"]["parts"][0]["kind"] == "action_smoothness"
    text = _ok("case", "show", "c-pendulum-jitter", "--kb", cli_kb).output
    assert "Torque chatters" in text and "action smoothness penalty 0.1" in text
    missing = runner.invoke(app, ["case", "show", "c-pendulum", "--kb", str(cli_kb)])
    assert missing.exit_code == 1 and "did you mean 'c-pendulum-jitter'" in str(missing.exception)


def test_schema():
    schema = json.loads(_ok("kb", "schema").output)
    assert schema["title"] == "Case" and "signature" in schema["properties"]


def test_reindex(cli_kb):
    assert "Reindexed 5 cases" in _ok("kb", "reindex", "--kb", cli_kb).output


def test_malformed_import_imports_nothing(fresh_kb, tmp_path, corpus):
    cli_kb = fresh_kb
    bad = json.loads(case_to_json(corpus[0]))
    bad["case_id"] = "c-new"
    bad["diagnosis"]["causes"][0]["cause"] = "gremlins"
    path = tmp_path / "bad.jsonl"
    path.write_text(
        json.dumps({**bad, "case_id": "c-good"}).replace("gremlins", "sparse_reward")
        + "\n"
        + json.dumps(bad)
        + "\n{truncated\n"
    )
    result = runner.invoke(app, ["kb", "import", str(path), "--kb", str(cli_kb)])
    assert result.exit_code == 1 and isinstance(result.exception, ImportFileError)
    assert [n for n, _ in result.exception.problems] == [2, 3] and "gremlins" in str(result.exception)
    assert json.loads(_ok("kb", "stats", "--kb", cli_kb, "--json").output)["store"]["total"] == 5
    result = _ok("kb", "import", str(path), "--kb", cli_kb, "--skip-invalid")
    assert "1 added, 0 unchanged, 2 skipped" in result.output and "skipped line 2" in result.stderr


def test_missing_kb(tmp_path):
    result = runner.invoke(app, ["query", "x", "--kb", str(tmp_path / "none")])
    assert isinstance(result.exception, KBNotFoundError) and "remedy kb init" in str(result.exception)


def test_init_loads_bundled_examples(tmp_path):
    expected = sum(1 for f in example_files() for line in f.read_text().splitlines() if line.strip())
    out = _ok("kb", "init", "--kb", tmp_path / "kb").output
    assert f"{expected} cases" in out
    if expected:
        rows = json.loads(
            _ok("query", "pendulum torque chatters", "--kb", tmp_path / "kb", "--k", "3", "--json").output
        )
        assert len(rows) == 3 and all(r["source"] == "example" for r in rows)


def test_similar_run_dir(cli_kb):
    run_dir = Path(str(resources.files("remedy.cases") / "scenarios" / "checkpoints" / "cartpole_undertrained"))
    if not (run_dir / "run.yaml").is_file():
        pytest.skip("bundled CartPole checkpoint not present")
    out = _ok("similar", run_dir, "--kb", cli_kb, "--episodes", "2", "--k", "2", "--json").output
    data = json.loads(out)
    assert "CartPole-v1" in data["signature"]["summary"]
    assert len(data["similar"]) == 2 and {r["action_space"] for r in data["similar"]} == {"discrete"}


# -- errors through main(): exit 1, one red line on stderr, no traceback ----------------------


def test_script_kb_path_is_a_file(tmp_path):
    f = tmp_path / "afile"
    f.write_text("keep me")
    _assert_one_error_line(_script("kb", "stats", "--kb", f), "is a file")
    assert f.read_text() == "keep me"


def test_newer_kb(fresh_kb):
    con = duckdb.connect(str(fresh_kb / "remedy.duckdb"))
    con.execute("UPDATE meta SET value = '42' WHERE key = 'schema_version'")
    con.close()
    result = runner.invoke(app, ["case", "show", "c-lander-hover", "--kb", str(fresh_kb)])
    assert result.exit_code == 1 and isinstance(result.exception, KBVersionError)
    assert "schema 42, this one knows" in str(result.exception) and "upgrade remedy" in str(result.exception)


def test_script_locked_kb(cli_kb):
    code = "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('ready', flush=True); time.sleep(120)"
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(cli_kb / "remedy.duckdb")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        _assert_one_error_line(_script("kb", "stats", "--kb", cli_kb), f"locked by PID {holder.pid}", "remedy serve")
    finally:
        holder.kill()
        holder.wait()
    assert json.loads(_ok("kb", "stats", "--kb", cli_kb, "--json").output)["store"]["total"] == 5


def test_kb_init_imports_a_factorys_experience(tmp_path, monkeypatch, capsys, kb, corpus):
    from .conftest import invoke

    kb.add_many(corpus)
    experience = tmp_path / "factory"
    experience.mkdir()
    kb.export(experience / "chunk-all-0001.parquet")
    code, out, err = invoke(
        monkeypatch, capsys, "kb", "init", "--no-examples", "--kb", tmp_path / "new", "--experience", experience
    )
    assert code == 0, err
    assert f"{len(corpus)} from 1 experience chunk(s)" in out
    code, _, err = invoke(monkeypatch, capsys, "kb", "init", "--kb", tmp_path / "other", "--experience", tmp_path)
    assert code == 1 and "no chunk-*.parquet" in err
    assert not (tmp_path / "other").exists()  # refused before anything was created
