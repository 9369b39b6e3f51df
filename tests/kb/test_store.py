"""The DuckDB case store and the JSONL/Parquet case files (no embedder needed)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remedy.cases import store as store_mod
from remedy.cases.errors import (
    CaseNotFoundError,
    ImportFileError,
    KBError,
    KBLockedError,
    KBVersionError,
    ValidationError,
)
from remedy.cases.io import case_to_json, read_cases, write_cases
from remedy.cases.model import Case, Cause, Diagnosis, EnvTraits, Signature, Subject
from remedy.cases.patches import Patch
from remedy.cases.store import STORE_SCHEMA_VERSION, CaseStore


@pytest.fixture
def store(tmp_path: Path) -> CaseStore:
    return CaseStore(tmp_path / "remedy.duckdb")


def _set_meta(db: Path, version: int) -> None:
    con = duckdb.connect(str(db))
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(version)])
    con.close()


def _hold_lock(db: Path) -> subprocess.Popen:
    """A second process that holds the DuckDB file read-write until killed."""
    code = "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('ready', flush=True); time.sleep(120)"
    proc = subprocess.Popen([sys.executable, "-c", code, str(db)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


# -- store ------------------------------------------------------------------------------


def test_add_get_and_upsert_semantics(store, corpus):
    assert store.add_many(corpus) == (5, 0)
    assert store.add_many(corpus) == (0, 5)  # identical re-add changes nothing
    assert store.get("c-lander-hover") == corpus[0]
    changed = corpus[0].model_copy(update={"tags": ["edited"]})
    assert store.add(changed) is True
    assert store.get("c-lander-hover").tags == ["edited"]
    assert store.count() == 5
    assert store.ids() == {c.case_id for c in corpus}


def test_get_many_iter_delete(store, corpus):
    store.add_many(corpus)
    got = store.get_many(["c-walker-scale", "nope", "c-lander-hover"])
    assert [c.case_id for c in got] == ["c-walker-scale", "c-lander-hover"]
    assert sorted(c.case_id for c in store.iter_cases(batch=2)) == sorted(c.case_id for c in corpus)
    assert store.delete(["c-walker-scale", "nope"]) == 1
    assert store.count() == 4


def test_stats_counts(store, corpus):
    store.add_many(corpus)
    s = store.stats()
    assert s.total == 5
    assert s.by_status == {"improved": 2, "literature": 1, "no_effect": 1, "worse": 1}
    assert s.by_source == {"bench": 4, "example": 1}
    assert s.by_env["Pendulum-v1"] == 1
    assert s.by_root_cause["action_jitter"] == 1


def test_not_found_suggests_prefix_matches(store, corpus):
    store.add_many(corpus)
    with pytest.raises(CaseNotFoundError, match="did you mean 'c-pendulum-jitter'"):
        store.get("c-pendulum")
    with pytest.raises(CaseNotFoundError, match="c-lander-hover"):
        store.get("c-lander-hovr")


def test_nan_features_survive(store, case_factory):
    case = case_factory(case_id="c-nan")
    sig = case.signature.model_copy(update={"features": {"entropy_final": math.nan, "x": math.inf}})
    store.add(case.model_copy(update={"signature": sig}))
    got = store.get("c-nan").signature.features
    assert math.isnan(got["entropy_final"]) and got["x"] == math.inf


def test_older_schema_is_upgraded(tmp_path):
    db = tmp_path / "remedy.duckdb"
    duckdb.connect(str(db)).close()  # schema 0: an empty DuckDB file
    s = CaseStore(db)
    assert s.schema_version() == STORE_SCHEMA_VERSION
    assert s.count() == 0


def test_failed_migration_leaves_file_untouched(tmp_path, monkeypatch, case_factory):
    db = tmp_path / "remedy.duckdb"
    CaseStore(db).add(case_factory())

    def broken(con):
        con.execute("CREATE TABLE half_done (x INT)")
        raise RuntimeError("migration bug")

    monkeypatch.setattr(store_mod, "MIGRATIONS", [*store_mod.MIGRATIONS, broken])
    monkeypatch.setattr(store_mod, "STORE_SCHEMA_VERSION", len(store_mod.MIGRATIONS))
    with pytest.raises(RuntimeError, match="migration bug"):
        CaseStore(db)
    monkeypatch.undo()
    s = CaseStore(db)
    assert s.schema_version() == STORE_SCHEMA_VERSION and s.count() == 1
    con = duckdb.connect(str(db))
    assert con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name='half_done'").fetchone()[0] == 0
    con.close()


def test_newer_schema_is_refused(tmp_path, case_factory):
    db = tmp_path / "remedy.duckdb"
    CaseStore(db).add(case_factory())
    _set_meta(db, STORE_SCHEMA_VERSION + 5)
    with pytest.raises(
        KBVersionError,
        match=rf"schema {STORE_SCHEMA_VERSION + 5}, this one knows {STORE_SCHEMA_VERSION}\); upgrade remedy",
    ):
        CaseStore(db)


def test_locked_file_names_the_holder(tmp_path, case_factory):
    db = tmp_path / "remedy.duckdb"
    CaseStore(db).add(case_factory())
    proc = _hold_lock(db)
    try:
        with pytest.raises(KBLockedError, match=rf"locked by PID {proc.pid}; stop that process") as info:
            CaseStore(db, lock_timeout=0.3)
        assert info.value.pid == proc.pid
    finally:
        proc.kill()
        proc.wait()
    assert CaseStore(db).count() == 1  # intact afterwards


def test_not_a_duckdb_file(tmp_path):
    db = tmp_path / "remedy.duckdb"
    db.write_text("hello, not a database")
    with pytest.raises(KBError, match="not a DuckDB file.*left unchanged.*--kb"):
        CaseStore(db)
    assert db.read_text() == "hello, not a database"


# -- property: case -> store -> case ----------------------------------------------------------

_word = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=20)
_cases = st.builds(
    Case,
    case_id=_word.filter(lambda w: w.strip(".")),  # an id of dots only is refused
    source=st.sampled_from(["example", "verified", "bench", "imported"]),
    subject=st.builds(
        Subject,
        env_id=_word,
        algo=st.sampled_from(["PPO", "SAC", "DQN", "A2C"]),
        hyperparams=st.dictionaries(
            _word, st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text()), max_size=3
        ),
        traits=st.builds(
            EnvTraits,
            action_space=st.sampled_from(["discrete", "continuous"]),
            obs_dim=st.integers(0, 500),
            action_dim=st.integers(0, 20),
        ),
    ),
    signature=st.builds(
        Signature,
        features=st.dictionaries(_word, st.floats(allow_nan=True, allow_infinity=True), max_size=5),
        symptoms=st.lists(_word, max_size=4),
        summary=st.text(max_size=200),
    ),
    diagnosis=st.none()
    | st.builds(
        Diagnosis,
        causes=st.lists(
            st.builds(
                Cause,
                cause=st.sampled_from(["sparse_reward", "action_jitter", "unknown"]),
                confidence=st.floats(0, 1),
                rationale=st.text(max_size=50),
            ),
            max_size=3,
        ),
    ),
    patch=st.sampled_from(
        [
            Patch.from_data({"kind": "action_smoothness", "coef": 0.2}),
            Patch.from_data(
                {
                    "parts": [
                        {"kind": "training_budget", "extra_steps": 10},
                        {"kind": "time_limit", "max_episode_steps": 500},
                    ]
                }
            ),
        ]
    ),
    scenario=st.none() | _word,
    tags=st.lists(st.text(max_size=10), max_size=3),
)


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory) -> CaseStore:
    return CaseStore(tmp_path_factory.mktemp("prop") / "remedy.duckdb")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_cases)
def test_roundtrip_property(shared_store, case):
    shared_store.add(case)
    got = shared_store.get(case.case_id)
    assert case_to_json(got) == case_to_json(case)
    if not any(math.isnan(v) for v in case.signature.features.values()):
        assert got == case
    assert shared_store.add(case) is False  # unchanged on re-add


# -- files --------------------------------------------------------------------------------


@pytest.mark.parametrize("ext", [".jsonl", ".json", ".parquet"])
def test_files_roundtrip(tmp_path, corpus, ext):
    path = tmp_path / f"cases{ext}"
    assert write_cases(path, corpus) == 5
    cases, problems = read_cases(path)
    assert cases == corpus and problems == []


def test_malformed_jsonl_names_each_bad_line(tmp_path, corpus):
    good = [case_to_json(c) for c in corpus[:2]]
    bad_label = json.loads(case_to_json(corpus[2]))
    bad_label["diagnosis"]["causes"][0]["cause"] = "cosmic_rays"
    lines = [good[0], "{not json", "", json.dumps(bad_label), "[1, 2]", good[1], good[0]]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ImportFileError) as info:
        read_cases(path)
    assert [n for n, _ in info.value.problems] == [2, 4, 5, 7]
    msgs = dict(info.value.problems)
    assert "not valid JSON" in msgs[2]
    assert "diagnosis.causes.0.cause" in msgs[4] and "cosmic_rays" in msgs[4]
    assert "expected a JSON object" in msgs[5]
    assert "duplicate case_id 'c-lander-hover' (first on line 1)" in msgs[7]
    assert "\n" not in str(info.value) and "line 4" in str(info.value) and "--skip-invalid" in str(info.value)
    cases, problems = read_cases(path, skip_invalid=True)
    assert [c.case_id for c in cases] == ["c-lander-hover", "c-pendulum-jitter"] and len(problems) == 4


def test_malformed_parquet(tmp_path, corpus):
    rows = [case_to_json(corpus[0]), '{"case_id": "x"}', None]
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"case_json": rows}), path)
    with pytest.raises(ImportFileError) as info:
        read_cases(path)
    assert [n for n, _ in info.value.problems] == [2, 3]
    assert "row 2" in str(info.value)
    garbage = tmp_path / "garbage.parquet"
    garbage.write_text("not parquet at all")
    with pytest.raises(ImportFileError, match="not a (Remedy )?Parquet file"):
        read_cases(garbage)
    nocol = tmp_path / "nocol.parquet"
    pq.write_table(pa.table({"x": [1]}), nocol)
    with pytest.raises(ImportFileError, match="case_json"):
        read_cases(nocol)


def test_unknown_extension_and_missing_file(tmp_path, corpus):
    with pytest.raises(ValidationError, match=r"unknown file type '.csv'; use one of .jsonl, .json, .parquet"):
        write_cases(tmp_path / "x.csv", corpus)
    with pytest.raises(ValidationError, match="unknown file type"):
        read_cases(tmp_path / "x.txt")
    with pytest.raises(ImportFileError, match="no such file"):
        read_cases(tmp_path / "missing.jsonl")


def test_single_part_patch_shorthand(tmp_path, corpus):
    data = json.loads(case_to_json(corpus[1]))
    data["patch"] = {"kind": "action_smoothness", "coef": 0.1}
    path = tmp_path / "short.jsonl"
    path.write_text(json.dumps(data) + "\n")
    (case,), _ = read_cases(path)
    assert case.patch.kinds == ["action_smoothness"]
