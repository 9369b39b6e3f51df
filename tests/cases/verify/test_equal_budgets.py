"""Both arms of a verification take the same number of ENV steps, for every patch kind verify accepts.

Env steps are counted by the env itself (a registered CartPole/Pendulum whose
``step`` increments a module-level counter), independent of Remedy's own
bookkeeping; an action repeat's inner steps count one by one.
"""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.envs.classic_control.pendulum import PendulumEnv

from remedy.cases.evidence.rundir import RunConfig, RunDir
from remedy.cases.model import Status, Verification
from remedy.cases.patches import Patch
from remedy.cases.success import parse_success
from remedy.cases.verify.training import arm_budgets, arm_comparison, env_step_budget, finetune, train

#: env steps taken by any counted env in this process since the last reset.
STEPS = [0]

N_ENVS = 4
HYPER = {"n_steps": 32, "batch_size": 64, "n_epochs": 1, "policy_kwargs": {"net_arch": [8]}}
BUDGET = 256  # two rollouts of 32 x 4: the control's env steps exactly


class _CountingCartPole(CartPoleEnv):
    def step(self, action):
        STEPS[0] += 1
        return super().step(action)


class _CountingPendulum(PendulumEnv):
    def step(self, u):
        STEPS[0] += 1
        return super().step(u)


gym.register("RemedyCountingCartPole-v0", entry_point=_CountingCartPole, max_episode_steps=500)
gym.register("RemedyCountingPendulum-v0", entry_point=_CountingPendulum, max_episode_steps=200)

_SHAPING = "def shaped_reward(obs, action, reward, next_obs, terminated, truncated, info):\n    return 0.5 * reward\n"

#: (env, patch, action repeat) for every part kind verify fine-tunes (frame_stack is refused before training).
PATCHES = {
    "reward_shaping": ("cartpole", {"kind": "reward_shaping", "code": _SHAPING}, 1),
    "hyperparameters": ("cartpole", {"kind": "hyperparameters", "changes": {"learning_rate": 0.001}}, 1),
    "hyperparameters_rollout": ("cartpole", {"kind": "hyperparameters", "changes": {"n_steps": 48}}, 1),
    "normalization": ("cartpole", {"kind": "normalization", "obs": True, "reward": True}, 1),
    "time_limit": ("cartpole", {"kind": "time_limit", "max_episode_steps": 40}, 1),
    "action_repeat": ("cartpole", {"kind": "action_repeat", "n": 3}, 3),
    "exploration_bonus": ("cartpole", {"kind": "exploration_bonus", "ent_coef": 0.05, "count_bonus": 0.5}, 1),
    "curriculum": (
        "cartpole",
        {
            "kind": "curriculum",
            "stages": [
                {"env_kwargs": {"sutton_barto_reward": True}, "fraction": 0.5},
                {"env_kwargs": {}, "fraction": 0.5},
            ],
        },
        1,
    ),
    "safety_constraint": (
        "cartpole",
        {"kind": "safety_constraint", "predicate": "abs(obs[0]) > 1.0", "mode": "terminate"},
        1,
    ),
    "budget_with_other_parts": (
        "cartpole",
        {
            "parts": [
                {"kind": "training_budget", "extra_steps": 128},
                {"kind": "hyperparameters", "changes": {"learning_rate": 0.001}},
            ]
        },
        1,
    ),
    "action_smoothness": ("pendulum", {"kind": "action_smoothness", "coef": 0.1}, 1),
    "action_magnitude": ("pendulum", {"kind": "action_magnitude", "coef": 0.1}, 1),
    "action_repeat_continuous": ("pendulum", {"kind": "action_repeat", "n": 2}, 2),
}


@pytest.fixture(scope="module")
def patients(tmp_path_factory) -> dict[str, RunDir]:
    out = {}
    for name, env_id, success in (
        ("cartpole", "RemedyCountingCartPole-v0", {"kind": "terminated", "survive": True}),
        ("pendulum", "RemedyCountingPendulum-v0", {"kind": "return_threshold", "threshold": -200}),
    ):
        cfg = RunConfig(
            env_id=env_id, algo="PPO", hyperparams=HYPER, train_steps=128, n_envs=N_ENVS, success=parse_success(success)
        )
        out[name] = train(cfg, tmp_path_factory.mktemp(name) / "run", seed=0)
    return out


def _counted(run: RunDir, patch_json: str | None, budget: int, out) -> tuple[int, int]:
    """(env steps counted by the env, env steps the result reports) of one fine-tune."""
    STEPS[0] = 0
    res = finetune(str(run.path), patch_json, budget_steps=budget, seed=1, n_envs=N_ENVS, out_dir=str(out))
    assert not res.diverged, res.reason
    return STEPS[0], res.env_steps


_controls: dict[tuple[str, int], int] = {}


@pytest.mark.parametrize("name", list(PATCHES))
def test_arms_take_equal_env_steps(name, patients, tmp_path):
    env, data, repeat = PATCHES[name]
    run, patch = patients[env], Patch.from_data(data)
    t_budget, c_budget = arm_budgets(patch, BUDGET)
    treated, reported = _counted(run, patch.model_dump_json(), t_budget, tmp_path / "t")
    assert reported == treated  # the result reports the env steps really taken
    key = (env, c_budget)
    if key not in _controls:
        _controls[key] = _counted(run, None, c_budget, tmp_path / "c")[0]
    control = _controls[key]
    assert control == env_step_budget(c_budget, HYPER["n_steps"] * N_ENVS)
    # equal, up to the last vector step of an action-repeat arm (each of its steps takes up to n env steps)
    assert control <= treated <= control + N_ENVS * repeat if repeat > 1 else treated == control


def test_action_repeat_no_longer_multiplies_the_env_steps(patients, tmp_path):
    # the old accounting gave an n=3 treatment the control's agent steps: three times its env steps
    treated, _ = _counted(patients["cartpole"], json.dumps({"kind": "action_repeat", "n": 3}), BUDGET, tmp_path)
    assert treated < 1.1 * BUDGET


def test_budget_parts_mixed_with_others_go_to_both_arms():
    mixed = Patch.from_data(
        {"parts": [{"kind": "training_budget", "extra_steps": 500}, {"kind": "normalization", "obs": True}]}
    )
    assert arm_budgets(mixed, 1000) == (1000, 1500)  # finetune adds the 500 to the treatment itself
    assert arm_comparison(mixed) == "same_budget_control"
    pure = Patch.from_data({"kind": "training_budget", "extra_steps": 500})
    assert arm_budgets(pure, 1000) == (0, 0) and arm_comparison(pure) == "budget_vs_none"


def test_comparison_is_recorded_and_old_verifications_still_load():
    old = Verification.model_validate_json('{"status": "improved", "seeds": 2}')
    assert old.comparison == "same_budget_control"
    v = Verification(status=Status.no_effect, comparison="budget_vs_none")
    assert Verification.model_validate_json(v.model_dump_json()).comparison == "budget_vs_none"
