"""The trajectory preference check decides on failing agents: it orders episodes by what they still show.

Unit tests pin the ordering rule on hand-built measures; the end-to-end tests
replay a real, failing CartPole agent's evidence under reward patches that
reverse or keep the task's order.
"""

from __future__ import annotations

import math

import pytest

from remedy.cases.model import Status
from remedy.cases.patches import Patch
from remedy.cases.verify.arms import (
    PREFERENCE_MIN,
    preference_check,
    task_ordered_pairs,
    trajectory_verdict,
)
from remedy.cases.verify.verification import VerifyConfig, verify_patch

NAN = math.nan

# (success, task return, progress, success margin, -violations)
STUCK_CARS = [(0.0, -200.0, p, NAN, 0.0) for p in (0.1, 0.3, 0.5, 0.7)]  # MountainCar: returns all tied


def _code(body: str) -> Patch:
    return Patch.from_data(
        {
            "kind": "reward_shaping",
            "code": ("def shaped_reward(obs, action, reward, next_obs, terminated, truncated, info):\n" + body),
        }
    )


def test_a_failing_agents_episodes_are_ordered_by_progress_when_returns_tie():
    assert set(task_ordered_pairs(STUCK_CARS)) == {(j, i) for i in range(4) for j in range(4) if j > i}
    keeps = trajectory_verdict(STUCK_CARS, [1.0, 2.0, 3.0, 4.0])
    assert keeps.ok and keeps.prob == 1.0 and keeps.n_pairs == 6 and keeps.status == "passed"
    reverses = trajectory_verdict(STUCK_CARS, [4.0, 3.0, 2.0, 1.0])
    assert not reverses.ok and reverses.prob == 0.0 and reverses.status == "refused"
    # a sparse reward is indifferent among failures: that contradicts nothing, so it is undecidable, not refused
    indifferent = trajectory_verdict(STUCK_CARS, [5.0] * 4)
    assert indifferent.ok and indifferent.prob is None and indifferent.status == "undecidable"
    # ... but a success must be paid more than a failure: a tie there counts half, so a constant reward fails
    mixed = [(1.0, -100.0, 1.0, NAN, 0.0), *STUCK_CARS]
    assert trajectory_verdict(mixed, [5.0] * 5).prob == PREFERENCE_MIN and not trajectory_verdict(mixed, [5.0] * 5).ok
    # only its contradictions count among failures: one reversed pair out of six
    assert trajectory_verdict(STUCK_CARS, [1.0, 1.0, 3.0, 2.0]).prob == pytest.approx(4 / 5)


def test_undecidable_only_when_nothing_is_left_to_compare():
    tied = [(0.0, -200.0, 0.2, NAN, 0.0)] * 3
    res = trajectory_verdict(tied, [1.0, 2.0, 3.0])
    assert res.ok and res.prob is None and res.status == "undecidable"
    # measures that disagree (higher return, less progress) order no pair either way
    assert task_ordered_pairs([(0.0, -100.0, 0.1, NAN, 0.0), (0.0, -300.0, 0.9, NAN, 0.0)]) == []
    # a success beats a failure that is no better on anything else; fewer violations count
    assert task_ordered_pairs([(1.0, 10.0, NAN, NAN, 0.0), (0.0, 5.0, NAN, NAN, 0.0)]) == [(0, 1)]
    assert task_ordered_pairs([(0.0, 5.0, NAN, NAN, 0.0), (0.0, 5.0, NAN, NAN, -3.0)]) == [(0, 1)]


def test_differences_inside_the_tie_tolerance_do_not_order():
    near = [(0.0, 100.0, NAN, NAN, 0.0), (0.0, 100.001, NAN, NAN, 0.0), (0.0, 0.0, NAN, NAN, 0.0)]
    assert set(task_ordered_pairs(near)) == {(0, 2), (1, 2)}


def test_check_refuses_a_reward_that_reverses_a_failing_agents_order(cartpole_run):
    # every episode of the 512-step agent fails; -1 per step pays the shortest (worst) episodes most
    res = preference_check(str(cartpole_run), _code("    return -1.0\n").model_dump_json(), 5, 0)
    assert res.n_success == 0 and res.n_pairs > 0
    assert not res.ok and res.prob < PREFERENCE_MIN and res.status == "refused"


def test_check_accepts_a_reward_that_keeps_the_order(cartpole_run):
    upright = _code("    return reward + 0.5 * (1.0 - min(1.0, abs(float(next_obs[2])) / 0.21))\n")
    res = preference_check(str(cartpole_run), upright.model_dump_json(), 5, 0)
    assert res.n_success == 0 and res.ok and res.prob > 0.9 and res.status == "passed"


def test_verify_refuses_before_training_and_records_the_check(cartpole_run):
    v = verify_patch(
        cartpole_run, _code("    return -1.0\n"), VerifyConfig(seeds=1, budget_steps=64, eval_episodes=3, n_envs=2)
    ).verification
    assert v.status is Status.failed and v.env_steps == 0 and "preference" in v.reason
    assert v.preference == "refused" and v.comparison == "same_budget_control"
