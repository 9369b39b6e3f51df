"""The llm backend of `remedy optimize`: DSPy's optimizers on DummyLM, and the CLI against a local fake OpenAI server.

DummyLM answers cycle through valid outputs of the diagnosis program (three different diagnoses)
and one malformed answer, so compiled and uncompiled programs score differently and the
malformed path is exercised. The end-to-end test reuses the recorded OpenAI-compatible server of
``tests/retrieval/test_llm.py``.
"""

from __future__ import annotations

import itertools
import json
import socket
from dataclasses import replace
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

import dspy
import pytest
from dspy.utils.dummies import DummyLM
from typer.testing import CliRunner

from remedy.cases.errors import OptimizeError
from remedy.cases.model import Signature, Source
from remedy.kb.cli import app
from remedy.kb.diagnose import diagnose_signature
from remedy.kb.facade import KnowledgeBase
from remedy.kb.fixloop import stored_case
from remedy.optimizer.dataset import build_examples
from remedy.optimizer.job import OptimizeOptions, run_optimize
from remedy.optimizer.llm import LLMCompiled, compile_llm, llm_metric, load_program, score_outputs, to_dspy_examples
from remedy.optimizer.versions import ProgramStore, ProgramVersion
from remedy.retrieval.llm import LLMDiagnoser, LLMDiagnoserProgram

from ..retrieval.test_llm import _FakeOpenAI
from .conftest import DEV_CASES, fix_loop

runner = CliRunner()
MALFORMED = {"reasoning": "r", "observations": "o", "candidate_causes": "c", "evidence": "e",
             "root_causes": "the time limit, probably", "patches": "[]"}  # fmt: skip
#: fields MIPROv2's proposer asks its prompt model for (one answer serves every signature: extra fields are ignored)
PROPOSER = {"program_description": "Diagnoses failing RL agents.", "module_description": "A chain of thought.",
            "proposed_instruction": "Diagnose the agent from the signature report; name the verified fix first.",
            "summary": "Failing CartPole agents."}  # fmt: skip


def _answer(cause: str, part: dict) -> dict:
    return {
        "reasoning": "r", "observations": "o", "candidate_causes": cause, "evidence": "e",
        "root_causes": json.dumps([{"cause": cause, "confidence": 0.8, "rationale": "from the signature"}]),
        "patches": json.dumps([{"patch": {"parts": [part]}, "compute_cost": "low"}]),
        **PROPOSER,
    }  # fmt: skip


ANSWERS = [
    _answer("time_limit_misconfiguration", {"kind": "time_limit", "max_episode_steps": 500}),
    _answer("unstable_optimization", {"kind": "hyperparameters", "changes": {"learning_rate": 1e-4}}),
    _answer("undertraining", {"kind": "training_budget", "extra_steps": 20000}),
    {**MALFORMED, **PROPOSER},
]


def task_lm() -> DummyLM:
    """A DummyLM whose answers cycle through :data:`ANSWERS` for as many calls as an optimizer makes."""
    return DummyLM(itertools.cycle(ANSWERS))


def reflection_lm() -> DummyLM:
    """GEPA's reflection LM: proposes one new instruction (its proposer reads JSON)."""
    new = {
        "new_instruction": "Diagnose the agent. When episodes end at the time limit, name time_limit_misconfiguration."
    }
    return DummyLM(itertools.cycle([new]), adapter=dspy.JSONAdapter())


@pytest.fixture(scope="module")
def split():
    """Eight fix-loop scenarios (every third fixed by a time limit): six train, two validation examples."""
    cases = [
        case
        for i in range(8)
        for case in fix_loop(
            f"sc{i}",
            fixed="time_limit" if i % 3 == 0 else None,
            summary=f"CartPole PPO fails (variant {i})",
            causes=("time_limit_misconfiguration",) if i % 3 == 0 else ("unstable_optimization",),
        )
    ]
    examples = build_examples(cases)
    return examples[:6], examples[6:]


def _check(result: LLMCompiled, optimizer: str) -> LLMDiagnoserProgram:
    assert result.optimizer == optimizer
    assert 0.0 <= result.active_val <= 1.0 and 0.0 <= result.new_val <= 1.0
    assert set(result.details["val_scores"]) == {"sc6-hyperparameters", "sc7-hyperparameters"}
    assert result.details["inner_train"] + result.details["inner_val"] == 6
    program = load_program(result.program)
    assert json.loads(result.program) == program.dump_state()  # what is stored is what loads back
    return program


