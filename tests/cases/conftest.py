"""Shared fixtures for tests/cases: one tiny real training run, written by RemedyRunCallback."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def cartpole_run(tmp_path_factory):
    """A run directory of PPO on CartPole trained 512 steps (tiny net), with Monitor logs and progress.csv.

    Written through :class:`RemedyRunCallback` with no config, so it also exercises inference.
    """
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    from remedy.cases.evidence.callback import RemedyRunCallback

    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("runs") / "cartpole"
    venv = make_vec_env("CartPole-v1", n_envs=1, seed=0, monitor_dir=str(path / "monitor"))
    model = PPO("MlpPolicy", venv, n_steps=64, batch_size=64, n_epochs=2, policy_kwargs=dict(net_arch=[16]), seed=0)
    model.learn(512, callback=RemedyRunCallback(path))
    return path
