"""Verification end to end on a tiny CartPole PPO patient: real fine-tunes in worker processes.

Budgets are tiny (1k steps, 2 envs, 5 evaluation episodes) so the whole file
costs about 90 CPU-seconds; the statuses are not the point, the
machinery is: effects with CIs, and failures contained as ``failed`` cases.
"""

import json
import sys
from types import SimpleNamespace

import pytest
import yaml

from remedy.cases.evidence.rundir import RunConfig
from remedy.cases.model import Case, Effect, Source, Stage, Status
from remedy.cases.patches.spec import Patch
from remedy.cases.verify.arms import preference_verdict
from remedy.cases.verify.plan import shifted_variants
from remedy.cases.verify.scenarios import ShiftedEnv
from remedy.cases.verify.verification import (
    CONFIRM_EVAL_STRIDE,
    ScenarioRef,
    VerifyConfig,
    decide_status,
    declared_budget,
    verify_and_confirm,
    verify_patch,
)

TINY = dict(budget_steps=1000, eval_episodes=5, n_envs=2, n_boot=500)

# Success = return >= 100: this patient's deterministic episodes mostly reach it, its stochastic ones do
# not, so the evidence holds both successes and failures for the trajectory preference check.
PATIENT = RunConfig(
    env_id="CartPole-v1",
    algo="PPO",
    train_steps=3000,
    n_envs=4,
    hyperparams={"n_steps": 64, "batch_size": 64, "n_epochs": 2, "policy_kwargs": {"net_arch": [32, 32]}},
    success={"kind": "return_threshold", "threshold": 100},
)


@pytest.fixture(scope="session")
def cartpole_run(tmp_path_factory):
    from remedy.cases.verify.training import train

    return train(PATIENT, tmp_path_factory.mktemp("cartpole") / "run", seed=0).path


def _patch(data: dict) -> Patch:
    return Patch.from_data(data)


def _effect(diff: float, low: float, high: float, metric: str = "success_rate") -> Effect:
    return Effect(metric=metric, treatment=diff, control=0.0, diff=diff, ci_low=low, ci_high=high)


# -- pure parts ------------------------------------------------------------------------------


def test_status_from_effects():
    assert decide_status(_effect(0.3, 0.1, 0.5)) is Status.improved
    assert decide_status(_effect(-0.3, -0.5, -0.1)) is Status.worse
    assert decide_status(_effect(0.1, -0.1, 0.3)) is Status.no_effect
    shaped_up = _effect(50.0, 10.0, 90.0, "shaped_return")
    assert decide_status(_effect(0.0, -0.2, 0.2), shaped_up) is Status.reward_hacking
    assert decide_status(_effect(-0.3, -0.5, -0.1), shaped_up) is Status.reward_hacking
    assert decide_status(_effect(0.3, 0.1, 0.5), shaped_up) is Status.improved
    assert decide_status(_effect(0.3, 0.1, 0.5), failure="treatment seed 0: timed out") is Status.failed
    assert decide_status(None) is Status.failed
    # one training seed per arm: no verdict either way, whatever the interval says
    assert decide_status(_effect(0.3, 0.1, 0.5), too_few_seeds=True) is Status.inconclusive
    assert decide_status(_effect(-0.3, -0.5, -0.1), too_few_seeds=True) is Status.inconclusive
    assert decide_status(None, too_few_seeds=True) is Status.failed


