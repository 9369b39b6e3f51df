"""`adopt`: a bare SB3 zip, an RL Zoo log folder and a Hugging Face model folder become valid run directories.

One PPO CartPole agent (512 steps, net [8], VecNormalize, Monitor logs) is trained once for the module;
each test lays its files out the way SB3, RL Zoo or huggingface_sb3 would and adopts them.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from remedy.cases.errors import CheckpointError, RunDirError
from remedy.cases.evidence.adopt import adopt
from remedy.cases.evidence.foreign import load_zoo_yaml, parse_success_option
from remedy.cases.evidence.rundir import RunDir
from remedy.cases.success import FinalObs, InfoFlag, ReturnThreshold, Terminated

#: what RL Zoo's hyperparams/ppo.yml says for CartPole-v1 (net shrunk), as ExperimentManager saves it
ZOO_CONFIG = OrderedDict(
    sorted(
        {
            "batch_size": 64,
            "clip_range": "lin_0.2",
            "ent_coef": 0.0,
            "gae_lambda": 0.8,
            "gamma": 0.98,
            "learning_rate": "lin_0.001",
            "n_envs": 2,
            "n_epochs": 1,
            "n_steps": 128,
            "n_timesteps": 100000.0,
            "normalize": "dict(norm_obs=True, norm_reward=False)",
            "policy": "MlpPolicy",
            "policy_kwargs": "dict(net_arch=[8], activation_fn=nn.ReLU)",
        }.items()
    )
)
#: a slice of the argparse namespace RL Zoo's train.py saves as args.yml (sorted, as it does)
ZOO_ARGS = OrderedDict(
    sorted(
        {
            "algo": "ppo",
            "env": "CartPole-v1",
            "env_kwargs": None,
            "eval_freq": 25000,
            "hyperparams": None,
            "log_folder": "logs",
            "n_timesteps": 512,
            "seed": 7,
            "tensorboard_log": "",
            "trained_agent": "",
            "vec_env": "dummy",
        }.items()
    )
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(model zip, VecNormalize pickle, folder of Monitor CSVs) of one tiny normalized PPO CartPole run."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("trained")
    venv = VecNormalize(make_vec_env("CartPole-v1", n_envs=2, seed=0, monitor_dir=str(root / "monitor")))
    model = PPO("MlpPolicy", venv, n_steps=128, batch_size=64, n_epochs=1, policy_kwargs={"net_arch": [8]}, seed=0)
    model.learn(512)
    model.save(str(root / "agent.zip"))
    venv.save(str(root / "vecnormalize.pkl"))
    venv.close()
    return root / "agent.zip", root / "vecnormalize.pkl", root / "monitor"


def _zoo_folder(tmp_path: Path, trained, *, with_stats: bool = True) -> Path:
    """``logs/ppo/CartPole-v1_1/`` laid out as RL Zoo's ExperimentManager writes it."""
    model, stats, monitor = trained
    run = tmp_path / "logs" / "ppo" / "CartPole-v1_1"
    params = run / "CartPole-v1"
    params.mkdir(parents=True)
    shutil.copy(model, run / "CartPole-v1.zip")
    shutil.copy(model, run / "best_model.zip")
    for i, csv in enumerate(sorted(monitor.glob("*monitor.csv"))):
        shutil.copy(csv, run / f"{i}.monitor.csv")
    np.savez(
        run / "evaluations.npz",
        timesteps=np.array([256, 512]),
        results=np.array([[9.0, 11.0], [20.0, 22.0]]),
        ep_lengths=np.array([[9, 11], [20, 22]]),
    )
    (params / "config.yml").write_text(yaml.dump(ZOO_CONFIG))
    (params / "args.yml").write_text(yaml.dump(ZOO_ARGS))
    (params / "command.txt").write_text("python -m rl_zoo3.train --algo ppo --env CartPole-v1")
    if with_stats:
        shutil.copy(stats, params / "vecnormalize.pkl")
    return run


def _by_name(result) -> dict[str, object]:
    return {Path(f.path).name: f for f in result.files}