def test_bootstrap_compiles_scores_and_saves(split) -> None:
    train, val = split
    result = compile_llm(train, val, optimizer="bootstrap", trials=2, lm=task_lm())
    program = _check(result, "bootstrap")
    assert len(program.diagnose.predict.demos) == result.details["demos"] <= 4  # bootstrapped demos only, at most 4


def test_mipro_compiles_scores_and_saves(split) -> None:
    train, val = split
    result = compile_llm(train, val, optimizer="mipro", trials=2, lm=task_lm(), seed=1)
    _check(result, "mipro")


def test_gepa_reflects_with_the_reflection_lm(split) -> None:
    train, val = split
    refl = reflection_lm()
    result = compile_llm(train, val, optimizer="gepa", trials=2, lm=task_lm(), reflection_lm=refl)
    _check(result, "gepa")
    assert refl.history and result.details["reflection_lm"] == "dummy"
    prompt = json.dumps(refl.history[0]["messages"])
    assert "Predicted causes" in prompt and "scenario:sc" in prompt  # the metric's feedback reached the reflection


def test_the_active_llm_version_is_the_baseline(split) -> None:
    train, val = split
    program = LLMDiagnoserProgram()
    program.diagnose.predict.signature = program.diagnose.predict.signature.with_instructions(
        "Always say undertraining."
    )
    stored = ProgramVersion(
        id="p1-abc", backend="llm", optimizer="bootstrap", parameters=None, program=json.dumps(program.dump_state()),
        train_size=6, val_size=2, active_val=None, new_val=0.5, promoted=True, reason="r", parent=None, seed=0,
        trials=1, created_at=datetime.now(UTC), active=True,
    )  # fmt: skip
    lm = task_lm()
    result = compile_llm(train, val, optimizer="bootstrap", trials=1, lm=lm, active=stored)
    assert result.details["start"] == "p1-abc"
    first_prompt = json.dumps(lm.history[0]["messages"])
    assert "Always say undertraining." in first_prompt  # the stored program answered the first validation call
    assert "Always say undertraining." in json.loads(result.program)["diagnose.predict"]["signature"]["instructions"]


def test_metric_scores_parsed_outputs_and_malformed_is_zero_with_feedback(split) -> None:
    train, _ = split
    solved = next(e for e in train if e.solved)  # sc0: fixed by a time limit
    good = dspy.Prediction(**_answer("time_limit_misconfiguration", {"kind": "time_limit", "max_episode_steps": 500}))
    assert score_outputs(solved, good).score == 1.0
    bad = score_outputs(solved, dspy.Prediction(**MALFORMED))
    assert bad.score == 0.0 and bad.feedback.startswith("malformed output: root_causes is not valid JSON")
    gold = to_dspy_examples([solved])[0]
    assert set(gold.inputs()) == set(LLMDiagnoserProgram.signature.input_fields)
    assert gold.verified_families == "time_limit"
    gepa = llm_metric([solved], feedback=True)(gold, good, None, "diagnose.predict", None)
    assert gepa.score == 1.0 and "time_limit" in gepa.feedback
    assert llm_metric([solved], feedback=False)(gold, dspy.Prediction(**MALFORMED)) == 0.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"optimizer": "gepa", "lm": "task"}, "--optimizer gepa needs a reflection LM: set REMEDY_REFLECTION_LM"),
        ({"optimizer": "simba", "lm": "task"}, "unknown llm optimizer 'simba'; choose gepa|mipro|bootstrap"),
        ({"optimizer": "bootstrap"}, "--backend llm needs an LM: set REMEDY_LM"),
        ({"optimizer": "gepa", "lm": "task", "reflection_lm": "refl", "train": 2},
         "too few examples for --optimizer gepa: it needs 3 examples"),
        ({"optimizer": "bootstrap", "lm": "task", "train": 1}, "too few examples for --optimizer bootstrap: the train split holds 1"),
    ],
)  # fmt: skip
def test_impossible_requests_fail_loudly_without_calling_the_lm(split, kwargs, message) -> None:
    train, val = split
    lm = task_lm()
    kw = dict(kwargs)
    train = train[: kw.pop("train", len(train))]
    kw["lm"] = lm if kw.get("lm") == "task" else None
    if kw.get("reflection_lm") == "refl":
        kw["reflection_lm"] = reflection_lm()
    with pytest.raises(OptimizeError, match=message):
        compile_llm(train, val, trials=1, environ={}, **kw)
    assert lm.history == []  # refused before any call: no other optimizer was tried instead


