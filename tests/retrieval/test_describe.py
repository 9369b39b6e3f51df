"""Reading a failure described in words: clauses, negation, tags, subject, and both backends on a text context."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dspy.utils.dummies import DummyLM

from remedy.cases.errors import ValidationError
from remedy.cases.model import ActionSpaceType, RemedyFamily, RootCause
from remedy.cases.patches.spec import Patch
from remedy.kb.diagnose import diagnose_description
from remedy.retrieval.describe import (
    SymptomReader,
    is_negated,
    parse_tags,
    split_clauses,
    text_signature,
    text_subject,
)
from remedy.retrieval.diagnosis import UNSPECIFIED, DiagnosisContext, DiagnosisReport, SymptomReading
from remedy.retrieval.llm import LLMDiagnoser, build_description_inputs, sandbox_check
from remedy.retrieval.offline import OfflineDiagnoser
from remedy.retrieval.text_priors import REPORT_FAMILY_RATES


@pytest.fixture(scope="module")
def reader(embedder) -> SymptomReader:
    """The reader with the shipped (dev-calibrated) settings."""
    return SymptomReader(embedder)


def _tags(reader: SymptomReader, text: str) -> list[str]:
    return [r.tag for r in reader.read(text)]


# ---- clauses and negation -------------------------------------------------------------------


def test_clauses_split_at_sentences_commas_and_contrast_words():
    text = "The pendulum is held upright, but it does not jitter. Training took 20k steps; nothing else."
    assert split_clauses(text) == [
        "The pendulum is held upright",
        "it does not jitter",
        "Training took 20k steps",
        "nothing else",
    ]
    assert split_clauses("   ") == [] and split_clauses("ok.") == []  # one-word clauses say nothing


@pytest.mark.parametrize(
    "text, negated",
    [
        ("it does NOT jitter", True),
        ("it doesn't jitter", True),
        ("the car never reaches the flag", True),
        ("no progress at all", True),
        ("it learns without trouble", True),
        ("the torque chatters", False),
        ("notable oscillation", False),
        ("known issue", False),
    ],
)
def test_negation_cues(text, negated):
    assert is_negated(text) is negated


def test_a_negated_symptom_does_not_fire(reader):
    positive = "The torque is jittery and shaky, flipping rapidly between the extremes every step."
    assert "jerky_actions" in _tags(reader, positive)
    for text in (
        "The pendulum is held upright and it does NOT jitter.",
        "It doesn't oscillate or chatter at all.",
        "The controller is smooth; there is no jitter.",
    ):
        assert "jerky_actions" not in _tags(reader, text), text


def test_polarity_must_agree_but_a_negated_symptom_still_reads(reader):
    # "never reaches the goal" is a symptom worded with a negation: it matches the negated phrasings
    assert _tags(reader, "The agent never reaches the goal.")[:1] == ["never_succeeds"]


@pytest.mark.parametrize(
    "text, tag",
    [
        ("The lander hovers above the pad until the episode times out.", "hovering"),
        ("The policy entropy collapsed to zero early in training.", "collapsed_entropy"),
        ("The reward climbs for a while and then suddenly collapses.", "unstable_learning"),
        ("Some observations are in the thousands while others stay below one.", "unscaled_observations"),
        ("The reward is zero on almost every step.", "sparse_signal"),
        ("It works in simulation but fails completely in a different simulator.", "poor_generalization"),
    ],
)
def test_tag_reading_on_hand_sentences(embedder, text, tag):
    reader = SymptomReader(embedder, threshold=0.45)  # the mechanism at a fixed threshold; calibration is the bench's
    reading = reader.read(text)
    assert tag in [r.tag for r in reading], [(r.tag, r.similarity) for r in reading]
    hit = next(r for r in reading if r.tag == tag)
    assert hit.similarity >= 0.45 and hit.clause  # the reading says how strongly and from where


def test_reading_is_bounded_ranked_and_deterministic(embedder):
    text = (
        "The lander hovers and never lands. Training is unstable, the reward crashes. The actions chatter. "
        "Observations are not normalized."
    )
    reader = SymptomReader(embedder, max_tags=2)
    first = reader.read(text)
    assert len(first) == 2 and first[0].similarity >= first[1].similarity
    assert first == reader.read(text)
    assert SymptomReader(embedder, threshold=1.01).read(text) == []


# ---- tags, subject and signature from words ---------------------------------------------------


def test_user_tags_are_checked_against_the_vocabulary():
    assert parse_tags("hovering, Timeouts,hovering") == ["hovering", "timeouts"]
    assert parse_tags(["jerky-actions"]) == ["jerky_actions"] and parse_tags("") == []
    with pytest.raises(ValidationError, match="did you mean 'hovering'"):
        parse_tags("hoverng")


def test_subject_from_what_the_user_named():
    subject, notes = text_subject("CartPole-v1", "ppo")
    assert (subject.env_id, subject.algo, subject.traits.action_space) == (
        "CartPole-v1",
        "PPO",
        ActionSpaceType.discrete,
    )
    assert subject.traits.obs_dim == 4 and notes == []
    dqn, _ = text_subject(algo="DQN")
    assert dqn.env_id == UNSPECIFIED and dqn.traits.action_space == ActionSpaceType.discrete
    jerky, notes = text_subject(tags=["jerky_actions"])
    assert jerky.traits.action_space == ActionSpaceType.continuous and notes == []
    unknown, notes = text_subject()
    assert unknown.algo == UNSPECIFIED and any("--action-space" in n for n in notes)
    custom, notes = text_subject("MyRobotArm-v0", "TD-MPC2", "continuous")
    assert custom.env_id == "MyRobotArm-v0" and custom.algo == "TD-MPC2" and len(notes) == 2
    with pytest.raises(ValidationError, match="discrete or continuous"):
        text_subject(action_space="hybrid")


def test_signature_from_words_has_no_measured_features():
    sig = text_signature("  the lander   hovers ", ["hovering"])
    assert sig.features == {} and sig.symptoms == ["hovering"] and sig.summary == "the lander hovers"
    with pytest.raises(ValidationError, match="description is empty"):
        text_signature(" ", [])


# ---- one diagnoser for both: the offline vote on a text context ------------------------------


def test_offline_diagnosis_from_a_description_cold(reader):
    report = diagnose_description(
        None,
        "The lander hovers above the pad until the time limit and never lands.",
        env_id="LunarLander-v3",
        reader=reader,
    )
    assert isinstance(report, DiagnosisReport)
    assert "hovering" in report.signature.symptoms and report.reading and report.reading[0].similarity
    assert report.top_cause == RootCause.reward_misspecification
    assert report.candidates[0].family == RemedyFamily.reward_shaping
    assert "prior-hovering-time-cost" in report.diagnosis.cited_rules
    again = diagnose_description(
        None,
        "The lander hovers above the pad until the time limit and never lands.",
        env_id="LunarLander-v3",
        reader=reader,
    )
    assert again == report


def test_user_tags_override_the_reading(reader):
    text = "The lander hovers above the pad until the time limit and never lands."
    report = diagnose_description(None, text, env_id="Pendulum-v1", tags="jerky_actions", reader=reader)
    assert report.signature.symptoms == ["jerky_actions"]
    assert report.reading == [SymptomReading(tag="jerky_actions", clause="set by the user")]
    assert report.top_cause == RootCause.action_jitter


def test_a_description_with_no_tag_says_so(reader):
    report = diagnose_description(None, "Something is off with my agent, please help.", reader=reader, tags=[])
    assert report.top_cause == RootCause.unknown
    assert any("no symptom tag" in w for w in report.warnings)


def test_family_base_rates_match_the_labelled_reports():
    """REPORT_FAMILY_RATES is the data file's table (batches 1-4), so it cannot drift from it silently."""
    lines = (Path(__file__).resolve().parents[2] / "bench" / "data" / "describe_reports.jsonl").read_text().splitlines()
    reports = [json.loads(line) for line in lines if line.strip()]
    votes: dict[str, float] = {}
    for r in (r for r in reports if r["split"] != "holdout5"):
        for rank, fam in enumerate(r["families"]):
            votes[fam] = votes.get(fam, 0.0) + 1.0 / (1 + rank)
    total = sum(votes.values())
    assert {f.value for f in REPORT_FAMILY_RATES} == set(votes)
    for fam, rate in REPORT_FAMILY_RATES.items():
        assert rate == pytest.approx(votes[fam.value] / total, abs=6e-4), fam


