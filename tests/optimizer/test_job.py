"""The periodic job, program versions, the CLI, and `remedy diagnose` using the active version.

A small KB of fix-loop cases (real DuckDB, LanceDB and embedder) stands in for a bench KB.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from filelock import FileLock
from typer.testing import CliRunner

from remedy.cases.errors import OptimizeError
from remedy.cases.model import Source
from remedy.kb.cli import app
from remedy.kb.diagnose import KBRetriever, diagnose_signature
from remedy.kb.facade import KnowledgeBase
from remedy.kb.fixloop import stored_case
from remedy.optimizer.job import LOCK_FILE, OptimizeOptions, new_verified_cases, run_optimize
from remedy.optimizer.versions import ProgramStore, promotion_decision
from remedy.retrieval import default_embedder
from remedy.retrieval.offline import OfflineDiagnoser, OfflineSettings

from .conftest import fix_loop, make_case

runner = CliRunner()
SYMPTOMS = [
    "the pole falls within twenty steps",
    "the cart drifts off the track edge",
    "episodes run out the clock without reaching the goal",
    "returns oscillate between training updates",
    "the policy always pushes left",
    "rewards are noisy and the agent never improves",
    "the agent stops learning early with low entropy",
    "the swing never gets high enough to reach the top",
]


def corpus(n: int = 8) -> list:
    """``n`` scenarios' fix loops: every third confirmed fixed by a time limit, the rest not fixed."""
    return [
        case
        for i in range(n)
        for case in fix_loop(
            f"sc{i}",
            fixed="time_limit" if i % 3 == 0 else None,
            failed=("hyperparameters", "training_budget"),
            summary=f"CartPole PPO: {SYMPTOMS[i % len(SYMPTOMS)]} (variant {i})",
            causes=("undertraining", "time_limit_misconfiguration") if i % 3 == 0 else ("unstable_optimization",),
        )
    ]


@pytest.fixture(scope="session")
def embedder():
    return default_embedder()


@pytest.fixture
def kb(tmp_path: Path, embedder):
    with KnowledgeBase.open(tmp_path / "kb", embedder=embedder) as kb:
        kb.add_many(corpus())
        yield kb


def _opts(tmp_path: Path, **kw) -> OptimizeOptions:
    return OptimizeOptions(**{"trials": 8, "reports": tmp_path / "reports", **kw})


def test_a_run_stores_a_version_and_writes_the_report(kb, tmp_path) -> None:
    result = run_optimize(kb.store, KBRetriever(kb), _opts(tmp_path))
    assert result.status == "done" and result.version is not None
    assert result.train_size + result.val_size == 8 and result.val_size >= 1
    assert result.new_cases == new_verified_cases(kb.store, None) == len(corpus())
    promote, _ = promotion_decision(result.active_val, result.new_val or 0.0, 0.02)
    assert result.promoted == (promote and result.train_score_after > result.train_score_before)
    assert [v.id for v in ProgramStore(kb.store).list()] == [result.version.id]
    text = result.report.read_text()
    assert result.version.id in text and "validation score" in text
    assert ("**Promoted**" in text) == result.promoted and result.version.reason in text


def test_min_new_counts_verified_cases_since_the_last_run(kb, tmp_path) -> None:
    idle = run_optimize(kb.store, None, _opts(tmp_path, min_new=len(corpus()) + 1))
    assert idle.status == "nothing_to_do" and idle.version is None
    assert (
        idle.message == f"nothing to do: {len(corpus())} new verified cases since the start, need {len(corpus()) + 1}"
    )
    assert ProgramStore(kb.store).list() == []
    first = run_optimize(kb.store, None, _opts(tmp_path))
    now = datetime.now(UTC)
    kb.add_many(
        [
            make_case("late-1", scenario="sc9", summary="late arrival", at=now),
            make_case("late-2", scenario="sc9", summary="late arrival", at=now, parent="late-1"),
            make_case("late-lit", scenario=None, source="example", at=now),  # literature: not evidence
        ]
    )
    idle = run_optimize(kb.store, None, _opts(tmp_path, min_new=3))
    when = first.version.created_at.strftime("%Y-%m-%d %H:%M UTC")
    assert idle.message == f"nothing to do: 2 new verified cases since {when}, need 3"
    assert run_optimize(kb.store, None, _opts(tmp_path, min_new=2)).status == "done"


def test_a_second_run_while_the_lock_is_held_exits_at_once(kb, tmp_path) -> None:
    lock = FileLock(str(kb.root / LOCK_FILE), timeout=0)
    with lock, pytest.raises(OptimizeError, match="another `remedy optimize` is running"):
        run_optimize(kb.store, None, _opts(tmp_path))
    assert ProgramStore(kb.store).list() == []
    assert run_optimize(kb.store, None, _opts(tmp_path)).status == "done"  # released: runs


