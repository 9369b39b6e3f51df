"""A confirmed fix hands back a fixed agent: ``<out>/fixed/`` with the confirmation's median-seed model.

The slow test runs the real fix loop (a scripted diagnoser, real SB3 fine-tunes in worker processes)
on a tiny CartPole patient trained at a learning rate too low to learn (1e-6), with a patch that
raises it: seeded fine-tunes make the confirmation ``improved`` every run (measured: treatment
success 0.87 vs control 0.03 on 3 confirmation seeds). The fixed agent's rollout on the original
task at the confirmation's evaluation seeds must give the figure the confirmation stored for that
seed, and ``remedy signature`` must accept the folder.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from remedy.cases.evidence.rundir import RunConfig, RunDir
from remedy.cases.model import Stage, Status, Verification
from remedy.cases.patches.apply import PatchPlan
from remedy.cases.patches.io import load_patch, save_patch
from remedy.cases.patches.kinds import PATCH_KINDS
from remedy.cases.patches.spec import Patch
from remedy.cases.verify.racing import RaceSettings
from remedy.cases.verify.verification import EVAL_BLOCK_STRIDE, VerifyConfig
from remedy.kb.cli import app as cli
from remedy.kb.fixed_agent import (
    FILES,
    FIXED_JSON,
    _controls,
    _Tuning,
    choose_seed,
    fixed_config,
    reproduce,
    sb3_snippet,
    zoo_fragment,
)
from remedy.kb.fixloop import fix, one_torch_thread

from .conftest import make_case
from .test_fixloop import Scripted

#: learns nothing at this rate: the control stays at the random policy, the raised rate learns in 2,048 steps
SLOW_LEARNER = RunConfig(
    env_id="CartPole-v1",
    algo="PPO",
    train_steps=512,
    n_envs=2,
    hyperparams={
        "n_steps": 64,
        "batch_size": 64,
        "n_epochs": 2,
        "learning_rate": 1e-6,
        "policy_kwargs": {"net_arch": [16]},
    },
    success={"kind": "return_threshold", "threshold": 60},
)
RAISE_LR = Patch.from_data({"kind": "hyperparameters", "changes": {"learning_rate": 0.003}})
CONFIRMING = VerifyConfig(seeds=2, confirm_seeds=3, budget_steps=2048, eval_episodes=10, n_envs=2, confidence=0.8)


def _with_seeds(values: list[float], seed_base: int = 4) -> object:
    v = Verification(
        status=Status.improved, per_seed={"treatment": values, "control": [0.0] * len(values)}, seed_base=seed_base
    )
    return make_case().model_copy(update={"verification": v})


def test_the_median_seed_is_handed_back():
    assert choose_seed(_with_seeds([0.2, 0.9, 0.5])) == (2, 6)  # ranked 0.2, 0.5, 0.9: the middle one
    assert choose_seed(_with_seeds([0.1, 0.4, 0.8, 0.9])) == (2, 6)  # even count: the upper median
    assert choose_seed(_with_seeds([1.0, 1.0, 1.0, 0.0])) == (1, 5)  # ties: the lower seed


def test_run_yaml_and_recipes_carry_the_patch():
    patch = Patch.from_data(
        {
            "parts": [
                {"kind": "hyperparameters", "changes": {"learning_rate": 0.001, "n_steps": 128}},
                {"kind": "time_limit", "max_episode_steps": 300},
                {"kind": "normalization", "obs": True, "reward": False},
                {"kind": "action_repeat", "n": 2},
            ]
        }
    )
    config = SLOW_LEARNER
    plan = _plan(patch)
    fixed = fixed_config(config, patch, model_zip=Path("/nonexistent.zip"), seed=7)  # no zip: train_steps kept
    assert fixed.hyperparams["learning_rate"] == 0.001 and fixed.hyperparams["n_steps"] == 128
    assert fixed.hyperparams["policy_kwargs"] == {"net_arch": [16]}  # the rest of the patient's setup stays
    assert [(w.kind, w.params) for w in fixed.wrappers] == [("time_limit", {"max_episode_steps": 300})]
    assert fixed.seed == 7 and fixed.max_episode_steps is None  # evaluation keeps the task's horizon
    assert "action repeat 2" in fixed.notes
    zoo = yaml.safe_load(zoo_fragment(config, patch, plan, {"learning_rate": 0.001, "n_steps": 128}, 4096))
    entry = zoo["CartPole-v1"]
    assert entry["n_timesteps"] == 4096 and entry["learning_rate"] == 0.001
    assert entry["normalize"] == str({"norm_obs": True, "norm_reward": False})
    assert {"gymnasium.wrappers.TimeLimit": {"max_episode_steps": 300}} in entry["env_wrapper"]
    script = sb3_snippet(config, patch, plan, {"learning_rate": 0.001}, _Tuning(4096, None, 8))
    compile(script, "apply_sb3.py", "exec")  # valid Python
    assert "VecNormalize(venv, norm_obs=True, norm_reward=False)" in script
    assert "make_patched_env_fn" in script and "total_timesteps=4096" in script


def test_the_agents_controls_come_from_the_patch_kind_registry(monkeypatch):
    """Which parts are part of how the fixed agent acts is asked of the registry (``PatchKind.controls``)."""
    patch = Patch.from_data(
        {"parts": [{"kind": "time_limit", "max_episode_steps": 300}, {"kind": "action_repeat", "n": 2}]}
    )
    assert _controls(patch) == ("action repeat 2",)
    assert _controls(RAISE_LR) == ()
    monkeypatch.setitem(PATCH_KINDS, "time_limit", dataclasses.replace(PATCH_KINDS["time_limit"], controls=True))
    assert _controls(patch) == (patch.parts[0].summary(), "action repeat 2")


def test_reproduce_rolls_the_agent_out_through_its_patchs_controls(tmp_path):
    """A fixed agent whose patch repeats actions is rolled out with that repeat (from patch.yaml and the
    registry), as the confirmation evaluated it: the shipped quick CartPole patient stands in for the agent."""
    from remedy.cases.evidence.rollouts import rollout
    from remedy.cases.patches.kinds import control_wrapper
    from remedy.cases.verify import stats
    from remedy.cases.verify.scenarios import CHECKPOINT_DIR

    source = CHECKPOINT_DIR / "cartpole_undertrained"
    folder = tmp_path / "fixed"
    folder.mkdir()
    for name in ("model.zip", "run.yaml"):
        shutil.copyfile(source / name, folder / name)
    repeat = Patch.from_data({"kind": "action_repeat", "n": 4})
    save_patch(repeat, folder / "patch.yaml")
    (folder / FIXED_JSON).write_text(json.dumps({"eval_episodes": 3, "eval_seed": 100, "metric": "return_iqm"}))
    run = RunDir.load(folder)

    def figure(wrap) -> float:
        records = rollout(
            run.load_model(),
            lambda: wrap(run.make_env(for_evaluation=True)),
            n_episodes=3,
            seed=100,
            success=run.config.success,
            keep_trajectories=0,
        )
        return float(stats.iqm([float(r.ret) for r in records]))

    with_repeat = figure(control_wrapper(repeat))
    assert with_repeat != figure(lambda env: env)  # the repeat changes the figure on this patient
    assert reproduce(folder) == pytest.approx(with_repeat)


def _plan(patch: Patch) -> PatchPlan:
    from remedy.cases.evidence.envs import env_traits

    return PatchPlan.from_patch(patch, env_traits("CartPole-v1", {}), "PPO")


@pytest.mark.slow
def test_a_confirmed_fix_leaves_a_loadable_agent_that_reproduces_its_figure(kb, tmp_path):
    from remedy.cases.verify.training import train

    one_torch_thread()
    patient = train(SLOW_LEARNER, tmp_path / "run", seed=0).path
    out = tmp_path / "fixes"
    result = fix(
        kb,
        patient,
        store=kb,
        rounds=1,
        candidates=1,
        diagnoser=Scripted([[RAISE_LR]]),
        config=CONFIRMING,
        out_dir=out,
        n_episodes=3,
        race=RaceSettings(enabled=False),
        confirmations=1,
    )
    screen, confirmation = result.attempts
    assert screen.passed_screen and confirmation.confirms == screen.case_id
    assert confirmation.stage == Stage.confirm.value and confirmation.status == Status.improved.value
    assert result.fixed_dir == out / "fixed" and result.as_dict()["fixed_dir"] == str(out / "fixed")
    folder = result.fixed_dir
    assert all((folder / name).is_file() for name in FILES)
    meta = json.loads((folder / FIXED_JSON).read_text())
    stored = kb.get(confirmation.case_id).verification
    index = meta["seed"] - stored.seed_base
    assert meta["case_id"] == confirmation.case_id and 0 <= index < stored.seeds
    assert (index, meta["seed"]) == choose_seed(kb.get(confirmation.case_id))
    assert meta["value"] == stored.per_seed["treatment"][index] and meta["metric"] == stored.effect.metric
    assert meta["eval_seed"] == stored.eval_seed + EVAL_BLOCK_STRIDE * index
    assert reproduce(folder) == pytest.approx(meta["value"])  # same agent, same episodes: same figure
    run = RunDir.load(folder)
    assert run.config.hyperparams["learning_rate"] == 0.003 and run.config.seed == meta["seed"]
    assert run.config.train_steps > SLOW_LEARNER.train_steps
    assert load_patch(folder / "patch.yaml") == RAISE_LR
    assert load_patch(result.patch_path) == RAISE_LR and result.patch_path.parent == out
    signature = CliRunner().invoke(cli, ["signature", str(folder), "--episodes", "2", "--json"])
    assert signature.exit_code == 0, signature.output
    assert "features" in json.loads(signature.output)


def test_fix_prints_where_the_fixed_agent_is(tmp_path, capsys):
    from remedy.cases.model import Effect
    from remedy.kb.cli.diagnose import _render_fix
    from remedy.kb.fixloop import AttemptRecord, FixResult

    effect = Effect(metric="success_rate", treatment=0.9, control=0.1, diff=0.8, ci_low=0.6, ci_high=1.0)
    winner = AttemptRecord(
        round=1,
        case_id="c-1",
        patch=RAISE_LR,
        family="hyperparameters",
        status="improved",
        effect=effect,
        env_steps=4096,
        wall_time_s=1.0,
        stage="confirm",
        fixed=True,
    )
    result = FixResult(
        run_dir=tmp_path,
        scenario=None,
        attempts=(winner,),
        diagnoses=(),
        rounds_used=1,
        winner=winner,
        patch_path=tmp_path / "p.yaml",
        fixed_dir=tmp_path / "fixed",
        env_steps_to_fix=4096,
        wall_time_to_fix_s=1.0,
        attempts_to_fix=1,
    )
    _render_fix(result)
    out = " ".join(capsys.readouterr().out.split())
    assert f"fixed agent: {tmp_path / 'fixed'}" in out and "README.txt says which seed and why" in out