def test_zoo_yaml_is_written_with_ordered_dict_tags_and_read_without_them(tmp_path):
    path = tmp_path / "config.yml"
    path.write_text(yaml.dump(ZOO_CONFIG))
    assert "!!python/object/apply:collections.OrderedDict" in path.read_text()
    assert load_zoo_yaml(path) == dict(ZOO_CONFIG)


def test_zoo_yaml_refuses_other_python_objects(tmp_path):
    path = tmp_path / "args.yml"
    path.write_text("!!python/object/apply:os.system ['echo owned']\n")
    with pytest.raises(RunDirError, match="args.yml"):
        load_zoo_yaml(path)


def test_bare_zip_needs_env_and_reads_the_rest_from_the_checkpoint(tmp_path, trained):
    model, _, _ = trained
    elsewhere = tmp_path / "downloads" / "my_agent.zip"
    elsewhere.parent.mkdir()
    shutil.copy(model, elsewhere)
    with pytest.raises(RunDirError, match="--env"):
        adopt(elsewhere, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    result = adopt(elsewhere, tmp_path / "run", env_id="CartPole-v1")
    c = RunDir.load(tmp_path / "run").config
    assert (c.algo, c.env_id, c.train_steps, c.n_envs, c.seed) == ("PPO", "CartPole-v1", 512, 2, 0)
    assert c.hyperparams["n_steps"] == 128 and c.hyperparams["policy_kwargs"] == {"net_arch": [8]}
    assert c.hyperparams["policy"] == "MlpPolicy"
    assert c.success == ReturnThreshold(threshold=475.0)
    assert "clip_range" in c.notes  # a pickled schedule, named as not read
    assert result.layout == "zip" and [f.role for f in result.files] == ["checkpoint"]


def test_zoo_folder_reads_config_args_and_copies_stats_and_logs(tmp_path, trained):
    run = _zoo_folder(tmp_path, trained)
    result = adopt(run, tmp_path / "out")
    rd = RunDir.load(tmp_path / "out")
    c = rd.config
    assert result.layout == "zoo"
    assert (c.algo, c.env_id, c.seed, c.n_envs, c.train_steps) == ("PPO", "CartPole-v1", 0, 2, 512)
    assert rd.vecnormalize_path is not None and rd.vecnormalize_path.read_bytes() == trained[1].read_bytes()
    assert "normalize" in c.notes or getattr(c, "normalize", False) is True
    assert len(rd.monitor_files) == 2
    assert (tmp_path / "out" / "logs" / "evaluations.npz").is_file()
    files = _by_name(result)
    assert files["CartPole-v1.zip"].role == "checkpoint"
    assert not files["best_model.zip"].used and "best" in files["best_model.zip"].note
    assert files["config.yml"].used and "norm_obs" in files["config.yml"].note
    assert files["args.yml"].used and files["vecnormalize.pkl"].copied_to == "vecnormalize.pkl"
    assert "last mean return 21" in files["evaluations.npz"].note
    assert not files["command.txt"].used and "command line" in files["command.txt"].note


def test_zoo_best_model_is_adopted_when_pointed_at(tmp_path, trained):
    run = _zoo_folder(tmp_path, trained)
    result = adopt(run / "best_model.zip", tmp_path / "out")
    assert result.layout == "zoo" and Path(result.files[0].path).name == "best_model.zip"
    assert RunDir.load(tmp_path / "out").vecnormalize_path is not None


def test_zoo_folder_that_normalized_without_stats_is_refused(tmp_path, trained):
    run = _zoo_folder(tmp_path, trained, with_stats=False)
    with pytest.raises(RunDirError, match="VecNormalize.*vecnormalize.pkl"):
        adopt(run, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_hugging_face_folder(tmp_path, trained):
    model, stats, _ = trained
    hub = tmp_path / "ppo-CartPole-v1"
    hub.mkdir()
    shutil.copy(model, hub / "ppo-CartPole-v1.zip")
    shutil.copy(stats, hub / "vec_normalize.pkl")
    with zipfile.ZipFile(model) as zf:
        (hub / "config.json").write_bytes(zf.read("data"))
        zf.extractall(hub / "ppo-CartPole-v1")  # huggingface_sb3 leaves the zip unpacked beside it
    (hub / "results.json").write_text(json.dumps({"mean_reward": 20.0, "std_reward": 1.0}))
    card = {
        "library_name": "stable-baselines3",
        "tags": ["CartPole-v1", "deep-reinforcement-learning", "reinforcement-learning", "stable-baselines3"],
        "model-index": [
            {
                "name": "PPO",
                "results": [
                    {
                        "task": {"type": "reinforcement-learning", "name": "reinforcement-learning"},
                        "dataset": {"name": "CartPole-v1", "type": "CartPole-v1"},
                        "metrics": [{"type": "mean_reward", "value": "20.00 +/- 1.00", "name": "mean_reward"}],
                    }
                ],
            }
        ],
    }
    (hub / "README.md").write_text(
        f"---\n{yaml.safe_dump(card)}---\n\n# **PPO** Agent playing **CartPole-v1**\n"
        "This is a trained model of a **PPO** agent playing **CartPole-v1**\n"
    )
    result = adopt(hub, tmp_path / "out")
    rd = RunDir.load(tmp_path / "out")
    assert result.layout == "huggingface" and (rd.config.algo, rd.config.env_id) == ("PPO", "CartPole-v1")
    assert rd.vecnormalize_path is not None
    files = _by_name(result)
    assert files["README.md"].used and not files["config.json"].used and not files["results.json"].used
    assert "unpacked copy" in files["policy.pth"].note and not files["policy.pth"].used


def test_env_without_reward_threshold_asks_for_success(tmp_path, trained):
    with pytest.raises(RunDirError, match="no reward_threshold.*--success.*return>="):
        adopt(trained[0], tmp_path / "out", env_id="Pendulum-v1")
    assert not (tmp_path / "out").exists()


def test_success_option_forms():
    assert parse_success_option("return >= 200") == ReturnThreshold(threshold=200)
    assert parse_success_option("info:is_success") == InfoFlag(key="is_success")
    assert parse_success_option("obs[0]>=0.45") == FinalObs(index=0, value=0.45)
    assert parse_success_option("survive") == Terminated(survive=True)
    assert parse_success_option("{kind: return_threshold, threshold: -200}") == ReturnThreshold(threshold=-200)
    with pytest.raises(RunDirError, match="accepted"):
        parse_success_option("lands softly")


def test_algorithm_from_checkpoint_conflicts_with_declared(tmp_path, trained):
    with pytest.raises(CheckpointError, match="saved by PPO, but --algo says DQN"):
        adopt(trained[0], tmp_path / "out", env_id="CartPole-v1", algo="DQN")
    assert not (tmp_path / "out").exists()


def test_non_empty_out_is_refused(tmp_path, trained):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(RunDirError, match="not empty"):
        adopt(trained[0], tmp_path / "out", env_id="CartPole-v1")
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_zip_that_is_not_a_checkpoint_is_refused(tmp_path):
    # zip bombs are refused by checkpoint.check_zip (tests/cases/evidence/test_checkpoint_safety.py)
    other = tmp_path / "photos.zip"
    with zipfile.ZipFile(other, "w") as zf:
        zf.writestr("cat.jpg", b"\xff\xd8")
    with pytest.raises(CheckpointError, match="no 'data' entry"):
        adopt(other, tmp_path / "out", env_id="CartPole-v1")
    assert not (tmp_path / "out").exists()


def test_env_with_other_space_types_is_refused_before_writing(tmp_path, trained):
    with pytest.raises(CheckpointError, match="Discrete action space, but Pendulum-v1 has a Box one"):
        adopt(trained[0], tmp_path / "out", env_id="Pendulum-v1", success="return>=-200")
    assert not (tmp_path / "out").exists()


def test_zoo_normalize_string_is_parsed_never_evaluated(tmp_path, trained):
    run = _zoo_folder(tmp_path, trained)
    marker = tmp_path / "evaluated"
    config = dict(ZOO_CONFIG, normalize=f"__import__('pathlib').Path('{marker}').touch()")
    (run / "CartPole-v1" / "config.yml").write_text(yaml.dump(OrderedDict(sorted(config.items()))))
    result = adopt(run, tmp_path / "out")
    assert not marker.exists()
    assert "not evaluated" in _by_name(result)["config.yml"].note
    assert RunDir.load(tmp_path / "out").vecnormalize_path is not None  # a truthy string means it was on


def test_zoo_model_on_the_hub_with_its_metrics_archive(tmp_path, trained):
    """rl_zoo3's push_to_hub folder: config/args at the top, vec_normalize.pkl, logs packed in a zip."""
    model, stats, monitor = trained
    hub = tmp_path / "ppo-CartPole-v1"
    hub.mkdir()
    shutil.copy(model, hub / "ppo-CartPole-v1.zip")
    shutil.copy(stats, hub / "vec_normalize.pkl")
    (hub / "config.yml").write_text(yaml.dump(ZOO_CONFIG))
    (hub / "args.yml").write_text(yaml.dump(ZOO_ARGS))
    (hub / "env_kwargs.yml").write_text(yaml.dump({}))
    csv = sorted(monitor.glob("*monitor.csv"))[0].read_bytes()
    with zipfile.ZipFile(hub / "train_eval_metrics.zip", "w") as zf:
        zf.writestr("0.monitor.csv", csv)
        zf.writestr("../../escaped.monitor.csv", csv)  # folders in a name are dropped: it lands inside
        zf.writestr("notes.txt", "not a log")
    result = adopt(hub, tmp_path / "out")
    rd = RunDir.load(tmp_path / "out")
    assert result.layout == "huggingface" and (rd.config.algo, rd.config.env_id) == ("PPO", "CartPole-v1")
    assert rd.vecnormalize_path is not None and len(rd.monitor_files) == 2
    assert not (tmp_path / "escaped.monitor.csv").exists() and not (tmp_path / "out" / "notes.txt").exists()
    assert _by_name(result)["train_eval_metrics.zip"].used


def test_off_policy_hyperparams_are_constructor_arguments(tmp_path):
    """SB3 saves DQN attributes its constructor refuses (use_sde); run.yaml must build the algorithm again."""
    from stable_baselines3 import DQN

    from remedy.cases.evidence.envs import make_env

    torch.set_num_threads(1)
    model = DQN("MlpPolicy", "CartPole-v1", learning_starts=50, buffer_size=500, policy_kwargs={"net_arch": [8]})
    model.learn(100)
    model.save(str(tmp_path / "dqn.zip"))
    config = adopt(tmp_path / "dqn.zip", tmp_path / "out", env_id="CartPole-v1").config
    assert config.algo == "DQN" and config.hyperparams["buffer_size"] == 500 and "use_sde" not in config.hyperparams
    hyper = dict(config.hyperparams)
    DQN(hyper.pop("policy"), make_env("CartPole-v1"), **hyper)  # what training from scratch does


def test_zoo_yaml_reads_ordered_dicts_and_stops_an_alias_bomb(tmp_path):
    from remedy.cases.evidence.foreign import load_zoo_yaml
    from remedy.cases.yamlfile import MAX_YAML_ALIASES, BoundedLoader

    ok = tmp_path / "config.yml"
    ok.write_text(
        "!!python/object/apply:collections.OrderedDict\n- - - n_timesteps\n    - 1000\n  - - policy\n    - MlpPolicy\n"
    )
    assert load_zoo_yaml(ok) == {"n_timesteps": 1000, "policy": "MlpPolicy"}
    bomb = tmp_path / "args.yml"
    bomb.write_text("a: &x [1]\n" + "".join(f"k{i}: *x\n" for i in range(MAX_YAML_ALIASES + 1)))
    with pytest.raises(RunDirError, match="aliases"):
        load_zoo_yaml(bomb)
    assert "tag:yaml.org,2002:python/tuple" not in BoundedLoader.yaml_constructors  # Zoo's tags stay Zoo's
