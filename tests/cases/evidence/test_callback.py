"""RemedyRunCallback: one line in a training script writes a loadable run directory."""

from __future__ import annotations

import csv

import pytest
import torch
import yaml
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback, CallbackList
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize

from remedy.cases.errors import RunDirError
from remedy.cases.evidence.callback import RemedyRunCallback, infer_run_config
from remedy.cases.evidence.rollouts import collect_evidence
from remedy.cases.evidence.rundir import RunConfig, RunDir
from remedy.cases.success import ReturnThreshold

torch.set_num_threads(1)
TINY = dict(n_steps=64, batch_size=64, n_epochs=1, policy_kwargs=dict(net_arch=[16]), seed=0)


def test_inferred_config_and_files(cartpole_run):
    data = yaml.safe_load((cartpole_run / "run.yaml").read_text())
    assert data["env_id"] == "CartPole-v1" and data["algo"] == "PPO" and data["train_steps"] == 512
    assert data["success"] == {"kind": "return_threshold", "threshold": 475.0}
    assert data["hyperparams"]["n_steps"] == 64 and data["hyperparams"]["policy_kwargs"] == {"net_arch": [16]}
    assert "render_mode" not in data["env_kwargs"]
    with open(cartpole_run / "progress.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [float(r["time/total_timesteps"]) for r in rows] == [64.0 * i for i in range(1, 9)]
    assert rows[-1]["rollout/ep_rew_mean"] and rows[-1]["train/entropy_loss"]


class _SeesCheckpoint(BaseCallback):
    """Records whether model.zip existed at a given step (to test periodic saving)."""

    def __init__(self, path, at):
        super().__init__()
        self.path, self.at, self.seen = path, at, None

    def _on_step(self) -> bool:
        if self.num_timesteps == self.at:
            self.seen = self.path.exists()
        return True


def test_save_freq_and_vecnormalize(tmp_path):
    venv = VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=0))
    model = PPO("MlpPolicy", venv, **TINY)
    run_dir = tmp_path / "pend"
    config = RunConfig(env_id="Pendulum-v1", algo="PPO", n_envs=2, success=ReturnThreshold(threshold=-200))
    probe = _SeesCheckpoint(run_dir / "model.zip", at=200)
    model.learn(256, callback=CallbackList([RemedyRunCallback(run_dir, config, save_freq=128), probe]))
    assert probe.seen is True  # saved at 128 steps, before training ended
    run = RunDir.load(run_dir)
    assert run.vecnormalize_path is not None and run.config.train_steps == 256 and run.config.n_envs == 2
    assert run.config.normalize is True  # the VecNormalize wrapper is recorded in run.yaml
    bundle = collect_evidence(run, n_episodes=2, seed=0, stochastic=False)
    assert all(r.length == 200 for r in bundle.deterministic)  # Pendulum never terminates


def test_success_is_required_without_reward_threshold():
    model = PPO("MlpPolicy", "Pendulum-v1", **TINY)
    with pytest.raises(RunDirError, match="has no reward_threshold; pass success="):
        infer_run_config(model)
    config = infer_run_config(model, ReturnThreshold(threshold=-150))
    assert config.env_id == "Pendulum-v1" and config.algo == "PPO"


def test_off_policy_progress_rows_are_throttled(tmp_path):
    from stable_baselines3 import DQN

    model = DQN(
        "MlpPolicy", "CartPole-v1", learning_starts=100, train_freq=4, policy_kwargs=dict(net_arch=[16]), seed=0
    )
    model.learn(600, callback=RemedyRunCallback(tmp_path / "dqn", log_freq=200))
    with open(tmp_path / "dqn" / "progress.csv") as fh:
        steps = [float(r["time/total_timesteps"]) for r in csv.DictReader(fh)]
    assert 3 <= len(steps) <= 5 and steps[-1] == 600.0
    assert RunDir.load(tmp_path / "dqn").config.algo == "DQN"


def test_inferred_hyperparams_rebuild_the_algorithm():
    from stable_baselines3 import DQN

    model = DQN("MlpPolicy", "CartPole-v1", learning_starts=50, policy_kwargs=dict(net_arch=[8]), seed=0)
    hp = infer_run_config(model).hyperparams
    assert "use_sde" not in hp  # DQN keeps the attribute but its constructor refuses it
    DQN("MlpPolicy", "CartPole-v1", **hp)  # what training from run.yaml does
