"""The ranked remedies in the LLM's grounding: the vote's candidates, the remedy ranker's order and P, outcome counts.

The context is test_llm's hovering lander; its similar cases are fix-loop-shaped (a screen, its
confirmation on fresh seeds, failed attempts), so the counts are known by hand.
"""

from __future__ import annotations

import re

from dspy.utils.dummies import DummyLM

from remedy.cases.model import (
    Case,
    Diagnosis,
    RemedyFamily,
    Signature,
    Source,
    Stage,
    Status,
    Verification,
)
from remedy.cases.patches.spec import Hyperparameters, Normalization, Patch, RewardShaping
from remedy.retrieval.diagnosis import RetrievedCase
from remedy.retrieval.llm import LLMDiagnoser, build_description_inputs, build_inputs, remedies_text
from remedy.retrieval.offline import OfflineDiagnoser
from remedy.retrieval.remedy_ranker import Outcomes, RemedyRanker, family_outcomes

from .test_llm import VALID, _ctx

TIME_COST = Patch(parts=[RewardShaping(description="time cost", code="def shaped_reward(*a):\n    return -0.1\n")])
LR = Patch(parts=[Hyperparameters(changes={"learning_rate": 1e-4})])
NORM = Patch(parts=[Normalization(obs=True)])


def _case(case_id: str, patch: Patch, status: str, *, stage: str = "screen", confirms=None, fixed=None, **kw) -> Case:
    subject = _ctx().subject
    verification = Verification(status=Status(status), stage=Stage(stage), confirms=confirms, fixed=fixed, seeds=2)
    return Case(
        case_id=case_id,
        source=Source(kw.pop("source", "bench")),
        subject=subject,
        signature=Signature(summary=f"lander hovers ({case_id})", symptoms=["hovering", "timeouts"]),
        diagnosis=Diagnosis(causes=[], backend="offline"),
        patch=patch,
        verification=verification,
        **kw,
    )


def _neighbours() -> tuple[RetrievedCase, ...]:
    """Time cost: 2 attempts (one confirmed and fixed); learning rate: 1 attempt, no effect; normalization:
    1 attempt, worse; and a bundled example, which is not a measured attempt."""
    cases = [
        _case("a-shape", TIME_COST, "inconclusive", scenario="a"),
        _case("a-shape-confirm", TIME_COST, "improved", stage="confirm", confirms="a-shape", fixed=True, scenario="a"),
        _case("b-shape", TIME_COST, "improved", scenario="b"),  # a screen never confirmed: not a confirmed fix
        _case("c-lr", LR, "no_effect", scenario="c"),
        _case("d-norm", NORM, "worse", scenario="d"),
        _case("lit", LR, "improved", source="example"),
    ]
    return tuple(RetrievedCase(case=c, similarity=0.9 - 0.05 * i) for i, c in enumerate(cases))


def _ranker(favourite: RemedyFamily, **meta) -> RemedyRanker:
    name = f"family={favourite.value}"
    return RemedyRanker(
        names=[name], center=[0.0], scale=[1.0], coef=[4.0], intercept=-2.0, version="v-ranker-7", meta=meta
    )


def _numbered(text: str) -> list[str]:
    """The families of the numbered remedy lines, in order."""
    return re.findall(r"^\d+\. (\w+) \(", text, re.M)


def test_family_outcomes_count_each_attempt_once_at_its_final_verdict() -> None:
    counts = family_outcomes(rc.case for rc in _neighbours())
    assert counts == {
        RemedyFamily.reward_shaping: Outcomes(attempts=2, improved=1, fixed=1),
        RemedyFamily.hyperparameters: Outcomes(attempts=1, improved=0, fixed=0),
        RemedyFamily.normalization: Outcomes(attempts=1, improved=0, fixed=0),
    }
    assert counts[RemedyFamily.reward_shaping].text() == "2 attempts, 1 confirmed improved, 1 fixed"


