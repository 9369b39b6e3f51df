"""Shared control arms (issue 9, part 1): a second candidate at the same budget trains no new control.

Real fine-tunes of a tiny CartPole PPO patient in worker processes (1k steps, 2 envs, 5
evaluation episodes), counted by a recording executor wrapped around the local one.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from remedy.cases.evidence.rundir import RunConfig
from remedy.cases.patches.spec import Patch
from remedy.cases.verify.arms import ARM_JOB, EVAL_JOB, ArmSpec
from remedy.cases.verify.controls import ControlCache, code_version, control_key
from remedy.cases.verify.executors import LocalExecutor
from remedy.cases.verify.verification import VerifyConfig, verify_patch

PATIENT = RunConfig(
    env_id="CartPole-v1",
    algo="PPO",
    train_steps=3000,
    n_envs=4,
    hyperparams={"n_steps": 64, "batch_size": 64, "n_epochs": 2, "policy_kwargs": {"net_arch": [32, 32]}},
    success={"kind": "return_threshold", "threshold": 100},
)
TINY = dict(seeds=2, budget_steps=1000, eval_episodes=5, n_envs=2)
LR = Patch.from_data({"parts": [{"kind": "hyperparameters", "changes": {"learning_rate": 0.001}}]})
ENT = Patch.from_data({"parts": [{"kind": "hyperparameters", "changes": {"ent_coef": 0.01}}]})
SHAPED = Patch.from_data(
    {
        "parts": [
            {
                "kind": "reward_shaping",
                "description": "original reward plus a small bonus for an upright pole",
                "code": (
                    "def shaped_reward(obs, action, reward, next_obs, terminated, truncated, info):\n"
                    "    return float(reward) + 0.1 * (1.0 - min(1.0, abs(float(next_obs[2])) / 0.21))\n"
                ),
            }
        ]
    }
)

#: a control arm's spec, for the key tests
CONTROL = ArmSpec(
    arm="control",
    seed=0,
    run_dir="/x",
    patch_json=None,
    budget_steps=1000,
    n_envs=2,
    learning_rate=None,
    eval_episodes=5,
    eval_seed=10_000,
    out_dir="/tmp/a",
)


class Recording(LocalExecutor):
    """The local executor, remembering which job function each job ran."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str]] = []

    def run(self, jobs, progress=None):
        self.seen += [(j.id, j.fn) for j in jobs]
        return super().run(jobs, progress=progress)


@pytest.fixture(scope="module")
def patient(tmp_path_factory):
    from remedy.cases.verify.training import train

    return train(PATIENT, tmp_path_factory.mktemp("patient") / "run", seed=0).path


def _trained_controls(ex: Recording) -> list[str]:
    return [jid for jid, fn in ex.seen if jid.startswith("control") and fn == ARM_JOB]


def test_second_candidate_at_the_same_budget_trains_no_new_control(patient, tmp_path):
    cache = str(tmp_path / "controls")
    config = VerifyConfig(**TINY, control_cache=cache)
    ex = Recording()
    try:
        first = verify_patch(patient, LR, config, executor=ex)
        trained_first = _trained_controls(ex)
        ex.seen.clear()
        second = verify_patch(patient, ENT, config, executor=ex)
        trained_second = _trained_controls(ex)
    finally:
        ex.shutdown()
    assert len(trained_first) == 2 and trained_second == []
    v1, v2 = first.verification, second.verification
    assert v1 is not None and v2 is not None and v1.effect is not None and v2.effect is not None
    assert v1.controls == v2.controls and len(v2.controls) == 2  # the case names the controls it used
    assert (v1.controls_reused, v2.controls_reused) == (0, 2)
    assert v2.per_seed["control"] == v1.per_seed["control"]
    assert v2.effect.control == v1.effect.control
    assert v2.env_steps < v1.env_steps  # only the treatment arms were paid for
    assert sorted(ControlCache(cache).keys()) == sorted(v1.controls)


def test_a_shared_control_equals_a_retrained_one(patient, tmp_path):
    """Training is deterministic given the seed, so sharing the control changes no number."""
    own = verify_patch(patient, LR, VerifyConfig(**TINY))
    shared = verify_patch(patient, LR, VerifyConfig(**TINY, control_cache=str(tmp_path / "c")))
    assert own.verification is not None and shared.verification is not None
    assert own.verification.controls == [] and shared.verification.controls
    assert own.verification.per_seed == shared.verification.per_seed


def test_reward_patch_reevaluates_a_cached_control_without_training(patient, tmp_path):
    config = VerifyConfig(**TINY, control_cache=str(tmp_path / "controls"))
    ex = Recording()
    try:
        verify_patch(patient, LR, config, executor=ex)
        ex.seen.clear()
        case = verify_patch(
            patient,
            SHAPED,
            config,
            executor=ex,
        )
    finally:
        ex.shutdown()
    assert _trained_controls(ex) == []
    assert sorted(jid for jid, fn in ex.seen if fn == EVAL_JOB) == ["control seed 0", "control seed 1"]
    v = case.verification
    assert v is not None and v.controls_reused == 2
    if v.status.value != "failed":  # the preference check may refuse the reward; then nothing ran
        assert "shaped_return" in v.secondary


