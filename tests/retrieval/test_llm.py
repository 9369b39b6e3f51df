"""The LLM diagnoser: DSPy's DummyLM, and the real dspy.LM path against a local fake OpenAI server.

The fake server runs inside the test on 127.0.0.1 (port 0, a daemon thread) and
answers POST /v1/chat/completions with recorded chat-completion responses from
``llm_recordings/``; nothing leaves the machine.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import dspy
import pytest
from dspy.utils.dummies import DummyLM

from remedy.cases.errors import LMError
from remedy.cases.model import EnvTraits, RemedyFamily, RootCause, Signature, Subject
from remedy.cases.patches.spec import Hyperparameters, Patch, RewardShaping
from remedy.retrieval.diagnosis import Attempt, DiagnosisContext, DiagnosisReport, get_diagnoser
from remedy.retrieval.llm import AutoDiagnoser, LLMDiagnoser, build_inputs, lm_from_env

RECORDINGS = Path(__file__).parent / "llm_recordings"


def _ctx(**kw) -> DiagnosisContext:
    subject = Subject(
        env_id="LunarLander-v3",
        env_kwargs={"continuous": True},
        algo="PPO",
        train_steps=150_000,
        success="last reward >= 100",
        traits=EnvTraits(action_space="continuous", obs_dim=8, action_dim=2),
    )
    sig = Signature(
        features={"truncation_rate": 1.0, "success_rate": 0.0, "ep_len_mean": 1000.0, "ep_len_frac": 1.0},
        symptoms=["hovering", "timeouts", "never_succeeds", "low_success"],
        summary="PPO lander hovers: every episode hits the time limit, none land",
    )
    return DiagnosisContext(subject=subject, signature=sig, **kw)


def _answer(root_causes, patches) -> dict:
    return {
        "reasoning": "r",
        "observations": "o",
        "candidate_causes": "c",
        "evidence": "e",
        "root_causes": root_causes if isinstance(root_causes, str) else json.dumps(root_causes),
        "patches": patches if isinstance(patches, str) else json.dumps(patches),
    }


VALID = _answer(
    [
        {"cause": "reward_misspecification", "confidence": 0.7, "rationale": "survival is paid"},
        {"cause": "undertraining", "confidence": 0.2, "rationale": "maybe"},
    ],
    [
        {
            "patch": {"kind": "hyperparameters", "changes": {"learning_rate": 1e-4}},
            "compute_cost": "Low",
            "side_effects": "slower",
            "cites": ["prior-hovering-time-cost"],
        },
        {"patch": {"parts": [{"kind": "training_budget", "extra_steps": 30000}]}, "compute_cost": "medium"},
    ],
)
MALFORMED = _answer("the reward, probably", "[]")


# ---- DummyLM -----------------------------------------------------------------------------------


def test_dummy_lm_valid_answer_gives_typed_report():
    report = LLMDiagnoser(lm=DummyLM([VALID])).diagnose(_ctx())
    assert isinstance(report, DiagnosisReport)
    assert [c.cause for c in report.diagnosis.causes] == [RootCause.reward_misspecification, RootCause.undertraining]
    assert report.diagnosis.backend == "llm" and report.diagnosis.program_version.startswith("dspy-diagnose-1:")
    first = report.candidates[0]
    assert isinstance(first.patch.parts[0], Hyperparameters) and first.compute_cost == "low"
    assert [c.family for c in report.candidates] == [RemedyFamily.hyperparameters, RemedyFamily.training_budget]
    assert "prior-hovering-time-cost" in report.diagnosis.cited_rules


def test_dummy_lm_malformed_then_valid_is_retried():
    lm = DummyLM([MALFORMED, VALID])
    report = LLMDiagnoser(lm=lm, max_retries=2).diagnose(_ctx())
    assert report.top_cause == RootCause.reward_misspecification
    assert len(lm.history) == 2


def test_dummy_lm_always_malformed_raises_after_bounded_retries():
    lm = DummyLM([MALFORMED] * 5)
    with pytest.raises(LMError, match="malformed output 2 times"):
        LLMDiagnoser(lm=lm, max_retries=1).diagnose(_ctx())
    assert len(lm.history) == 2


def test_unknown_patch_kind_is_dropped_with_warning_not_retried():
    answer = _answer(
        [{"cause": "action_jitter", "confidence": 0.9}],
        [{"patch": {"kind": "teleport", "power": 9000}}, {"kind": "action_smoothness", "coef": 0.2}],
    )
    report = LLMDiagnoser(lm=DummyLM([answer])).diagnose(_ctx())
    assert [c.family for c in report.candidates] == [RemedyFamily.action_smoothness]
    assert any("patch #1" in w and "schema" in w for w in report.warnings)


def test_unknown_cause_label_counts_as_malformed():
    bad = _answer([{"cause": "cosmic_rays", "confidence": 0.9}], "[]")
    lm = DummyLM([bad, VALID])
    assert LLMDiagnoser(lm=lm).diagnose(_ctx()).top_cause == RootCause.reward_misspecification


def test_prompt_carries_structured_context_and_previous_attempts():
    tried = (
        Attempt(patch=Patch(parts=[Hyperparameters(changes={"learning_rate": 1e-4})]), status="no_effect", effect=0.01),
    )
    inputs = build_inputs(_ctx(tried=tried))
    assert "truncation_rate=1" in inputs["signature_report"] and "hovering" in inputs["signature_report"]
    assert "learning_rate=0.0001 -> no_effect" in inputs["previous_attempts"]
    assert "prior-hovering-time-cost" in inputs["rules"] and "LunarLander-v3" in inputs["env_description"]


def test_registry_builds_llm_backends():
    assert isinstance(get_diagnoser("llm", lm=DummyLM([VALID])), LLMDiagnoser)
    assert isinstance(get_diagnoser("auto"), AutoDiagnoser)


# ---- a local OpenAI-compatible server ----------------------------------------------------------


class _FakeOpenAI:
    """Serves recorded chat completions in order (repeating the last); records request bodies."""

    def __init__(self, recording: str):
        self.responses = json.loads((RECORDINGS / recording).read_text())["responses"]
        self.requests: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                if not self.path.endswith("/chat/completions"):
                    self.send_error(404)
                    return
                fake.requests.append(body)
                answer = dict(fake.responses[min(len(fake.requests), len(fake.responses)) - 1])
                status = answer.pop("_status", 200)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_openai():
    servers = []

    def start(recording: str) -> _FakeOpenAI:
        servers.append(_FakeOpenAI(recording))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def _lm(api_base: str, engine: str = "auto") -> dspy.LM:
    env = {
        "REMEDY_LM": "openai/recorded",
        "REMEDY_LM_API_BASE": api_base,
        "REMEDY_LM_API_KEY": "test-key",
        "REMEDY_LM_ENGINE": engine,
        "REMEDY_LM_NUM_RETRIES": "0",
        "REMEDY_LM_TIMEOUT": "20",
    }
    return lm_from_env(env)


@pytest.mark.parametrize("engine", ["auto", "litellm"])
def test_real_lm_path_valid_recording(fake_openai, engine):
    server = fake_openai("valid.json")
    report = LLMDiagnoser(lm=_lm(server.api_base, engine)).diagnose(_ctx())
    assert report.top_cause == RootCause.reward_misspecification
    assert isinstance(report.candidates[0].patch.parts[0], RewardShaping)
    assert report.candidates[0].compute_cost == "medium"
    assert len(server.requests) == 1
    sent = json.dumps(server.requests[0]["messages"])
    assert "hovering" in sent and "root_causes" in sent and server.requests[0]["model"] == "recorded"


def test_real_lm_path_malformed_recording_raises_after_retries(fake_openai):
    server = fake_openai("malformed.json")
    with pytest.raises(LMError, match="malformed output 3 times"):
        LLMDiagnoser(lm=_lm(server.api_base), max_retries=2).diagnose(_ctx())
    assert len(server.requests) == 3


def test_real_lm_path_recovers_after_one_malformed_answer(fake_openai):
    server = fake_openai("malformed_then_valid.json")
    report = LLMDiagnoser(lm=_lm(server.api_base), max_retries=1).diagnose(_ctx())
    assert report.top_cause == RootCause.reward_misspecification and len(server.requests) == 2
    assert server.requests[0]["temperature"] == 0.0 and server.requests[1]["temperature"] == 0.7  # retry samples warmer


def test_real_lm_path_hostile_code_is_rejected_by_the_sandbox(fake_openai):
    server = fake_openai("hostile.json")
    report = LLMDiagnoser(lm=_lm(server.api_base)).diagnose(_ctx())
    assert [c.family for c in report.candidates] == [RemedyFamily.training_budget]
    assert any("rejected LLM candidate" in w and "sandbox" in w for w in report.warnings)
    assert not any("import os" in c.patch.model_dump_json() for c in report.candidates)


def test_provider_error_is_one_lmerror_naming_endpoint_and_model(fake_openai):
    server = fake_openai("auth_error.json")
    with pytest.raises(LMError) as err:
        LLMDiagnoser(lm=_lm(server.api_base)).diagnose(_ctx())
    msg = str(err.value)
    assert server.api_base in msg and "openai/recorded" in msg and "REMEDY_LM_API_KEY" in msg
    assert len(server.requests) == 1  # not retried as if it were a malformed answer


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_endpoint_raises_lmerror_naming_it():
    base = f"http://127.0.0.1:{_closed_port()}/v1"
    with pytest.raises(LMError) as err:
        LLMDiagnoser(lm=_lm(base)).diagnose(_ctx())
    msg = str(err.value)
    assert base in msg and "openai/recorded" in msg and "--diagnoser offline" in msg


def test_auto_falls_back_to_offline_when_the_lm_is_unreachable(monkeypatch):
    base = f"http://127.0.0.1:{_closed_port()}/v1"
    for key, val in {
        "REMEDY_LM": "openai/recorded",
        "REMEDY_LM_API_BASE": base,
        "REMEDY_LM_API_KEY": "k",
        "REMEDY_LM_NUM_RETRIES": "0",
    }.items():
        monkeypatch.setenv(key, val)
    report = get_diagnoser("auto").diagnose(_ctx())
    assert report.diagnosis.backend == "offline"
    assert report.top_cause == RootCause.reward_misspecification
    assert report.warnings and base in report.warnings[0] and "offline" in report.warnings[0]


def test_auto_without_an_lm_is_offline_without_warning(monkeypatch):
    monkeypatch.delenv("REMEDY_LM", raising=False)
    report = get_diagnoser("auto").diagnose(_ctx())
    assert report.diagnosis.backend == "offline" and report.warnings == []


def test_llm_without_configuration_says_what_to_set(monkeypatch):
    monkeypatch.delenv("REMEDY_LM", raising=False)
    with pytest.raises(LMError, match="REMEDY_LM"):
        LLMDiagnoser().diagnose(_ctx())


def test_bad_lm_settings_are_one_clear_error():
    with pytest.raises(LMError, match="REMEDY_LM_TEMPERATURE='warm' is not a valid float"):
        lm_from_env({"REMEDY_LM": "openai/x", "REMEDY_LM_TEMPERATURE": "warm"})
    lm = lm_from_env({"REMEDY_LM": "openai/x", "REMEDY_LM_API_BASE": "http://127.0.0.1:1/v1"})
    assert lm.model == "openai/x" and lm.kwargs["api_base"] == "http://127.0.0.1:1/v1" and lm.kwargs["api_key"]


def test_accepted_rules_reach_the_prompt_with_their_evidence_and_can_be_cited():
    from remedy.miners import Condition, Rule, RuleEvidence, rule_id

    conds = [Condition(field="symptom", value="hovering")]
    evidence = RuleEvidence(
        support=6,
        wins=5,
        win_rate=5 / 6,
        effect_scale="s",
        effect=1.2,
        ci_low=0.4,
        ci_high=2.0,
        p_value=0.001,
        q_value=0.01,
    )
    rule = Rule(
        id=rule_id(conds, RemedyFamily.reward_shaping), conditions=conds, family="reward_shaping", evidence=evidence
    )
    text = build_inputs(_ctx(rules=(rule,)))["rules"]
    assert f"- {rule.id} [accepted rule]: when symptom=hovering" in text
    assert "improved in 5 of 6 verified cases" in text
    citing = _answer(
        [{"cause": "reward_misspecification", "confidence": 0.7, "rationale": "survival is paid"}],
        [{"patch": {"kind": "training_budget", "extra_steps": 30000}, "cites": [rule.id]}],
    )
    report = LLMDiagnoser(lm=DummyLM([citing])).diagnose(_ctx(rules=(rule,)))
    assert report.diagnosis.cited_rules == [rule.id] and report.candidates[0].cites == [rule.id]
