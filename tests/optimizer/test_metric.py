"""The metric: partial credit on solved groups, penalties for repeating verified failures, feedback text."""

from __future__ import annotations

import pytest

from remedy.cases.model import RootCause
from remedy.optimizer import build_examples, score_prediction

from .conftest import fix_loop


@pytest.fixture
def solved():
    (ex,) = build_examples(
        fix_loop(
            "hover",
            fixed="time_limit",
            failed=("hyperparameters",),
            causes=("unstable_optimization", "time_limit_misconfiguration"),
        )
    )
    return ex  # verified: cause time_limit_misconfiguration, family time_limit; hyperparameters no_effect


@pytest.fixture
def unsolved():
    (ex,) = build_examples(fix_loop("stuck", failed=("hyperparameters", "normalization")))
    return ex


@pytest.mark.parametrize(
    ("causes", "families", "expected"),
    [
        (["time_limit_misconfiguration"], ["time_limit"], 1.0),
        (["time_limit_misconfiguration"], ["hyperparameters"], 0.7),
        (["undertraining", "time_limit_misconfiguration"], ["hyperparameters", "time_limit"], 0.35 + 0.15),
        (["undertraining", "sparse_reward", "time_limit_misconfiguration"], [], 0.35),
        (["undertraining"], ["time_limit"], 0.3),
        (["undertraining"], ["normalization", "reward_shaping", "time_limit"], 0.15),
        (["undertraining", "sparse_reward", "reward_hacking", "time_limit_misconfiguration"], ["normalization"], 0.0),
        ([], [], 0.0),
    ],
)
def test_partial_credit_on_a_solved_group(solved, causes, families, expected) -> None:
    assert score_prediction(solved, causes, families).score == pytest.approx(expected)


def test_credit_ladder_top1_cause_beats_top3_beats_family(solved) -> None:
    top1 = score_prediction(solved, ["time_limit_misconfiguration"], ["hyperparameters"]).score
    top3 = score_prediction(solved, ["undertraining", "time_limit_misconfiguration"], ["hyperparameters"]).score
    family = score_prediction(solved, ["undertraining"], ["time_limit"]).score
    assert top1 > top3 > family > 0


def test_unsolved_group_penalizes_families_verified_not_to_help(unsolved) -> None:
    assert score_prediction(unsolved, ["undertraining"], ["training_budget", "time_limit"]).score == 1.0
    assert score_prediction(unsolved, ["undertraining"], ["hyperparameters", "time_limit"]).score == 0.5
    assert score_prediction(unsolved, ["undertraining"], ["time_limit", "normalization"]).score == 0.75
    assert score_prediction(unsolved, [], ["hyperparameters", "normalization"]).score == 0.25
    # causes are not judged where nothing was confirmed
    assert score_prediction(unsolved, ["sparse_reward"], ["time_limit"]).score == 1.0


def test_strings_outside_the_taxonomy_match_nothing_but_keep_their_rank(solved) -> None:
    s = score_prediction(solved, ["the wind", "time_limit_misconfiguration"], ["time_limit"])
    assert s.score == pytest.approx(0.35 + 0.3)
    assert "(not in the taxonomy)" in s.feedback


def test_feedback_says_what_was_tried_and_what_was_right(solved, unsolved) -> None:
    fb = score_prediction(solved, ["undertraining"], ["time_limit"]).feedback
    assert "hyperparameters (for unstable_optimization): no_effect" in fb
    assert "time_limit (for time_limit_misconfiguration): improved, +4 return_iqm" in fb
    assert "wrong: no verified cause (time_limit_misconfiguration)" in fb
    assert "right: top family time_limit is verified" in fb
    fb = score_prediction(unsolved, ["undertraining"], ["hyperparameters"]).feedback
    assert "No attempt was confirmed" in fb and "ranks hyperparameters high" in fb


def test_scores_stay_in_unit_interval_on_real_cases(dev_cases) -> None:
    for ex in build_examples(dev_cases):
        for causes, fams in ((list(ex.causes), list(ex.families)), ([], []), (["unknown"], ["training_budget"])):
            s = score_prediction(ex, causes, fams)
            assert 0.0 <= s.score <= 1.0 and ex.group in s.feedback
        if ex.solved:
            assert score_prediction(ex, list(ex.causes), list(ex.families)).score == 1.0


def test_unsolved_dev_scenario_is_judged_on_its_answer_key_and_its_failed_families() -> None:
    (ex,) = build_examples(
        fix_loop("lunar_hover", failed=("hyperparameters",)),
        answer_keys={"lunar_hover": (RootCause.reward_misspecification,)},
    )
    assert score_prediction(ex, ["reward_misspecification"], ["time_limit"]).score == pytest.approx(1.0)
    assert score_prediction(ex, ["reward_misspecification"], ["hyperparameters"]).score == pytest.approx(0.7 + 0.15)
    assert score_prediction(ex, ["undertraining", "reward_misspecification"], ["time_limit"]).score == pytest.approx(
        0.35 + 0.3
    )
    s = score_prediction(ex, ["undertraining"], ["hyperparameters"])
    assert s.score == pytest.approx(0.15) and "wrong: the answer key (reward_misspecification)" in s.feedback


def test_a_verified_fix_outranks_the_answer_key() -> None:
    (ex,) = build_examples(
        fix_loop("hover", fixed="time_limit", causes=("time_limit_misconfiguration",)),
        answer_keys={"hover": (RootCause.reward_misspecification,)},
    )
    assert score_prediction(ex, ["time_limit_misconfiguration"], ["time_limit"]).score == 1.0
    assert score_prediction(ex, ["reward_misspecification"], ["time_limit"]).score == pytest.approx(0.3)
