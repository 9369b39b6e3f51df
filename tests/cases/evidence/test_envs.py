"""Envs, algorithms, setup wrappers and constraint expressions."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from remedy.cases.algos import get_algo, is_on_policy
from remedy.cases.errors import AlgorithmError, CheckpointError, EnvError, ValidationError
from remedy.cases.evidence.constraints import Constraint, compile_constraint
from remedy.cases.evidence.envs import check_spaces, env_traits, make_env, time_limit_of
from remedy.cases.evidence.wrappers import ORIGINAL_REWARD_KEY, WRAPPERS, WrapperSpec, apply_wrappers
from remedy.cases.model import ActionSpaceType, RewardDensity


def test_unknown_env_suggests_close_name():
    with pytest.raises(EnvError, match=r"unknown env 'LunarLandr-v3'; did you mean 'LunarLander-v3'\?"):
        make_env("LunarLandr-v3")


def test_bad_env_kwargs_is_env_error():
    with pytest.raises(EnvError, match="rejected env_kwargs"):
        make_env("CartPole-v1", {"no_such_kwarg": 3})


def test_traits_of_discrete_continuous_and_sparse_envs():
    cp = env_traits("CartPole-v1")
    assert (cp.action_space, cp.obs_dim, cp.action_dim, cp.reward_density) == (
        ActionSpaceType.discrete,
        4,
        2,
        RewardDensity.dense,
    )
    pend = env_traits("Pendulum-v1")
    assert pend.action_space == ActionSpaceType.continuous and pend.action_dim == 1 and pend.obs_dim == 3
    assert env_traits("MountainCar-v0").reward_density == RewardDensity.sparse
    assert env_traits("LunarLander-v3", {"continuous": True}).action_space == ActionSpaceType.continuous


def test_time_limit_override_and_wrapper():
    assert time_limit_of(make_env("CartPole-v1")) == 500
    assert time_limit_of(make_env("CartPole-v1", max_episode_steps=50)) == 50
    env = make_env("Pendulum-v1", wrappers=[WrapperSpec(kind="time_limit", params={"max_episode_steps": 37})])
    assert time_limit_of(env) == 37
    env.reset(seed=0)
    steps, truncated = 0, False
    while not truncated:
        _, _, _, truncated, _ = env.step(env.action_space.sample())
        steps += 1
    assert steps == 37


def test_obs_scale_scales_observations_and_space():
    plain = make_env("CartPole-v1")
    scaled = make_env("CartPole-v1", wrappers=[{"kind": "obs_scale", "params": {"factor": 1000}}])
    o1, _ = plain.reset(seed=3)
    o2, _ = scaled.reset(seed=3)
    np.testing.assert_allclose(o2, o1 * 1000, rtol=1e-5)
    assert scaled.observation_space.high[0] == pytest.approx(plain.observation_space.high[0] * 1000)


def test_reward_wrappers_keep_first_original_reward_and_evaluation_drops_them():
    specs = [
        WrapperSpec(kind="reward_scale", params={"factor": 10.0}),
        WrapperSpec(kind="reward_noise", params={"std": 1.0, "seed": 1}),
    ]
    env = make_env("CartPole-v1", wrappers=specs)
    env.reset(seed=0)
    _, r, _, _, info = env.step(0)
    assert info[ORIGINAL_REWARD_KEY] == 1.0  # CartPole pays 1; the innermost wrapper's record survives
    assert r != pytest.approx(10.0) and "noise" in info["reward_components"]
    ev = make_env(
        "CartPole-v1", wrappers=[*specs, WrapperSpec(kind="obs_scale", params={"factor": 2.0})], for_evaluation=True
    )
    ev.reset(seed=0)
    _obs, r, _, _, info = ev.step(0)
    assert r == 1.0 and ORIGINAL_REWARD_KEY not in info
    assert ev.observation_space.high[0] == pytest.approx(4.8 * 2)  # observation wrapper kept


def test_reward_noise_is_seeded():
    def rewards():
        env = make_env("CartPole-v1", wrappers=[WrapperSpec(kind="reward_noise", params={"std": 1.0, "seed": 5})])
        env.reset(seed=11)
        return [env.step(0)[1] for _ in range(5)]

    assert rewards() == rewards()


def test_survival_reward_refunds_lander_fuel_and_pays_per_step():
    spec = WrapperSpec(kind="survival_reward", params={"bonus_per_step": 1.0, "fuel_scale": 0.0})
    env = make_env("LunarLander-v3", wrappers=[spec])
    env.reset(seed=0)
    _, r, _, _, info = env.step(2)  # main engine: LunarLander charges 0.30 fuel
    comps = info["reward_components"]
    assert comps["fuel_refund"] == pytest.approx(0.30)
    assert r == pytest.approx(info[ORIGINAL_REWARD_KEY] + 1.0 + 0.30)
    _, _, _, _, info = env.step(0)  # no-op costs nothing
    assert info["reward_components"]["fuel_refund"] == 0.0


def test_exploitable_shaping_pays_speed_on_mountaincar():
    env = make_env("MountainCar-v0", wrappers=[WrapperSpec(kind="exploitable_shaping", params={"coef": 100.0})])
    env.reset(seed=0)
    obs, r, _, _, info = env.step(2)
    assert r == pytest.approx(-1.0 + 100.0 * abs(obs[1]))
    assert info[ORIGINAL_REWARD_KEY] == -1.0


def test_sticky_actions_and_action_noise_are_seeded():
    for kind in ("sticky_actions", "action_noise"):

        def trace(kind=kind):
            env = make_env("Pendulum-v1", wrappers=[WrapperSpec(kind=kind, params={"seed": 2})], seed=4)
            return [float(env.step(np.array([x], dtype=np.float32))[0][0]) for x in np.linspace(-2, 2, 8)]

        assert trace() == trace()


def test_unknown_wrapper_kind_suggests():
    with pytest.raises(EnvError, match="did you mean 'obs_scale'"):
        make_env("CartPole-v1", wrappers=[WrapperSpec(kind="obs_scal")])
    assert {
        "obs_scale",
        "reward_scale",
        "reward_noise",
        "survival_reward",
        "exploitable_shaping",
        "time_limit",
        "action_noise",
        "sticky_actions",
    } <= set(WRAPPERS)
    with pytest.raises(EnvError, match="bad params"):
        apply_wrappers(gym.make("CartPole-v1"), [WrapperSpec(kind="obs_scale", params={"fctor": 2})])


def test_algorithm_registry():
    from sb3_contrib import TQC
    from stable_baselines3 import PPO

    assert get_algo("ppo") is PPO and get_algo("TQC") is TQC
    assert is_on_policy("PPO") and is_on_policy("recurrentppo") and not is_on_policy("SAC")
    with pytest.raises(AlgorithmError, match="did you mean 'PPO'"):
        get_algo("PP0")


def test_check_spaces_names_both_spaces():
    from stable_baselines3 import PPO

    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, policy_kwargs=dict(net_arch=[8]))
    check_spaces(model, make_env("CartPole-v1"))
    with pytest.raises(CheckpointError, match=r"observation space Box.*does not match the env's Box"):
        check_spaces(model, make_env("Pendulum-v1"))


def test_constraint_expressions_evaluate_and_refuse_hostile_code():
    c = Constraint(name="x_band", expr="abs(obs[0]) > 0.4 or np.max(np.abs(action)) > 2")
    test = c.compile()
    assert test(np.array([0.5, 0.0]), np.array([0.0])) and not test(np.array([0.1, 0.0]), np.array([1.0]))
    for bad in (
        "__import__('os')",
        "obs.__class__",
        "np.load('x')",
        "open('f')",
        "2 ** 10 ** 10",
        "[x for x in obs]",
        "lambda: 1",
        "np.linalg.norm(obs)",
    ):
        with pytest.raises(ValidationError):
            compile_constraint(bad)
    with pytest.raises(ValueError):  # pydantic wraps the refusal when a run.yaml declares it
        Constraint(name="bad", expr="exec('1')")


def test_setup_time_limit_is_training_only():
    """A too-short setup time limit is a training choice: evaluation uses the task's horizon."""
    spec = WrapperSpec(kind="time_limit", params={"max_episode_steps": 37})
    assert time_limit_of(make_env("Acrobot-v1", wrappers=[spec])) == 37
    assert time_limit_of(make_env("Acrobot-v1", wrappers=[spec], for_evaluation=True)) == 500