def test_too_few_examples_is_an_error_and_stores_nothing(tmp_path, embedder) -> None:
    with KnowledgeBase.open(tmp_path / "small", embedder=embedder) as small:
        small.add_many(corpus(2))
        with pytest.raises(OptimizeError, match="too few examples to optimize: 2 .* need at least 6 from 3"):
            run_optimize(small.store, None, _opts(tmp_path))
        assert ProgramStore(small.store).list() == []


def test_versions_activate_and_rollback(kb) -> None:
    programs = ProgramStore(kb.store)
    a = programs.add(backend="offline", optimizer="t", train_size=5, val_size=2, active_val=None, new_val=0.5,
                     promote=True, reason="r", parameters=OfflineSettings(k=3).model_dump())  # fmt: skip
    b = programs.add(backend="offline", optimizer="t", train_size=5, val_size=2, active_val=0.5, new_val=0.51,
                     promote=False, reason="r", parameters=OfflineSettings(k=4).model_dump())  # fmt: skip
    assert b.parent == a.id and programs.active().id == a.id
    assert programs.activate(b.id.split("-")[0]).active  # the pN prefix is enough
    assert programs.rollback().id == a.id
    assert programs.rollback() is None  # the built-in defaults
    with pytest.raises(OptimizeError, match="nothing to roll back"):
        programs.rollback()
    with pytest.raises(OptimizeError, match=f"known: {b.id}, {a.id}"):
        programs.get("p99")
    assert programs.get(a.id).offline_settings().k == 3


def test_diagnose_uses_the_active_version_and_the_fix_loop_records_it(kb) -> None:
    case = kb.get("sc1-hyperparameters")
    cold = diagnose_signature(kb, case.subject, case.signature)
    assert cold.diagnosis.program_version.startswith("offline-1:")
    v = ProgramStore(kb.store).add(backend="offline", optimizer="t", train_size=5, val_size=2, active_val=None,
                                   new_val=0.5, promote=True, reason="r",
                                   parameters=OfflineSettings(w_prior=0.0, k=2).model_dump())  # fmt: skip
    report = diagnose_signature(kb, case.subject, case.signature)
    assert report.diagnosis.program_version == v.id
    assert report.diagnosis.causes != cold.diagnosis.causes  # the version's settings are what voted
    stored = stored_case(case, report, source=Source.verified, parent_id=None, scenario=None)
    assert stored.diagnosis.program_version == stored.provenance.program_version == v.id
    explicit = diagnose_signature(kb, case.subject, case.signature, diagnoser=OfflineDiagnoser(sim_floor=0.5))
    assert explicit.diagnosis.program_version.startswith("offline-1:")  # chosen knobs win over the version
    ProgramStore(kb.store).rollback()
    assert diagnose_signature(kb, case.subject, case.signature).diagnosis == cold.diagnosis


def _cli(*args) -> object:
    return runner.invoke(app, [str(a) for a in args])


def test_cli_optimize_and_programs(kb, tmp_path) -> None:
    root = kb.root
    kb.close()
    res = _cli("optimize", "--kb", root, "--trials", 5, "--margin", 0, "--reports", tmp_path / "r", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    vid = out["version"]["id"]
    assert out["status"] == "done" and Path(out["report"]).exists() and out["train_size"] + out["val_size"] == 8
    listed = json.loads(_cli("programs", "list", "--kb", root, "--json").stdout)
    assert [v["id"] for v in listed] == [vid]
    assert json.loads(_cli("programs", "show", vid, "--kb", root).stdout)["parameters"]["k"] >= 1
    assert "active offline program: " + vid in _cli("programs", "activate", vid, "--kb", root).stdout
    back = _cli("programs", "rollback", "--kb", root)
    assert back.exit_code == 0 and "active offline program:" in back.stdout
    idle = _cli("optimize", "--kb", root, "--min-new", 5, "--reports", tmp_path / "r")
    assert idle.exit_code == 0 and "nothing to do: 0 new verified cases since" in idle.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--optimizer", "gepa"], "--optimizer applies to --backend llm only"),
        (["--backend", "llm"], "--backend llm needs --optimizer gepa|mipro|bootstrap"),
        (["--backend", "sideways"], "unknown --backend"),
        (["--trials", "0"], "--trials must be at least 1"),
        (["--val-fraction", "1.5"], "--val-fraction must be between 0 and 1"),
    ],
)
def test_cli_refuses_bad_options(kb, tmp_path, args, message) -> None:
    res = _cli("optimize", "--kb", kb.root, "--reports", tmp_path / "r", *args)
    assert isinstance(res.exception, OptimizeError) and message in str(res.exception)
    assert ProgramStore(kb.store).list() == []