def test_family_base_rates_order_a_vague_description_and_leave_causes_alone(reader):
    text = "My agent does not learn anything on my custom environment."
    off = diagnose_description(None, text, reader=reader, diagnoser=OfflineDiagnoser(w_family_base_rate=0.0))
    on = diagnose_description(None, text, reader=reader)
    assert [c.cause for c in on.diagnosis.causes] == [c.cause for c in off.diagnosis.causes]
    assert {f.family for f in on.families} >= {f.family for f in off.families}
    # a family nothing voted for now shows, in base-rate order
    voted = {f.family for f in off.families}
    extra = [f.family for f in on.families if f.family not in voted]
    assert extra, "the base rates add the families real reports were resolved with"
    rates = [REPORT_FAMILY_RATES[f] for f in extra]
    assert rates == sorted(rates, reverse=True)
    # nothing measured supports the extra families: their score is the base rate alone
    top = max((f.score for f in off.families), default=0.0) or 1.0
    by_family = {f.family: f.score for f in on.families}
    for fam in extra:
        assert by_family[fam] == pytest.approx(0.5 * REPORT_FAMILY_RATES[fam] * top, abs=1e-3)


# ---- the LLM backend reads the description too ------------------------------------------------


def _text_ctx(reader, **kw) -> DiagnosisContext:
    text = "The lander hovers above the pad until the time limit and never lands."
    subject, notes = text_subject(kw.pop("env_id", None), "PPO", "continuous")
    reading = tuple(reader.read(text))
    return DiagnosisContext(
        subject=subject,
        signature=text_signature(text, [r.tag for r in reading]),
        description=text,
        reading=reading,
        notes=tuple(notes),
        **kw,
    )


