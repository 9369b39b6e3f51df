"""The patch-kind registry agrees with the spec models and the remedy families, and drives
the plan, the fit rules and the code checks."""

from __future__ import annotations

import typing

import pytest

from remedy.cases.errors import PatchRejectedError
from remedy.cases.model import EnvTraits, RemedyFamily
from remedy.cases.patches import PatchPart
from remedy.cases.patches.apply import PatchPlan
from remedy.cases.patches.kinds import PATCH_KINDS, patch_kind, reward_kinds
from remedy.cases.patches.spec import ExplorationBonus, Patch


def _union_models() -> set[type]:
    union = typing.get_args(PatchPart)[0]
    return set(typing.get_args(union))


def test_every_spec_model_has_one_entry_and_every_family_one_kind():
    assert {k.model for k in PATCH_KINDS.values()} == _union_models()
    assert {k.family for k in PATCH_KINDS.values()} == set(RemedyFamily)
    assert all(name == k.model.model_fields["kind"].default for name, k in PATCH_KINDS.items())


def test_reward_kinds_are_the_wrappers_that_change_the_reward():
    assert reward_kinds() == {
        "reward_shaping",
        "action_smoothness",
        "action_magnitude",
        "exploration_bonus",
        "safety_constraint",
    }
    assert all(PATCH_KINDS[k].wrapper is not None for k in reward_kinds())


def test_unknown_kind_is_refused_with_a_suggestion():
    with pytest.raises(PatchRejectedError, match="did you mean 'time_limit'"):
        patch_kind("time_limt")


CONTINUOUS = EnvTraits(action_space="continuous", obs_dim=3, action_dim=1)


@pytest.mark.parametrize(
    "part, wraps, overrides",
    [
        ({"kind": "exploration_bonus", "ent_coef": 0.01}, False, {"ent_coef": 0.01}),
        ({"kind": "exploration_bonus", "count_bonus": 0.1}, True, {}),
    ],
)
def test_plan_follows_the_entry(part, wraps, overrides):
    plan = PatchPlan.from_patch(Patch.from_data(part), CONTINUOUS, "PPO")
    assert bool(plan.env_patches) is wraps and plan.overrides == overrides
    assert plan.changes_reward is wraps
    assert isinstance(Patch.from_data(part).parts[0], ExplorationBonus)


def test_budget_parts_add_up_and_settings_land_on_the_plan():
    patch = Patch.from_data(
        {
            "parts": [
                {"kind": "training_budget", "extra_steps": 100},
                {"kind": "training_budget", "extra_steps": 50},
                {"kind": "time_limit", "max_episode_steps": 77},
            ]
        }
    )
    plan = PatchPlan.from_patch(patch, CONTINUOUS, None)
    assert plan.extra_steps == 150 and plan.max_episode_steps == 77 and plan.is_budget_only is False


def test_control_kinds_wrap_the_evaluation_env_and_nothing_else():
    import gymnasium as gym

    from remedy.cases.patches.kinds import control_wrapper
    from remedy.cases.patches.wrappers import ActionRepeatWrapper

    controls = {name for name, k in PATCH_KINDS.items() if k.controls}
    assert controls == {"action_repeat"}  # the agent acts through it; every other wrapper shapes training only
    assert all(PATCH_KINDS[k].wrapper is not None and not PATCH_KINDS[k].changes_reward for k in controls)
    env = gym.make("CartPole-v1")
    try:
        patch = Patch.from_data(
            {"parts": [{"kind": "time_limit", "max_episode_steps": 50}, {"kind": "action_repeat", "n": 3}]}
        )
        wrapped = control_wrapper(patch)(env)
        assert isinstance(wrapped, ActionRepeatWrapper) and wrapped.env is env and wrapped.n == 3
        assert control_wrapper(Patch.from_data({"kind": "time_limit", "max_episode_steps": 50}))(env) is env
        assert control_wrapper(None)(env) is env
    finally:
        env.close()