def test_without_a_ranker_the_vote_order_and_the_similar_cases_counts_are_shown() -> None:
    ctx = _ctx(cases=_neighbours())
    vote = OfflineDiagnoser().diagnose(ctx)
    text = remedies_text(ctx)
    assert "no remedy ranker is active" in text and "P(confirmed fix)" not in text and "KB:" not in text
    assert (
        _numbered(text)
        == [c.family.value for c in vote.candidates]
        == [
            "reward_shaping",
            "hyperparameters",
            "training_budget",
        ]
    )
    lines = text.splitlines()
    assert lines[1].endswith("similar cases: 2 attempts, 1 confirmed improved, 1 fixed")
    assert lines[2].endswith("similar cases: 1 attempt, 0 confirmed improved, 0 fixed")
    assert lines[3].endswith("similar cases: not tried") and "vote score" in lines[3]
    # a family tried and failed that the vote does not propose is still named with its outcome
    assert (
        lines[4]
        == "tried among the similar cases, not proposed: normalization (1 attempt, 0 confirmed improved, 0 fixed)"
    )
    assert text in build_inputs(ctx)["similar_cases"]


def test_an_active_ranker_orders_the_remedies_and_its_experience_is_shown() -> None:
    ctx = _ctx(cases=_neighbours())
    plain = _numbered(remedies_text(ctx))
    last = RemedyFamily(plain[-1])
    assert len(plain) >= 2
    experience = {last.value: {"attempts": 40, "improved": 6, "fixed": 2}, "not_a_family": {"attempts": 1}}
    ranker = _ranker(last, rows=57, families=experience)
    text = remedies_text(ctx, OfflineDiagnoser(ranker=ranker))
    ranked = _numbered(text)
    assert ranked[0] == last.value != plain[0] and sorted(ranked) == sorted(plain)
    assert "remedy ranker v-ranker-7" in text and "57 KB attempts it was fitted on" in text
    top = text.splitlines()[1]
    p = float(re.search(r"P\(confirmed fix\) ([0-9.]+)", top).group(1))
    assert p == round(ranker.probability({f"family={last.value}": 1.0}), 2) > 0.8
    assert "KB: 40 attempts, 6 confirmed improved, 2 fixed" in top
    assert "KB: not tried" in text.splitlines()[2]
    # a version stored before the counts were kept: P and the similar cases' counts only
    bare = remedies_text(ctx, OfflineDiagnoser(ranker=_ranker(last)))
    assert "P(confirmed fix)" in bare and "KB:" not in bare and "fitted on" not in bare


def test_remedies_can_be_left_out_and_description_inputs_carry_them_too() -> None:
    ctx = _ctx(cases=_neighbours())
    assert "ranked remedies" not in build_inputs(ctx, remedies=False)["similar_cases"]
    described = _ctx(cases=_neighbours(), description="the lander hovers and never lands")
    assert "ranked remedies" in build_description_inputs(described)["similar_cases"]


def test_dummy_lm_sees_the_ranked_remedies_end_to_end() -> None:
    ranker = _ranker(RemedyFamily.training_budget)
    lm = DummyLM([VALID])
    report = LLMDiagnoser(lm=lm, vote=OfflineDiagnoser(ranker=ranker)).diagnose(_ctx(cases=_neighbours()))
    assert report.candidates and report.diagnosis.backend == "llm"
    prompt = "\n".join(m["content"] for m in lm.history[-1]["messages"])
    assert "remedy ranker v-ranker-7" in prompt and "1. training_budget (" in prompt
    assert "similar cases: 2 attempts, 1 confirmed improved, 1 fixed" in prompt
    zero_shot = DummyLM([VALID])
    LLMDiagnoser(lm=zero_shot, grounded=False, vote=OfflineDiagnoser(ranker=ranker)).diagnose(_ctx())
    assert "ranked remedies" not in "\n".join(m["content"] for m in zero_shot.history[-1]["messages"])