def test_reflection_lm_defaults_to_the_environment(split) -> None:
    from remedy.optimizer.llm import _reflection_lm

    env = {"REMEDY_LM": "openai/task", "REMEDY_LM_API_BASE": "http://127.0.0.1:9/v1",
           "REMEDY_REFLECTION_LM": "openai/strong", "REMEDY_REFLECTION_LM_API_BASE": "http://127.0.0.1:8/v1"}  # fmt: skip
    refl = _reflection_lm(None, env)
    assert refl.model == "openai/strong" and refl.kwargs["api_base"] == "http://127.0.0.1:8/v1"
    del env["REMEDY_REFLECTION_LM"]
    assert _reflection_lm(None, env).model == "openai/task"  # else the task LM as REMEDY_LM configures it


def test_an_unreachable_lm_is_one_error_naming_it(split) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}/v1"
    env = {"REMEDY_LM": "openai/recorded", "REMEDY_LM_API_BASE": base, "REMEDY_LM_NUM_RETRIES": "0"}
    with pytest.raises(OptimizeError, match=r"the LM openai/recorded at http://127\.0\.0\.1:\d+/v1 failed"):
        compile_llm(*split, optimizer="bootstrap", trials=1, environ=env)


# ---- end to end: the CLI against a local OpenAI-compatible server ------------------------------------


@pytest.fixture
def server():
    fake = _FakeOpenAI("valid.json")  # the same well-formed diagnosis for every request
    yield fake
    fake.close()


def _cli(*args) -> object:
    return runner.invoke(app, [str(a) for a in args])


