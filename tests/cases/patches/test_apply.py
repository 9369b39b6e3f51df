"""Each patch kind applied to a real env changes what it should (and refuses what does not fit)."""

from __future__ import annotations

import numpy as np
import pytest

from remedy.cases.errors import PatchRejectedError
from remedy.cases.evidence.envs import env_traits
from remedy.cases.evidence.wrappers import WrapperSpec
from remedy.cases.patches import (
    ActionMagnitude,
    ActionRepeat,
    ActionSmoothness,
    Curriculum,
    CurriculumStage,
    ExplorationBonus,
    FrameStack,
    Hyperparameters,
    Normalization,
    Patch,
    RewardShaping,
    SafetyConstraint,
    TimeLimit,
    TrainingBudget,
)
from remedy.cases.patches.apply import PatchPlan, make_patched_env_fn

PENDULUM = "Pendulum-v1"


def _plan(env_id: str, *parts, algo: str = "PPO") -> PatchPlan:
    return PatchPlan.from_patch(Patch(parts=list(parts)), env_traits(env_id), algo)


def _env(env_id: str, plan: PatchPlan, setup=(), **kw):
    return make_patched_env_fn(env_id, {}, list(setup), plan, seed=0, **kw)()


def _rewards(env, actions):
    env.reset(seed=0)
    out = []
    for a in actions:
        _, r, _, _, info = env.step(np.array([a], dtype=np.float32))
        out.append((r, info))
    return out


def test_smoothness_penalty_lowers_reward_for_jerky_actions_only():
    env = _env(PENDULUM, _plan(PENDULUM, ActionSmoothness(coef=0.5)))
    steady = _rewards(env, [1.0] * 6)
    jerky = _rewards(env, [2.0, -2.0] * 3)
    assert all(info["original_reward"] == pytest.approx(r) for r, info in steady)
    # normalized actions jump from +1 to -1: penalty 0.5 * 2**2 = 2 on every step after the first
    gaps = [info["original_reward"] - r for r, info in jerky]
    assert gaps[0] == pytest.approx(0.0)
    assert gaps[1:] == pytest.approx([2.0] * 5)
    assert all(info["shaped_reward"] == pytest.approx(r) for r, info in jerky)


def test_action_magnitude_penalty_scales_with_normalized_action():
    env = _env(PENDULUM, _plan(PENDULUM, ActionMagnitude(coef=0.1)))
    (r0, i0), (r1, i1) = _rewards(env, [0.0, 2.0])
    assert i0["original_reward"] - r0 == pytest.approx(0.0)
    assert i1["original_reward"] - r1 == pytest.approx(0.1)


def test_penalties_refused_on_discrete_actions():
    with pytest.raises(PatchRejectedError) as err:
        _plan("CartPole-v1", ActionSmoothness(coef=0.1))
    assert err.value.rule == "action_smoothness_needs_continuous_actions"


def test_time_limit_patch_replaces_the_setup_limit():
    setup = [WrapperSpec(kind="time_limit", params={"max_episode_steps": 3})]
    plain = _env(PENDULUM, PatchPlan(), setup)
    patched = _env(PENDULUM, _plan(PENDULUM, TimeLimit(max_episode_steps=8)), setup)
    for env, limit in ((plain, 3), (patched, 8)):
        env.reset(seed=0)
        flags = [env.step(env.action_space.sample())[3] for _ in range(limit)]
        assert flags == [False] * (limit - 1) + [True]


def test_curriculum_switches_env_kwargs_at_the_budget_fraction():
    plan = _plan(
        PENDULUM,
        Curriculum(
            stages=[
                CurriculumStage(env_kwargs={"g": 5.0}, fraction=0.5),
                CurriculumStage(env_kwargs={"g": 15.0}, fraction=0.5),
            ]
        ),
    )
    schedule = plan.curriculum_schedule(10)
    env = _env(PENDULUM, plan, schedule=schedule)
    env.reset(seed=0)
    assert env.unwrapped.g == 5.0
    for _ in range(10):
        env.step(env.action_space.sample())
    env.reset(seed=1)
    assert env.unwrapped.g == 15.0