ANSWER = {
    "reasoning": "r",
    "observations": "o",
    "candidate_causes": "c",
    "evidence": "e",
    "root_causes": json.dumps([{"cause": "reward_misspecification", "confidence": 0.7, "rationale": "pays to hover"}]),
    "patches": json.dumps(
        [
            {
                "patch": {
                    "kind": "reward_shaping",
                    "description": "time cost",
                    "code": "def shaped_reward(obs, action, reward, next_obs, terminated, truncated, info):\n"
                    "    return float(reward) - 1.0\n",
                }
            },
            {"patch": {"kind": "hyperparameters", "changes": {"learning_rate": 0.0001}}, "compute_cost": "low"},
        ]
    ),
}


def test_llm_diagnoses_a_description_with_its_own_program(reader):
    lm = DummyLM([ANSWER])
    report = LLMDiagnoser(lm=lm).diagnose(_text_ctx(reader))
    assert report.diagnosis.backend == "llm" and report.diagnosis.program_version.startswith("dspy-describe-1:")
    assert report.top_cause == RootCause.reward_misspecification
    prompt = json.dumps(lm.history[-1]["messages"])
    assert "hovers above the pad" in prompt and "hovering (" in prompt  # the text and its reading are the input
    assert "truncation_rate" not in prompt  # no measured signature goes in
    # no env named: code cannot be fuzzed, so the reward patch is refused and the hyperparameter one kept
    assert [c.family for c in report.candidates] == [RemedyFamily.hyperparameters]
    assert any("name the env (--env)" in w for w in report.warnings)


def test_description_inputs_name_what_is_known_and_unknown(reader):
    inputs = build_description_inputs(_text_ctx(reader))
    assert set(inputs) == {"description", "environment", "symptom_reading", "similar_cases", "rules"}
    assert "env not named" in inputs["environment"] and "algorithm PPO" in inputs["environment"]
    assert "prior-hovering-time-cost" in inputs["rules"]


def test_code_patches_need_a_named_env_for_the_sandbox(reader):
    code = Patch.from_data(
        {
            "kind": "reward_shaping",
            "description": "d",
            "code": "def shaped_reward(obs, action, reward, next_obs, terminated, truncated, info):\n"
            "    return float(reward)\n",
        }
    )
    ok, why = sandbox_check(code, _text_ctx(reader))
    assert not ok and "--env" in why
    ok, _ = sandbox_check(code, _text_ctx(reader, env_id="LunarLander-v3"))
    assert ok