def test_the_key_changes_with_whatever_decides_the_result():
    spec = CONTROL
    key = control_key(spec, "abc", "env_id: CartPole-v1\n")
    assert key == control_key(replace(spec, out_dir="/tmp/b", run_dir="/elsewhere"), "abc", "env_id: CartPole-v1\n")
    variants = [
        control_key(replace(spec, seed=1), "abc", "env_id: CartPole-v1\n"),
        control_key(replace(spec, budget_steps=2000), "abc", "env_id: CartPole-v1\n"),
        control_key(replace(spec, eval_seed=1), "abc", "env_id: CartPole-v1\n"),
        control_key(replace(spec, shifted=(("heavy", json.dumps({"masspole": 0.2})),)), "abc", "env_id: CartPole-v1\n"),
        control_key(spec, "abd", "env_id: CartPole-v1\n"),
        control_key(spec, "abc", "env_id: CartPole-v1\nn_envs: 2\n"),
    ]
    assert len({key, *variants}) == len(variants) + 1
    assert "+" in code_version()
    with pytest.raises(ValueError):
        control_key(replace(spec, patch_json="{}"), "abc", "")


def test_a_broken_entry_is_a_miss(tmp_path):
    cache = ControlCache(tmp_path)
    (tmp_path / "ctl-0" / "run").mkdir(parents=True)
    (tmp_path / "ctl-0" / "result.json").write_text("{not json")
    assert cache.get("ctl-0") is None and cache.get("ctl-missing") is None


def test_survivors_that_go_on_from_stage_one_share_one_continued_control(patient, tmp_path):
    """Two raced candidates whose stage 1 used the same shared controls go on from them; the continued
    controls are trained once (for the first survivor) and reused by the second, and every arm of a seed
    that goes on learns only the rest of its budget."""
    from remedy.cases.model import Stage
    from remedy.cases.verify.racing import resume_from
    from remedy.cases.verify.training import env_step_budget

    cache = str(tmp_path / "controls")
    full = VerifyConfig(**TINY, control_cache=cache)
    stage = replace(full, budget_steps=333)
    ex = Recording()
    try:
        ones = {
            name: verify_patch(patient, p, stage, executor=ex, stage=Stage.race, arms_dir=tmp_path / name)
            for name, p in (("lr", LR), ("ent", ENT))
        }
        ex.seen.clear()
        first = verify_patch(patient, LR, full, executor=ex, resume=resume_from(ones["lr"], tmp_path / "lr", cache))
        trained_first = _trained_controls(ex)
        ex.seen.clear()
        second = verify_patch(patient, ENT, full, executor=ex, resume=resume_from(ones["ent"], tmp_path / "ent", cache))
        trained_second = _trained_controls(ex)
    finally:
        ex.shutdown()
    v1, v2 = first.verification, second.verification
    assert v1 is not None and v2 is not None and v1.effect is not None and v2.effect is not None
    assert len(trained_first) == 2 and trained_second == []
    assert v1.resumed_seeds == v2.resumed_seeds == [0, 1]
    assert v1.controls == v2.controls and (v1.controls_reused, v2.controls_reused) == (0, 2)
    assert not set(v1.controls) & set(ones["lr"].verification.controls)  # a continued control is its own entry
    rest = env_step_budget(1000 - 333, 64 * 2)  # rollouts of 64 steps x 2 envs
    assert v1.env_steps == 4 * rest and v2.env_steps == 2 * rest  # the second paid for its treatments only


def test_an_arm_that_goes_on_starts_from_the_earlier_run_and_learns_only_the_rest(patient, tmp_path):
    from remedy.cases.verify.training import env_step_budget, finetune

    def steps_in(run_dir: str) -> int:
        import zipfile

        with zipfile.ZipFile(f"{run_dir}/model.zip") as zf:
            return int(json.loads(zf.read("data"))["num_timesteps"])

    one = finetune(str(patient), None, budget_steps=333, seed=0, n_envs=2, out_dir=str(tmp_path / "one"))
    rest = finetune(
        str(patient),
        None,
        budget_steps=1000,
        seed=0,
        n_envs=2,
        out_dir=str(tmp_path / "rest"),
        start_dir=one.run_dir,
        done_steps=333,
    )
    assert one.run_dir is not None and rest.run_dir is not None
    assert rest.env_steps == env_step_budget(1000 - 333, 128) < env_step_budget(1000, 128)
    assert steps_in(rest.run_dir) == steps_in(one.run_dir) + rest.env_steps  # it went on from the earlier run
    assert any("went on from a run" in n for n in rest.notes)


def test_a_continued_control_is_keyed_by_the_run_it_continues(tmp_path):
    spec = CONTROL
    start = tmp_path / "stage1"
    start.mkdir()
    (start / "model.zip").write_bytes(b"one")
    text = "env_id: CartPole-v1\n"
    fresh = control_key(spec, "abc", text)
    went_on = control_key(replace(spec, start_dir=str(start), done_steps=333), "abc", text)
    fewer_done = control_key(replace(spec, start_dir=str(start), done_steps=200), "abc", text)
    (start / "model.zip").write_bytes(b"two")
    other_start = control_key(replace(spec, start_dir=str(start), done_steps=333), "abc", text)
    assert len({fresh, went_on, fewer_done, other_start}) == 4