def test_the_screen_passes_at_its_own_level_and_stores_the_95_percent_effect():
    from remedy.cases.verify import stats
    from remedy.cases.verify.config import SCREEN_CONFIDENCE
    from remedy.cases.verify.outcome import verdict

    # three seeds the treatment won by +150 to +470 return: ahead on every seed, yet t(2) = 4.3 keeps the 95%
    # interval across 0 (oracle screen of invpend_undertrained_5k in bench/data/oracle.jsonl)
    t, c = [[549.0] * 5, [407.0] * 5, [255.0] * 5], [[83.0] * 5, [90.0] * 5, [100.0] * 5]
    strict = stats.effect("return_iqm", t, c, confidence=0.95)
    lenient = stats.effect("return_iqm", t, c, confidence=SCREEN_CONFIDENCE)
    assert strict.ci_low < 0 < lenient.ci_low and lenient.p_value == pytest.approx(0.05)
    screen, confirm = SimpleNamespace(stage=Stage.screen), SimpleNamespace(stage=Stage.confirm)
    status, passed, why = verdict(screen, strict, None, "", lenient)
    assert (status, passed) == (Status.inconclusive, True) and "cleared the screen at 80%" in why
    assert verdict(screen, strict, None, "", None)[:2] == (Status.no_effect, False)  # at 95% it would not pass
    assert verdict(confirm, strict, None, "")[:2] == (Status.no_effect, False)  # a confirmation stays at 95%
    # a screen never passes on a treatment below the control, whatever its level
    worse = stats.effect("return_iqm", c, t, confidence=SCREEN_CONFIDENCE)
    assert verdict(screen, stats.effect("return_iqm", c, t), None, "", worse)[:2] == (Status.no_effect, False)
    with pytest.raises(Exception, match="screen-confidence"):
        VerifyConfig(screen_confidence=1.0).check()


def test_confirmation_seeds_are_a_fresh_block():
    screen = VerifyConfig(seeds=3, seed_base=10)
    first, second = screen.confirmation(0), screen.confirmation(1)
    blocks = [set(range(c.seed_base, c.seed_base + c.seeds)) for c in (screen, first, second)]
    assert blocks == [{10, 11, 12}, {13, 14, 15}, {16, 17, 18}]
    evals = [c.arms_eval_seed for c in (screen, first, second)]
    assert evals == [10_000, 10_000 + CONFIRM_EVAL_STRIDE, 10_000 + 2 * CONFIRM_EVAL_STRIDE]
    assert first.eval_seed == screen.eval_seed  # the patient's evidence rollouts stay the same
    with pytest.raises(Exception, match="seed-base"):
        VerifyConfig(seed_base=-1).check()


def test_confirmations_take_their_own_seed_count():
    screen = VerifyConfig(seeds=3, seed_base=10, confirm_seeds=8)
    first, second = screen.confirmation(0), screen.confirmation(1)
    blocks = [set(range(c.seed_base, c.seed_base + c.seeds)) for c in (screen, first, second)]
    assert blocks == [{10, 11, 12}, set(range(13, 21)), set(range(21, 29))]
    assert (first.seeds, second.seeds) == (8, 8)
    assert screen.seeds_spent(0) == 3 and screen.seeds_spent(2) == 19  # the next fresh base is 10 + 19 = 29
    assert VerifyConfig(seeds=4).confirmation(0).seeds == 4  # unset: as many as the screen
    with pytest.raises(Exception, match="confirm-seeds"):
        VerifyConfig(confirm_seeds=1).check()


def test_declared_budget_of_a_scenario_patient(tmp_path):
    from remedy.cases.evidence.rundir import RunDir
    from remedy.cases.verify.scenarios import SCENARIO_DIR

    shipped = RunDir.load(SCENARIO_DIR / "checkpoints" / "cartpole_undertrained")  # build.json declares it
    assert declared_budget(shipped) == 4000  # its finetune_budget, not 20% of its 8000 steps
    assert VerifyConfig().budget_for(8000, declared_budget(shipped)) == 4000
    assert VerifyConfig(budget_steps=700).budget_for(8000, 4000) == 700  # --budget still wins
    assert declared_budget(shipped, ScenarioRef(name="x", finetune_budget=123)) == 123
    assert declared_budget(SimpleNamespace(path=tmp_path)) is None  # no build record: the 20% default
    # a build record that carries its own budget is read as it is: no scenario is looked up by name
    (tmp_path / "build.json").write_text(json.dumps({"scenario": "no-such-scenario", "finetune_budget": 1234}))
    assert declared_budget(SimpleNamespace(path=tmp_path)) == 1234
    (tmp_path / "build.json").write_text(json.dumps({"scenario": "cartpole_undertrained", "finetune_budget": None}))
    assert declared_budget(SimpleNamespace(path=tmp_path)) is None  # declared: none (the default applies)
    # a record without the key declares none: the scenario it names is not looked up (the core asks no bench)
    (tmp_path / "build.json").write_text(json.dumps({"scenario": "cartpole_undertrained"}))
    assert declared_budget(SimpleNamespace(path=tmp_path)) is None


