"""Never roll out a normalized agent unnormalized (issue 30, item 2).

A tiny PPO CartPole trained under VecNormalize is saved with its statistics in each
common place; the signature (the existing API) must roll it out with them, frozen.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import yaml

from remedy.cases.errors import CheckpointError, RunDirError
from remedy.cases.evidence.rundir import RunConfig, RunDir, write_run_yaml
from remedy.cases.evidence.signature import signature_of_run
from remedy.cases.success import ReturnThreshold


@pytest.fixture(scope="module")
def normalized_agent(tmp_path_factory):
    """model.zip and vecnormalize.pkl of PPO on CartPole trained 256 steps under VecNormalize (tiny net)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("normalized")
    venv = VecNormalize(make_vec_env("CartPole-v1", n_envs=1, seed=0))
    model = PPO("MlpPolicy", venv, n_steps=64, batch_size=64, n_epochs=1, policy_kwargs=dict(net_arch=[8]), seed=0)
    model.learn(256)
    model.save(str(out / "model.zip"))
    venv.save(str(out / "stats.pkl"))
    return out


def _run_dir(tmp_path, agent, stats_at: str | None, **fields):
    path = tmp_path / "run"
    config = RunConfig(env_id="CartPole-v1", algo="PPO", success=ReturnThreshold(threshold=195.0), **fields)
    write_run_yaml(path, config)
    shutil.copy(agent / "model.zip", path / "model.zip")
    if stats_at is not None:
        (path / stats_at).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(agent / "stats.pkl", path / stats_at)
    return path


@pytest.fixture
def spy(monkeypatch):
    """Records each VecNormalize a run loads and counts observations normalized with it."""
    from stable_baselines3.common.vec_env import VecNormalize

    seen: dict = {"loaded": [], "normalized": 0}
    load = RunDir.load_vecnormalize
    normalize_obs = VecNormalize.normalize_obs

    def loading(self, venv, **kw):
        vn = load(self, venv, **kw)
        seen["loaded"].append(vn)
        return vn

    def normalizing(self, obs):
        seen["normalized"] += 1
        return normalize_obs(self, obs)

    monkeypatch.setattr(RunDir, "load_vecnormalize", loading)
    monkeypatch.setattr(VecNormalize, "normalize_obs", normalizing)
    return seen


@pytest.mark.parametrize(
    "stats_at",
    ["vecnormalize.pkl", "vec_normalize.pkl", "CartPole-v1/vecnormalize.pkl", "CartPole-v1/vec_normalize.pkl"],
)
def test_signature_rolls_out_with_stats_from_each_common_location(tmp_path, normalized_agent, spy, stats_at):
    from stable_baselines3.common.vec_env import VecNormalize

    path = _run_dir(tmp_path, normalized_agent, stats_at)
    assert RunDir.load(path).vecnormalize_path == path / stats_at
    signature_of_run(path, n_episodes=2, seed=0)
    saved = VecNormalize.load(str(normalized_agent / "stats.pkl"), _dummy_venv())
    assert spy["loaded"], "the signature rolled out without loading the statistics"
    vn = spy["loaded"][0]
    assert np.allclose(vn.obs_rms.mean, saved.obs_rms.mean) and np.allclose(vn.obs_rms.var, saved.obs_rms.var)
    assert vn.training is False and vn.norm_reward is False  # evaluated as SB3 says: frozen, raw rewards
    assert spy["normalized"] > 0  # and the observations went through it


def _dummy_venv():
    import gymnasium as gym
    from stable_baselines3.common.vec_env import DummyVecEnv

    return DummyVecEnv([lambda: gym.make("CartPole-v1")])


def test_vecnormalize_field_names_another_file(tmp_path, normalized_agent, spy):
    path = _run_dir(
        tmp_path, normalized_agent, "norm/stats_final.pkl", vecnormalize="norm/stats_final.pkl", normalize=True
    )
    assert RunDir.load(path).vecnormalize_path == path / "norm/stats_final.pkl"
    signature_of_run(path, n_episodes=1, seed=0)
    assert spy["loaded"] and spy["normalized"] > 0


def test_declared_normalization_without_stats_is_refused_naming_where_it_looked(tmp_path, normalized_agent):
    path = _run_dir(tmp_path, normalized_agent, None, normalize=True)
    with pytest.raises(RunDirError) as err:
        signature_of_run(path, n_episodes=1)
    msg = str(err.value)
    assert "\n" not in msg
    for where in (
        "vecnormalize.pkl",
        "vec_normalize.pkl",
        "CartPole-v1/vecnormalize.pkl",
        "CartPole-v1/vec_normalize.pkl",
    ):
        assert where in msg
    assert "normalize: false" in msg and "vecnormalize: PATH" in msg


def test_stats_outside_the_run_directory_are_not_read(tmp_path, normalized_agent):
    path = _run_dir(tmp_path, normalized_agent, None, vecnormalize="../stats.pkl", normalize=True)
    shutil.copy(normalized_agent / "stats.pkl", tmp_path / "stats.pkl")
    with pytest.raises(RunDirError, match="normalize: true"):
        RunDir.load(path)


def test_normalize_false_rolls_out_raw_on_purpose(tmp_path, normalized_agent, spy):
    path = _run_dir(tmp_path, normalized_agent, "vecnormalize.pkl", normalize=False)
    assert RunDir.load(path).vecnormalize_path is None
    signature_of_run(path, n_episodes=1, seed=0)
    assert not spy["loaded"]


def test_stats_found_but_unloadable_are_refused(tmp_path, normalized_agent):
    path = _run_dir(tmp_path, normalized_agent, "CartPole-v1/vecnormalize.pkl")
    (path / "CartPole-v1/vecnormalize.pkl").write_bytes(b"not a pickle at all")
    with pytest.raises(CheckpointError, match="vecnormalize.pkl"):
        signature_of_run(path, n_episodes=1)


def test_normalize_field_round_trips_through_run_yaml(tmp_path, normalized_agent):
    path = _run_dir(tmp_path, normalized_agent, "vecnormalize.pkl", normalize=True)
    assert yaml.safe_load((path / "run.yaml").read_text())["normalize"] is True
    assert RunDir.load(path).config.normalize is True
