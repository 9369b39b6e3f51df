"""train() and finetune() on a tiny CartPole run (a few hundred steps, tiny nets)."""

from __future__ import annotations

import json
import pickle
import shutil

import pytest

from remedy.cases.errors import PatchRejectedError
from remedy.cases.evidence.rundir import RunConfig, RunDir
from remedy.cases.patches import Patch
from remedy.cases.success import parse_success
from remedy.cases.verify.training import FinetuneResult, arm_budgets, finetune, train

HYPER = {"n_steps": 32, "batch_size": 64, "n_epochs": 2, "policy_kwargs": {"net_arch": [16]}}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> RunDir:
    cfg = RunConfig(
        env_id="CartPole-v1",
        algo="PPO",
        hyperparams=HYPER,
        train_steps=256,
        n_envs=4,
        success=parse_success({"kind": "terminated", "survive": True}),
    )
    return train(cfg, tmp_path_factory.mktemp("tiny") / "run", seed=0)


def test_train_writes_a_loadable_run_dir_with_logs(tiny_run):
    run = RunDir.load(tiny_run.path)
    assert run.config.seed == 0 and run.monitor_files
    assert run.load_model().num_timesteps == 256


def test_control_finetune_learns_the_budget_and_writes_a_loadable_model(tiny_run, tmp_path):
    res = finetune(str(tiny_run.path), None, budget_steps=256, seed=1, n_envs=4, out_dir=str(tmp_path / "c"))
    assert isinstance(res, FinetuneResult) and not res.diverged
    assert res.env_steps == 256
    model = RunDir.load(res.run_dir).load_model()
    assert model.num_timesteps == 256 + 256
    assert res.shaped_return_mean == pytest.approx(res.original_return_mean_train)
    assert pickle.loads(pickle.dumps(res)) == res


def test_hyperparameter_and_normalization_patches_reach_the_model(tiny_run, tmp_path):
    patch = {
        "parts": [
            {"kind": "hyperparameters", "changes": {"learning_rate": 0.0123, "ent_coef": 0.05}},
            {"kind": "normalization", "obs": True, "reward": False},
        ]
    }
    res = finetune(
        str(tiny_run.path), json.dumps(patch), budget_steps=128, seed=1, n_envs=4, out_dir=str(tmp_path / "t")
    )
    run = RunDir.load(res.run_dir)
    model = run.load_model()
    assert model.learning_rate == pytest.approx(0.0123) and model.ent_coef == pytest.approx(0.05)
    assert run.vecnormalize_path is not None  # the patched agent carries its normalization statistics


def test_budget_patch_treatment_learns_extra_steps_and_control_is_the_checkpoint(tiny_run, tmp_path):
    patch = Patch.from_data({"kind": "training_budget", "extra_steps": 128})
    t_budget, c_budget = arm_budgets(patch, 1000)
    assert (t_budget, c_budget) == (0, 0)
    treat = finetune(
        str(tiny_run.path),
        patch.model_dump_json(),
        budget_steps=t_budget,
        seed=2,
        n_envs=4,
        out_dir=str(tmp_path / "t"),
    )
    ctrl = finetune(str(tiny_run.path), None, budget_steps=c_budget, seed=2, out_dir=str(tmp_path / "c"))
    assert treat.env_steps == 128 and ctrl.env_steps == 0
    assert RunDir.load(ctrl.run_dir).checkpoint_sha256() == tiny_run.checkpoint_sha256()


def test_count_bonus_makes_the_shaped_return_exceed_the_original(tiny_run, tmp_path):
    patch = {"kind": "exploration_bonus", "count_bonus": 1.0}
    res = finetune(
        str(tiny_run.path), json.dumps(patch), budget_steps=128, seed=1, n_envs=4, out_dir=str(tmp_path / "b")
    )
    assert res.shaped_return_mean > res.original_return_mean_train


def test_frame_stack_refused_for_finetuning(tiny_run, tmp_path):
    with pytest.raises(PatchRejectedError) as err:
        finetune(
            str(tiny_run.path),
            json.dumps({"kind": "frame_stack", "n": 4}),
            budget_steps=64,
            seed=0,
            out_dir=str(tmp_path / "f"),
        )
    assert err.value.rule == "frame_stack_needs_fresh_policy"


def test_divergence_is_reported_not_raised(tiny_run, tmp_path):
    # a NaN training reward drives the loss and then the parameters to NaN
    text = (tiny_run.path / "run.yaml").read_text()
    assert "wrappers: []" in text
    src = tmp_path / "nan_run"
    src.mkdir()
    (src / "run.yaml").write_text(
        text.replace("wrappers: []", "wrappers: [{kind: reward_scale, params: {factor: .nan}}]")
    )
    shutil.copyfile(tiny_run.model_path, src / "model.zip")
    res = finetune(str(src), None, budget_steps=512, seed=0, n_envs=4, out_dir=str(tmp_path / "d"))
    assert res.diverged and res.reason.startswith("training diverged")


def test_off_policy_finetune_starts_with_an_empty_buffer(tmp_path):
    cfg = RunConfig(
        env_id="CartPole-v1",
        algo="DQN",
        train_steps=200,
        n_envs=1,
        hyperparams={"learning_starts": 50, "buffer_size": 1000, "policy_kwargs": {"net_arch": [16]}},
        success=parse_success({"kind": "terminated", "survive": True}),
    )
    run = train(cfg, tmp_path / "dqn", seed=0)
    res = finetune(str(run.path), None, budget_steps=200, seed=1, n_envs=8, out_dir=str(tmp_path / "ft"))
    assert res.env_steps == 200 and not res.diverged
    assert any("replay buffer starts empty" in n for n in res.notes)
    assert RunDir.load(res.run_dir).load_model().num_timesteps == 400


def test_checkpoint_whose_spaces_disagree_is_a_clear_error(tiny_run, tmp_path):
    from remedy.cases.errors import CheckpointError

    src = tmp_path / "wrong_env"
    src.mkdir()
    (src / "run.yaml").write_text((tiny_run.path / "run.yaml").read_text().replace("CartPole-v1", "Acrobot-v1"))
    shutil.copyfile(tiny_run.model_path, src / "model.zip")
    with pytest.raises(CheckpointError, match="does not match"):
        finetune(str(src), None, budget_steps=64, seed=0, n_envs=2, out_dir=str(tmp_path / "o"))


def test_progress_counts_from_the_start_of_the_finetune(tiny_run, tmp_path):
    seen: list[tuple[int, int]] = []
    finetune(
        str(tiny_run.path),
        None,
        budget_steps=256,
        seed=0,
        n_envs=4,
        out_dir=str(tmp_path / "p"),
        progress=lambda done, total: seen.append((done, total)),
    )
    assert seen and seen[-1] == (256, 256)
    assert all(0 <= d <= t for d, t in seen)