def test_preference_ranks_successes_above_failures():
    assert preference_verdict([10.0, 12.0], [1.0, 2.0]).ok
    bad = preference_verdict([1.0, 2.0], [10.0, 12.0])
    assert not bad.ok and bad.prob == 0.0
    tie = preference_verdict([1.0], [1.0])  # a constant reward does not rank anything
    assert not tie.ok and tie.prob == 0.5
    assert preference_verdict([], [1.0]).ok and preference_verdict([], [1.0]).prob is None  # undecidable passes


def test_config_budget_and_shifted_variants():
    assert VerifyConfig().budget_for(100_000) == 20_000
    assert VerifyConfig(budget_steps=500).budget_for(None) == 500
    with pytest.raises(Exception, match="--budget"):
        VerifyConfig().budget_for(None)
    with pytest.raises(Exception, match="at least 1"):
        VerifyConfig(seeds=0).check()
    assert shifted_variants(None) == ()
    long = ShiftedEnv(name="long", env_kwargs={"a": 1})
    assert shifted_variants(ScenarioRef(name="s", shifted=(long,))) == (("long", '{"a": 1}'),)


# -- end to end --------------------------------------------------------------------------------


@pytest.mark.slow
def test_verify_returns_a_case_with_effect_and_ci(cartpole_run):
    seen = []
    upright = _patch(
        {
            "kind": "reward_shaping",
            "description": "bonus for an upright pole",
            "code": (
                "def shaped_reward(obs, action, reward, next_obs, terminated, truncated, info):\n"
                "    return reward + 0.5 * (1.0 - min(1.0, abs(float(next_obs[2])) / 0.21))\n"
            ),
        }
    )
    patch = upright
    scenario = ScenarioRef(
        name="cartpole-tiny", shifted=(ShiftedEnv(name="sb_reward", env_kwargs={"sutton_barto_reward": True}),)
    )
    case = verify_patch(
        cartpole_run, patch, VerifyConfig(seeds=2, **TINY), scenario=scenario, progress=lambda m, d, n: seen.append(m)
    )
    assert isinstance(case, Case) and case.source is Source.verified
    v = case.verification
    assert v.status is not Status.failed, v.reason
    assert v.status is not Status.improved and v.stage is Stage.screen  # a screen alone is never "improved"
    # the screen passes at its own level (80% two-sided), so a 95% interval above 0 always passes it
    assert v.passed_screen >= (v.effect.ci_low > 0) and v.seed_base == 0 and v.effect.method == "welch_seeds"
    assert v.passed_screen == ("cleared the screen" in v.reason)
    assert v.effect is not None and v.effect.metric in ("success_rate", "return_iqm")
    assert v.effect.ci_low <= v.effect.diff <= v.effect.ci_high
    assert 0.0 <= v.effect.prob_improvement <= 1.0
    assert {"return_iqm", "success_rate"} - {v.effect.metric} <= set(v.secondary)
    assert "shaped_return" in v.secondary  # both arms scored under the patched reward (reward-hacking test)
    assert "shifted:sb_reward:return_iqm" in v.secondary and case.scenario == "cartpole-tiny"
    assert len(v.per_seed["treatment"]) == len(v.per_seed["control"]) == 2
    assert v.seeds == 2 and v.budget_steps == 1000 and v.env_steps >= 4 * 1000 and v.wall_time_s > 0
    assert {"remedy", "gymnasium", "stable_baselines3", "torch", "python"} <= set(case.provenance.versions)
    assert case.subject.env_id == "CartPole-v1" and case.signature.summary and case.evidence.n_episodes == 5
    assert any("seed 1" in m for m in seen)
    Case.from_json(case.to_json())  # it round-trips, so the KB can store it


