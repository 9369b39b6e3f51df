"""The "fixed" rule on hand-made numbers: improved is a confirmed gain, fixed is an agent that now works."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from remedy.cases.model import Effect, Stage, Status, Verification
from remedy.cases.success import ReturnThreshold, Terminated
from remedy.cases.verify.fixed import FIX_SHARE, WORKS_AT, gap_share, judge_fixed, judge_verification
from remedy.cases.verify.solvability import FAIL_BELOW


def test_works_at_is_the_line_a_patient_fails_below():
    assert WORKS_AT == FAIL_BELOW and FIX_SHARE == 0.5


def test_reaching_the_success_definition_is_fixed():
    v = judge_fixed(improved=True, treatment_success=0.6, patient_success=0.0)
    assert v.fixed and v.gap_closed == pytest.approx(1.2)


def test_half_the_gap_on_the_success_rate_is_fixed_less_is_not():
    assert judge_fixed(improved=True, treatment_success=0.25, patient_success=0.0).fixed  # 0.25 of 0.5: 50%
    below = judge_fixed(improved=True, treatment_success=0.2, patient_success=0.0)
    assert not below.fixed and below.gap_closed == pytest.approx(0.4)


def test_the_issue_examples_are_improved_but_not_fixed():
    # Pendulum: -1,603 vs the patient's -1,611 when success needs -300 (closes 0.6% of the gap)
    p = judge_fixed(
        improved=True,
        treatment_success=0.0,
        patient_success=0.0,
        treatment_return=-1603.0,
        patient_return=-1611.0,
        return_threshold=-300.0,
    )
    assert not p.fixed and p.gap_closed == pytest.approx(8 / 1311)
    # a return of 58.8 against 44.8 when success needs 1,000
    h = judge_fixed(
        improved=True,
        treatment_success=0.0,
        patient_success=0.0,
        treatment_return=58.8,
        patient_return=44.8,
        return_threshold=1000.0,
    )
    assert not h.fixed and h.gap_closed == pytest.approx(14 / 955.2)


def test_half_the_return_gap_is_fixed_even_at_zero_success():
    v = judge_fixed(
        improved=True,
        treatment_success=0.0,
        patient_success=0.0,
        treatment_return=-900.0,
        patient_return=-1500.0,
        return_threshold=-300.0,
    )
    assert v.fixed and v.gap_closed == pytest.approx(0.5)


def test_not_improved_is_never_fixed_and_a_declared_share_counts():
    assert not judge_fixed(improved=False, treatment_success=1.0, patient_success=0.0).fixed
    assert judge_fixed(improved=True, treatment_success=0.1, patient_success=0.0, share=0.2).fixed
    assert not judge_fixed(improved=True, treatment_success=0.1, patient_success=0.0, share=0.3).fixed


def test_gap_share_edges():
    assert gap_share(0.6, 0.9, 0.5) is None  # the patient is already past the threshold
    assert gap_share(0.0, -0.1, 0.5) == pytest.approx(-0.2)
    assert gap_share(0.0, float("nan"), 0.5) is None
    v = judge_fixed(improved=True, treatment_success=None, patient_success=None)
    assert not v.fixed and v.gap_closed is None


def _effect(metric: str, treatment: float, control: float) -> Effect:
    d = treatment - control
    return Effect(metric=metric, treatment=treatment, control=control, diff=d, ci_low=d / 2, ci_high=d * 2)


def test_judge_verification_reads_the_effects_and_the_patient_episodes():
    episodes = [SimpleNamespace(success=s, ret=r) for s, r in [(False, -1500.0)] * 4]
    v = Verification(
        status=Status.improved,
        stage=Stage.confirm,
        effect=_effect("return_iqm", -800.0, -1400.0),
        secondary={"success_rate": _effect("success_rate", 0.0, 0.0)},
    )
    judged = judge_verification(v, episodes, ReturnThreshold(threshold=-300.0), FIX_SHARE)
    assert judged.fixed and judged.gap_closed == pytest.approx(700 / 1200)
    screen = judge_verification(v.model_copy(update={"stage": Stage.screen}), episodes, ReturnThreshold(threshold=-300))
    assert screen.fixed is False  # only a confirmation can be fixed
    # a survival task has no return threshold: only the success rate counts
    survive = judge_verification(v, episodes, Terminated(survive=True), FIX_SHARE)
    assert survive.fixed is False and survive.gap_closed == pytest.approx(0.0)


def test_older_records_read_as_unjudged():
    old = Verification.model_validate({"status": "improved"})
    assert old.fixed is None and old.gap_closed is None
    assert judge_verification(Verification(status=Status.failed), [], Terminated(), 0.5).fixed is None