@pytest.mark.slow  # embeds the KB slice and rolls out a CartPole agent: ~20 s alone, minutes on a loaded machine
def test_cli_optimize_llm_stores_a_version_that_diagnose_runs(tmp_path, server, monkeypatch) -> None:
    if not DEV_CASES.exists():
        pytest.skip(f"{DEV_CASES} not present")
    lines = DEV_CASES.read_text().splitlines()[:8]  # a slice: enough scenarios for the split, quick to embed
    (tmp_path / "slice.jsonl").write_text("\n".join(lines) + "\n")
    kb = tmp_path / "kb"
    assert _cli("kb", "import", tmp_path / "slice.jsonl", "--kb", kb).exit_code == 0
    for key, value in {"REMEDY_LM": "openai/recorded", "REMEDY_LM_API_BASE": server.api_base,
                       "REMEDY_LM_API_KEY": "test-key", "REMEDY_LM_NUM_RETRIES": "0"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    res = _cli("optimize", "--backend", "llm", "--optimizer", "bootstrap", "--trials", 1, "--margin", 0,
               "--kb", kb, "--reports", tmp_path / "r", "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)  # the optimizer's progress went to stderr: stdout is only the JSON
    version = out["version"]
    assert out["status"] == "done" and version["backend"] == "llm" and version["optimizer"] == "bootstrap"
    assert out["promoted"] and version["active"] and 0.0 <= out["new_val"] <= 1.0
    assert len(server.requests) >= out["val_size"] * 2  # the active and the compiled program both answered validation
    assert any("(similarity " in r["messages"][-1]["content"] for r in server.requests)  # retrieved KB cases shown
    listed = json.loads(_cli("programs", "list", "--kb", kb, "--backend", "llm", "--json").stdout)
    assert [v["id"] for v in listed] == [version["id"]] and listed[0]["active"]
    assert "p1-" in _cli("programs", "list", "--kb", kb).stdout
    assert isinstance(load_program(json.loads(_cli("programs", "show", version["id"], "--kb", kb).stdout)["program"]),
                      LLMDiagnoserProgram)  # fmt: skip

    run_dir = Path(str(resources.files("remedy.cases") / "scenarios" / "checkpoints" / "cartpole_undertrained"))
    diag = _cli("diagnose", run_dir, "--diagnoser", "llm", "--kb", kb, "--episodes", 2, "--k", 2, "--json")
    assert diag.exit_code == 0, diag.output
    report = json.loads(diag.stdout)
    assert report["diagnosis"]["backend"] == "llm" and report["diagnosis"]["program_version"] == version["id"]


def test_diagnose_runs_the_active_llm_version_and_cases_record_it(tmp_path) -> None:
    case = fix_loop("sc0", fixed="time_limit")[0]
    answer = _answer("time_limit_misconfiguration", {"kind": "time_limit", "max_episode_steps": 500})
    lm = DummyLM(itertools.cycle([answer]))
    with KnowledgeBase.open(tmp_path / "kb") as kb:

        def diagnose(diagnoser: LLMDiagnoser):
            return diagnose_signature(kb, case.subject, Signature(summary="s"), diagnoser=diagnoser, k=0)

        cold = diagnose(LLMDiagnoser(lm=lm)).diagnosis.program_version
        assert cold.startswith("dspy-diagnose-1:")
        program = LLMDiagnoserProgram()
        program.diagnose.predict.signature = program.diagnose.predict.signature.with_instructions("Stored version.")
        v = ProgramStore(kb.store).add(backend="llm", optimizer="gepa", train_size=6, val_size=2, active_val=0.1,
                                       new_val=0.5, promote=True, reason="r", program=json.dumps(program.dump_state()))  # fmt: skip
        report = diagnose(LLMDiagnoser(lm=lm))
        assert report.diagnosis.program_version == v.id
        assert "Stored version." in json.dumps(lm.history[-1]["messages"])  # the stored program asked the LM
        stored = stored_case(case, report, source=Source.verified, parent_id=None, scenario=None)
        assert stored.provenance.program_version == v.id
        chosen = diagnose(LLMDiagnoser(lm=lm, program=LLMDiagnoserProgram()))  # a program passed in is left alone
        assert chosen.diagnosis.program_version == cold
        ProgramStore(kb.store).rollback("llm")
        assert diagnose(LLMDiagnoser(lm=lm)).diagnosis.program_version == cold


# ---- the job: refusal before any work, and promotion against the active llm version -----------------


@pytest.fixture
def store(tmp_path, split):
    """A store of record only (no index, no embedder): the job with ``retriever=None`` diagnoses cold."""
    from remedy.cases.store import CaseStore

    s = CaseStore(tmp_path / "cases.duckdb")
    s.add_many(c for i in range(8) for c in fix_loop(f"sc{i}", fixed="time_limit" if i % 3 == 0 else None))
    return s


def test_job_refuses_an_llm_run_without_an_lm_and_stores_nothing(store, tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("REMEDY_LM", raising=False)
    opts = OptimizeOptions(backend="llm", optimizer="mipro", reports=tmp_path / "r")
    with pytest.raises(OptimizeError, match="--backend llm needs an LM: set REMEDY_LM"):
        run_optimize(store, None, opts)
    assert ProgramStore(store).list() == [] and not (tmp_path / "r").exists()


def test_job_promotes_only_past_the_margin_over_the_active_llm_version(store, server, tmp_path, monkeypatch) -> None:
    for key, value in {"REMEDY_LM": "openai/recorded", "REMEDY_LM_API_BASE": server.api_base,
                       "REMEDY_LM_API_KEY": "k", "REMEDY_LM_NUM_RETRIES": "0"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    opts = OptimizeOptions(backend="llm", optimizer="bootstrap", trials=1, margin=0.0, reports=tmp_path / "r")
    first = run_optimize(store, None, opts)
    assert first.promoted and ProgramStore(store).active("llm").id == first.version.id
    text = first.report.read_text()
    assert (
        "backend `llm`, optimizer `bootstrap`" in text
        and "| validation example | active before | new version |" in text
    )
    second = run_optimize(store, None, replace(opts, margin=0.02))
    # the server gives every program the same answer: equal scores never clear a positive margin
    assert second.active_val == first.new_val == second.new_val
    assert not second.promoted and second.version.parent == first.version.id
    assert ProgramStore(store).active("llm").id == first.version.id and ProgramStore(store).active("offline") is None