@pytest.mark.slow
def test_one_seed_per_arm_is_inconclusive(cartpole_run):
    patch = _patch({"kind": "hyperparameters", "changes": {"ent_coef": 0.01}})
    v = verify_patch(cartpole_run, patch, VerifyConfig(seeds=1, **TINY)).verification
    assert v.status is Status.inconclusive and v.effect is not None
    assert "fewer than 2 training seeds" in v.reason and not v.passed_screen


# PPO's default learning rate: a patch that sets it changes nothing
DO_NOTHING = {"kind": "hyperparameters", "description": "A/A", "changes": {"learning_rate": 0.0003}}


@pytest.mark.slow
def test_do_nothing_patch_is_not_improved(cartpole_run):
    """A real A/A: both arms are independent draws of the same fine-tune (control seeds offset)."""
    config = VerifyConfig(seeds=2, seed_base=40, control_seed_offset=500, **TINY)
    screen, confirmation = verify_and_confirm(cartpole_run, _patch(DO_NOTHING), config)
    v = screen.verification
    assert v.status in (Status.no_effect, Status.inconclusive), v.reason
    assert confirmation is None or confirmation.verification.status is not Status.improved
    # with paired seeds the arms are the same computation: the effect is exactly zero
    paired = verify_patch(cartpole_run, _patch(DO_NOTHING), VerifyConfig(seeds=2, seed_base=40, **TINY)).verification
    assert paired.effect.diff == 0.0 and paired.status is Status.no_effect
    assert paired.per_seed["treatment"] == paired.per_seed["control"]


@pytest.mark.slow
def test_confirmation_trains_on_fresh_seeds_and_links_the_screen(cartpole_run):
    seen: list[str] = []
    config = VerifyConfig(seeds=2, seed_base=3, **TINY)
    patch = _patch({"kind": "hyperparameters", "changes": {"ent_coef": 0.01}})
    case = verify_patch(
        cartpole_run,
        patch,
        config.confirmation(0),
        stage=Stage.confirm,
        confirms="c-screen",
        progress=lambda m, d, n: seen.append(m),
    )
    v = case.verification
    assert v.stage is Stage.confirm and v.confirms == "c-screen" and v.seed_base == 5
    assert v.eval_seed == config.eval_seed + CONFIRM_EVAL_STRIDE
    assert {m.split(":")[0] for m in seen if m.startswith(("treatment seed", "control seed"))} == {
        "treatment seed 5",
        "treatment seed 6",
        "control seed 5",
        "control seed 6",
    }
    screen = verify_patch(cartpole_run, patch, config)
    assert screen.case_id != case.case_id and screen.verification.seed_base == 3
    assert Case.from_json(case.to_json()).verification.confirms == "c-screen"


def test_hostile_reward_patch_ends_as_failed_case(cartpole_run):
    hostile = _patch(
        {
            "kind": "reward_shaping",
            "code": (
                "import os\n"
                "def shaped_reward(obs, action, reward, next_obs, terminated, truncated, info):\n"
                "    os.system('touch /tmp/pwned')\n"
                "    return reward\n"
            ),
        }
    )
    case = verify_patch(cartpole_run, hostile, VerifyConfig(seeds=1, **TINY))
    v = case.verification
    assert v.status is Status.failed and v.effect is None
    assert "refused" in v.reason and v.env_steps == 0


@pytest.mark.slow
def test_reward_that_prefers_failures_is_not_trained(cartpole_run):
    # -1 per step pays short (failed) episodes more than long (successful) ones
    inverted = _patch(
        {
            "kind": "reward_shaping",
            "description": "time cost only",
            "code": (
                "def shaped_reward(obs, action, reward, next_obs, terminated, truncated, info):\n    return -1.0\n"
            ),
        }
    )
    v = verify_patch(cartpole_run, inverted, VerifyConfig(seeds=1, **TINY)).verification
    assert v.status is Status.failed and v.effect is None
    assert "preference" in v.reason and "--force" in v.reason and v.env_steps == 0


