"""train() with non-empty policy_kwargs for every supported algorithm, at tiny budgets.

SB3 writes into the dicts it is handed (A2C adds ``optimizer_class`` to ``policy_kwargs``); the
config must come out unchanged and the run directory must be written and load back.
"""

from __future__ import annotations

import copy

import pytest

from remedy.cases.algos import ALGOS
from remedy.cases.evidence.rundir import RunConfig, RunDir
from remedy.cases.success import parse_success
from remedy.cases.verify.training import train

_OFF_POLICY = {"learning_starts": 16, "buffer_size": 1_000, "batch_size": 16}
#: algorithm -> (env, hyperparameters); every one carries a non-empty policy_kwargs
SETUPS = {
    "PPO": ("CartPole-v1", {"n_steps": 32, "batch_size": 32, "n_epochs": 1, "policy_kwargs": {"net_arch": [8]}}),
    "A2C": ("CartPole-v1", {"n_steps": 8, "policy_kwargs": {"net_arch": [8]}}),
    "DQN": ("CartPole-v1", {**_OFF_POLICY, "policy_kwargs": {"net_arch": [8]}}),
    "QRDQN": ("CartPole-v1", {**_OFF_POLICY, "policy_kwargs": {"net_arch": [8], "n_quantiles": 5}}),
    "TRPO": ("CartPole-v1", {"n_steps": 32, "batch_size": 32, "policy_kwargs": {"net_arch": [8]}}),
    "ARS": ("CartPole-v1", {"n_delta": 2, "policy_kwargs": {"net_arch": [8]}}),
    "RecurrentPPO": (
        "CartPole-v1",
        {
            "policy": "MlpLstmPolicy",
            "n_steps": 32,
            "batch_size": 32,
            "n_epochs": 1,
            "policy_kwargs": {"net_arch": [8], "lstm_hidden_size": 8},
        },
    ),
    "SAC": ("Pendulum-v1", {**_OFF_POLICY, "policy_kwargs": {"net_arch": [8]}}),
    "TD3": ("Pendulum-v1", {**_OFF_POLICY, "policy_kwargs": {"net_arch": [8]}}),
    "DDPG": ("Pendulum-v1", {**_OFF_POLICY, "policy_kwargs": {"net_arch": [8]}}),
    "TQC": ("Pendulum-v1", {**_OFF_POLICY, "policy_kwargs": {"net_arch": [8], "n_critics": 2}}),
    "CrossQ": ("Pendulum-v1", {**_OFF_POLICY, "policy_kwargs": {"net_arch": [8]}}),
}


#: MaskablePPO trains only on envs that expose action masks, which no registered env here does
NEEDS_MASKS = {"MaskablePPO"}


def test_every_registered_algorithm_has_a_setup():
    assert set(SETUPS) | NEEDS_MASKS == set(ALGOS)


@pytest.mark.parametrize("algo", sorted(SETUPS))
def test_train_leaves_policy_kwargs_alone_and_writes_a_loadable_run(algo, tmp_path):
    env_id, hyper = SETUPS[algo]
    cfg = RunConfig(
        env_id=env_id,
        algo=algo,
        hyperparams=hyper,
        train_steps=64,
        n_envs=1,
        success=parse_success({"kind": "terminated", "survive": True}),
    )
    before = copy.deepcopy(cfg.hyperparams)
    run = train(cfg, tmp_path / "run", seed=0)
    assert cfg.hyperparams == before
    loaded = RunDir.load(run.path)
    assert loaded.config.hyperparams == before and loaded.config.algo == algo
    assert loaded.load_model().num_timesteps >= 64