def test_count_bonus_decays_with_visits_and_keeps_original_reward():
    env = _env("CartPole-v1", _plan("CartPole-v1", ExplorationBonus(count_bonus=1.0)))
    env.reset(seed=0)
    _, r, _, _, info = env.step(0)
    assert info["count_bonus"] > 0 and r == pytest.approx(info["original_reward"] + info["count_bonus"])
    wrapper = env
    while not hasattr(wrapper, "counts"):
        wrapper = wrapper.env
    assert sum(wrapper.counts.values()) == 1


def test_action_repeat_sums_rewards_over_n_steps():
    env = _env(PENDULUM, _plan(PENDULUM, ActionRepeat(n=3)))
    env.reset(seed=0)
    _, r, _, _, info = env.step(np.array([0.0], dtype=np.float32))
    assert info["original_reward"] == pytest.approx(r)
    limit = env
    while type(limit).__name__ != "TimeLimit":
        limit = limit.env
    assert limit._elapsed_steps == 3


def test_plan_splits_algorithm_normalization_and_budget_parts():
    plan = _plan(
        "CartPole-v1",
        Hyperparameters(changes={"learning_rate": 1e-4}),
        ExplorationBonus(ent_coef=0.02),
        Normalization(obs=True, reward=True),
        TrainingBudget(extra_steps=500),
    )
    assert plan.overrides == {"learning_rate": 1e-4, "ent_coef": 0.02}
    assert plan.normalization == Normalization(obs=True, reward=True)
    assert plan.extra_steps == 500 and not plan.env_patches and not plan.is_budget_only
    assert _plan("CartPole-v1", TrainingBudget(extra_steps=5)).is_budget_only


@pytest.mark.parametrize(
    "changes, rule",
    [
        ({"learning_rte": 1e-3}, "unknown_hyperparameter"),
        ({"policy_kwargs": {"net_arch": [8]}}, "frozen_hyperparameter"),
        ({"learning_rate": float("nan")}, "non_finite_hyperparameter"),
    ],
)
def test_bad_hyperparameters_refused(changes, rule):
    with pytest.raises(PatchRejectedError) as err:
        _plan("CartPole-v1", Hyperparameters(changes=changes))
    assert err.value.rule == rule


def test_ent_coef_refused_for_dqn():
    with pytest.raises(PatchRejectedError) as err:
        _plan("CartPole-v1", ExplorationBonus(ent_coef=0.01), algo="DQN")
    assert err.value.rule == "ent_coef_unsupported"


def test_frame_stack_marks_a_fresh_policy():
    assert _plan("CartPole-v1", FrameStack(n=4)).needs_fresh_policy


def test_reward_shaping_replaces_reward_and_receives_training_reward():
    pytest.importorskip("remedy.cases.patches.sandbox")
    code = "def shaped_reward(obs, action, reward, next_obs, terminated, truncated, info):\n    return 10.0 * reward + 1.0\n"
    setup = [WrapperSpec(kind="reward_scale", params={"factor": 0.5})]
    env = _env("CartPole-v1", _plan("CartPole-v1", RewardShaping(code=code)), setup)
    env.reset(seed=0)
    _, r, _, _, info = env.step(0)
    assert info["original_reward"] == pytest.approx(1.0)  # set by the setup wrapper, the first changer
    assert r == pytest.approx(10.0 * 0.5 + 1.0) and info["shaped_reward"] == pytest.approx(r)


def test_safety_constraint_terminates_or_penalizes():
    pytest.importorskip("remedy.cases.patches.sandbox")
    always = "abs(obs[0]) >= 0.0"
    term = _env(PENDULUM, _plan(PENDULUM, SafetyConstraint(predicate=always, mode="terminate")))
    pen = _env(PENDULUM, _plan(PENDULUM, SafetyConstraint(predicate=always, mode="penalty", penalty=3.0)))
    term.reset(seed=0)
    assert term.step(np.zeros(1, dtype=np.float32))[2] is True
    ((r, info),) = _rewards(pen, [0.0])
    assert info["safety_violation"] and info["original_reward"] - r == pytest.approx(3.0)
