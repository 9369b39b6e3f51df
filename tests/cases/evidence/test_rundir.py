"""Run directories: loading, validation errors, writing, subjects."""

from __future__ import annotations

import hashlib
import shutil

import pytest
import yaml

from remedy.cases.errors import CheckpointError, EnvError, RunDirError
from remedy.cases.evidence.rundir import RunConfig, RunDir, write_run_dir
from remedy.cases.evidence.wrappers import WrapperSpec
from remedy.cases.success import ReturnThreshold


@pytest.fixture
def run_copy(cartpole_run, tmp_path):
    """A private copy of the shared CartPole run that a test may break."""
    dst = tmp_path / "run"
    shutil.copytree(cartpole_run, dst)
    return dst


def _edit_yaml(path, **changes):
    data = yaml.safe_load((path / "run.yaml").read_text())
    data.update(changes)
    (path / "run.yaml").write_text(yaml.safe_dump(data))


def test_load_valid_run(cartpole_run):
    run = RunDir.load(cartpole_run)
    assert run.config.env_id == "CartPole-v1" and run.config.algo == "PPO"
    assert run.config.success == ReturnThreshold(threshold=475.0)
    assert run.monitor_files and run.progress_files and run.vecnormalize_path is None
    subject = run.subject()
    assert subject.checkpoint_sha256 == hashlib.sha256(run.model_path.read_bytes()).hexdigest()
    assert subject.traits.obs_dim == 4 and subject.success == "return >= 475"


def test_load_model_checks_spaces_and_takes_overrides(cartpole_run):
    run = RunDir.load(cartpole_run)
    model = run.load_model(learning_rate=1e-4)
    assert model.observation_space.shape == (4,) and model.learning_rate == 1e-4


def test_not_a_run_dir(tmp_path):
    with pytest.raises(RunDirError, match="does not exist"):
        RunDir.load(tmp_path / "nope")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(RunDirError, match="is not a directory"):
        RunDir.load(tmp_path / "file.txt")
    with pytest.raises(RunDirError, match="has no run.yaml"):
        RunDir.load(tmp_path)


def test_invalid_yaml_and_invalid_field(run_copy):
    (run_copy / "run.yaml").write_text("env_id: [unclosed\n")
    with pytest.raises(RunDirError, match="not valid YAML"):
        RunDir.load(run_copy)
    (run_copy / "run.yaml").write_text(
        yaml.safe_dump(
            {
                "env_id": "CartPole-v1",
                "algo": "PPO",
                "success": {"kind": "return_threshold", "threshold": 1},
                "n_envs": 0,
            }
        )
    )
    with pytest.raises(RunDirError, match="field 'n_envs'"):
        RunDir.load(run_copy)


def test_unknown_field_and_unknown_algo_are_named(run_copy):
    _edit_yaml(run_copy, learning_rat=0.1)
    with pytest.raises(RunDirError, match="field 'learning_rat': Extra inputs"):
        RunDir.load(run_copy)
    data = yaml.safe_load((run_copy / "run.yaml").read_text())
    del data["learning_rat"]
    data["algo"] = "PP0"
    (run_copy / "run.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(RunDirError, match="field 'algo'.*did you mean 'PPO'"):
        RunDir.load(run_copy)


def test_unknown_env_id_suggests(run_copy):
    _edit_yaml(run_copy, env_id="CartPol-v1")
    with pytest.raises(EnvError, match="did you mean 'CartPole-v1'"):
        RunDir.load(run_copy)


def test_missing_and_corrupt_checkpoint(run_copy):
    data = (run_copy / "model.zip").read_bytes()
    (run_copy / "model.zip").unlink()
    with pytest.raises(CheckpointError, match="model.zip is missing"):
        RunDir.load(run_copy)
    (run_copy / "model.zip").write_bytes(b"\x00garbage" * 100)
    with pytest.raises(CheckpointError, match="not a zip file"):
        RunDir.load(run_copy)
    (run_copy / "model.zip").write_bytes(data[: len(data) // 2])  # truncated download
    with pytest.raises(CheckpointError):
        RunDir.load(run_copy).load_model()


def test_checkpoint_env_space_mismatch(run_copy):
    _edit_yaml(run_copy, env_id="Pendulum-v1", env_kwargs={})
    run = RunDir.load(run_copy)
    with pytest.raises(CheckpointError, match="does not match the env's"):
        run.load_model()


def test_wrong_algorithm_for_checkpoint(run_copy):
    _edit_yaml(run_copy, algo="DQN")
    with pytest.raises(CheckpointError, match="was saved by PPO, but .* declares algo: DQN"):
        RunDir.load(run_copy).load_model()


def test_write_run_dir_round_trips_wrappers_and_constraints(cartpole_run, tmp_path):
    model = RunDir.load(cartpole_run).load_model()
    config = RunConfig(
        env_id="CartPole-v1",
        algo="ppo",
        train_steps=512,
        success={"kind": "terminated", "survive": True},
        wrappers=[WrapperSpec(kind="reward_scale", params={"factor": 0.5})],
        constraints=[{"name": "centre", "expr": "abs(obs[0]) > 1.0"}],
        max_episode_steps=100,
    )
    run = write_run_dir(tmp_path / "w", model, config)
    again = RunDir.load(run.path)
    assert again.config == config and again.config.algo == "PPO"
    env = again.make_env()
    env.reset(seed=0)
    assert env.step(0)[1] == 0.5
    ev = again.make_env(for_evaluation=True, seed=0)
    assert ev.step(0)[1] == 1.0  # the evaluation view pays the original reward


def test_unknown_wrapper_kind_in_run_yaml_is_named(run_copy):
    _edit_yaml(run_copy, wrappers=[{"kind": "reward_scal", "params": {"factor": 2}}])
    with pytest.raises(RunDirError, match=r"field 'wrappers.0.kind'.*did you mean 'reward_scale'"):
        RunDir.load(run_copy)


def test_subject_describes_reward_setup(run_copy):
    _edit_yaml(
        run_copy,
        wrappers=[{"kind": "reward_scale", "params": {"factor": 2}}, {"kind": "obs_scale", "params": {"factor": 3}}],
    )
    assert RunDir.load(run_copy).subject().reward_ref == "env reward with reward_scale(factor=2)"