@pytest.mark.slow
def test_crashing_worker_fails_only_its_job(cartpole_run):
    # a rollout buffer of 1e9 steps cannot be allocated under the worker's memory limit
    bomb = _patch({"kind": "hyperparameters", "changes": {"n_steps": 10**9}})
    v = verify_patch(cartpole_run, bomb, VerifyConfig(seeds=1, **TINY)).verification
    assert v.status is Status.failed and v.effect is None
    assert "treatment seed 0" in v.reason and "control seed 0" not in v.reason
    assert v.env_steps > 0  # the control arm ran and its cost is still counted


@pytest.mark.slow
def test_diverging_training_ends_as_failed_case(cartpole_run):
    # finite for the sandbox (float64), but returns overflow PPO's float32 buffers: inf, then NaN logits
    nan = _patch(
        {
            "kind": "reward_shaping",
            "description": "absurd scale",
            "code": (
                "def shaped_reward(obs, action, reward, next_obs, terminated, truncated, info):\n"
                "    return reward * 3e38\n"
            ),
        }
    )
    v = verify_patch(cartpole_run, nan, VerifyConfig(seeds=1, **TINY)).verification
    assert v.status is Status.failed and v.effect is None
    assert "diverged" in v.reason


# -- CLI -------------------------------------------------------------------------------------


def _cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run ``remedy ARGS`` in this process through ``main`` (the error mapping included)."""
    from remedy.kb import cli

    monkeypatch.setattr(sys, "argv", ["remedy", *args])
    with pytest.raises(SystemExit) as ex:
        cli.main()
        raise SystemExit(0)
    out = capsys.readouterr()
    return ex.value.code or 0, out.out, out.err


@pytest.mark.slow
def test_cli_verify_stores_the_case(cartpole_run, tmp_path, monkeypatch, capsys):
    patch_file = tmp_path / "patch.yaml"
    patch_file.write_text(yaml.safe_dump({"kind": "hyperparameters", "changes": {"ent_coef": 0.01}}))
    kb = tmp_path / "kb"
    code, out, err = _cli(
        monkeypatch,
        capsys,
        "verify",
        str(cartpole_run),
        "--patch",
        str(patch_file),
        "--seeds",
        "1",
        "--budget",
        "500",
        "--episodes",
        "5",
        "--kb",
        str(kb),
        "--json",
        "--seed-base",
        "7",
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["stored"] is True and data["case"]["verification"]["effect"] is not None
    assert data["case"]["verification"]["seed_base"] == 7 and data["next_seed_base"] == 8
    assert data["status"] == "inconclusive" and data["screen"] is None  # one seed: no verdict, no confirmation

    from remedy.kb.facade import KnowledgeBase

    with KnowledgeBase.open(kb, create=False) as handle:
        assert handle.get(data["case_id"]).verification.status.value == data["status"]


def test_cli_verify_bad_input_is_one_error_line(tmp_path, monkeypatch, capsys):
    patch_file = tmp_path / "patch.yaml"
    patch_file.write_text(yaml.safe_dump({"kind": "hyperparameters", "changes": {"ent_coef": 0.01}}))
    code, _, err = _cli(monkeypatch, capsys, "verify", str(tmp_path / "missing"), "--patch", str(patch_file))
    assert code == 1 and "does not exist" in err and len(err.strip().splitlines()) == 1
    bad_zip = tmp_path / "run"
    bad_zip.mkdir()
    (bad_zip / "run.yaml").write_text(PATIENT.to_yaml())
    (bad_zip / "model.zip").write_bytes(b"not a zip")
    code, _, err = _cli(monkeypatch, capsys, "verify", str(bad_zip), "--patch", str(patch_file))
    assert code == 1 and "model.zip" in err and len(err.strip().splitlines()) == 1
