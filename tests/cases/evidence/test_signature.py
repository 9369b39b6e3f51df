"""Failure signatures: obvious agents get the obvious symptoms; features are defined once; CLI."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest

from remedy.cases.evidence.envs import env_traits, make_env, time_limit_of
from remedy.cases.evidence.rollouts import EvidenceBundle, TrainingLog, rollout
from remedy.cases.evidence.signature import (
    FEATURE_FUNCS,
    SYMPTOM_RULES,
    compute_features,
    compute_signature,
    derive_symptoms,
    iqm,
    signature_of_run,
)
from remedy.cases.evidence.wrappers import WrapperSpec
from remedy.cases.model import Signature, Subject
from remedy.cases.success import FinalReward, ReturnThreshold, Terminated
from remedy.cases.vocab import FEATURES, SYMPTOMS


class RandomAgent:
    """Acts uniformly at random (seeded)."""

    def __init__(self, action_space, seed: int = 0):
        self.space = action_space
        self.space.seed(seed)

    def predict(self, obs, state=None, episode_start=None, deterministic=True):
        return np.stack([self.space.sample() for _ in range(len(obs))]), None


def _random_bundle(env_id, success, wrappers=(), env_kwargs=None, n=6, log=None):
    factory = lambda: make_env(env_id, env_kwargs, wrappers=wrappers)  # noqa: E731
    probe = factory()
    agent = RandomAgent(probe.action_space, seed=0)
    recs = rollout(agent, factory, n_episodes=n, seed=0, success=success)
    traits = env_traits(env_id, env_kwargs)
    bundle = EvidenceBundle(recs, [], log, time_limit_of(probe), traits, probe.action_space, probe.observation_space)
    subject = Subject(
        env_id=env_id,
        env_kwargs=env_kwargs or {},
        algo="random",
        train_steps=0,
        success=success.describe(),
        traits=traits,
    )
    return bundle, subject


def test_every_feature_and_symptom_is_defined_once_with_a_docstring():
    assert set(FEATURE_FUNCS) == set(FEATURES)
    assert all(fn.__doc__ and len(fn.__doc__) > 20 for fn in FEATURE_FUNCS.values())
    assert set(SYMPTOM_RULES) == set(SYMPTOMS)


def test_iqm_hand_values():
    assert iqm(np.array([1.0, 2.0, 3.0, 4.0])) == 2.5
    assert iqm(np.arange(1.0, 9.0)) == 4.5
    assert math.isnan(iqm(np.array([])))


def test_untrained_cartpole_fails_early(cartpole_run):
    rs = signature_of_run(cartpole_run, n_episodes=5, seed=0)
    sig = rs.signature
    assert sig.features["success_rate"] == 0.0 and sig.features["ep_len_frac"] < 0.2
    assert {"never_succeeds", "early_termination", "short_episodes"} <= set(sig.symptoms)
    assert "hovering" not in sig.symptoms and "jerky_actions" not in sig.symptoms
    assert "action_jerk" not in sig.features  # discrete actions: not measurable, so absent
    assert sig.summary.startswith("Discrete CartPole-v1 agent (PPO, 512 steps)")
    assert Signature.model_validate_json(sig.model_dump_json()) == sig  # no NaN in stored features


def test_random_pendulum_is_jerky():
    bundle, subject = _random_bundle("Pendulum-v1", ReturnThreshold(threshold=-200), n=3)
    sig = compute_signature(bundle, subject)
    assert sig.features["action_jerk"] > 0.25
    assert "jerky_actions" in sig.symptoms
    # Pendulum never terminates: running to the limit is its nature, not a timeout or hovering
    assert "timeouts" not in sig.symptoms and "hovering" not in sig.symptoms
    assert "truncated at the 200-step limit" in sig.summary and "jerky" in sig.summary


def test_shortened_time_limit_is_flagged():
    bundle, subject = _random_bundle(
        "Pendulum-v1",
        ReturnThreshold(threshold=-200),
        n=2,
        wrappers=[WrapperSpec(kind="time_limit", params={"max_episode_steps": 50})],
    )
    sig = compute_signature(bundle, subject)
    assert sig.features["time_limit_ratio"] == 0.25 and "short_time_limit" in sig.symptoms
    assert "cut to 25% of the registered one" in sig.summary
    plain, _ = _random_bundle("Pendulum-v1", ReturnThreshold(threshold=-200), n=1)
    assert "short_time_limit" not in compute_signature(plain, subject).symptoms


def test_scaled_observations_are_flagged():
    scaled, subject = _random_bundle(
        "CartPole-v1", Terminated(survive=True), wrappers=[WrapperSpec(kind="obs_scale", params={"factor": 1000})], n=4
    )
    plain, _ = _random_bundle("CartPole-v1", Terminated(survive=True), n=4)
    assert "unscaled_observations" in derive_symptoms(compute_features(scaled, subject), subject)
    assert "unscaled_observations" not in derive_symptoms(compute_features(plain, subject), subject)


def test_survival_reward_lander_shows_reward_gap_and_components():
    bundle, subject = _random_bundle(
        "LunarLander-v3",
        FinalReward(value=100.0),
        env_kwargs={"continuous": True},
        wrappers=[WrapperSpec(kind="survival_reward", params={"bonus_per_step": 2.0})],
        n=4,
    )
    f = compute_features(bundle, subject)
    assert f["train_return_mean"] > f["return_mean"] and f["reward_gap"] > 0.5
    assert f["component.survival.mean"] == pytest.approx(2.0 * f["ep_len_mean"])
    assert "component.fuel_refund.std" in f
    sig = compute_signature(bundle, subject)
    assert "reward_hacking_suspected" in sig.symptoms and "Continuous LunarLander-v3" in sig.summary


def _log(curve, **scalars):
    curve = np.asarray(curve, dtype=float)
    steps = np.arange(1, len(curve) + 1) * 100.0
    return TrainingLog(
        steps,
        curve,
        {k: np.asarray(v, float) for k, v in scalars.items()},
        {k: steps[: len(v)] for k, v in scalars.items()},
    )


@pytest.mark.parametrize(
    ("curve", "scalars", "expected", "absent"),
    [
        (np.linspace(0, 100, 60), {}, {"undertrained"}, {"premature_convergence", "unstable_learning"}),
        (np.r_[np.linspace(0, 100, 30), np.linspace(100, 5, 30)], {}, {"unstable_learning"}, {"undertrained"}),
        (np.r_[np.linspace(0, 20, 10), np.full(50, 20.0)], {}, {"premature_convergence"}, {"undertrained"}),
        (
            np.r_[np.linspace(0, 20, 10), np.full(50, 20.0)],
            {"entropy_loss": [-0.69, -0.3, -0.05]},
            {"collapsed_entropy"},
            set(),
        ),
        (np.r_[np.linspace(0, 20, 10), np.full(50, 20.0)], {"approx_kl": [0.01, 0.9]}, {"unstable_learning"}, set()),
    ],
)
def test_learning_curve_symptoms(curve, scalars, expected, absent):
    bundle, subject = _random_bundle("CartPole-v1", Terminated(survive=True), n=2, log=_log(curve, **scalars))
    tags = set(compute_signature(bundle, subject).symptoms)
    assert expected <= tags and not (absent & tags)


def test_no_logs_means_no_curve_features():
    bundle, subject = _random_bundle("CartPole-v1", Terminated(survive=True), n=2)
    f = compute_features(bundle, subject)
    assert all(math.isnan(f[k]) for k in ("curve_plateau", "curve_collapse", "entropy_final", "approx_kl_max"))


def _cli(monkeypatch, *args):
    from remedy.kb.cli import main

    monkeypatch.setattr(sys, "argv", ["remedy", *args])
    with pytest.raises(SystemExit) as ex:
        main()
        raise SystemExit(0)
    return ex.value.code


def test_cli_signature_json_and_bad_input(cartpole_run, tmp_path, monkeypatch, capsys):
    assert _cli(monkeypatch, "signature", str(cartpole_run), "--episodes", "3", "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["features"]["success_rate"] == 0.0 and "never_succeeds" in out["symptoms"]
    assert _cli(monkeypatch, "signature", str(cartpole_run), "--episodes", "2") == 0
    assert "summary:" in capsys.readouterr().out
    (tmp_path / "model.zip").write_bytes(b"junk")
    assert _cli(monkeypatch, "signature", str(tmp_path)) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "has no run.yaml" in err and len(err.splitlines()) == 1


def test_hovering_needs_a_dense_reward_and_summary_names_the_instability():
    from remedy.cases.model import EnvTraits

    def subject(density):
        traits = EnvTraits(action_space="continuous", obs_dim=8, action_dim=2, reward_density=density)
        return Subject(
            env_id="LunarLander-v3", algo="PPO", train_steps=150_000, success="last reward >= 100", traits=traits
        )

    f = {
        "truncation_rate": 1.0,
        "success_rate": 0.0,
        "return_iqm": -120.0,
        "curve_collapse": 0.7,
        "curve_oscillation": 0.1,
        "approx_kl_max": float("nan"),
    }
    tags = derive_symptoms(f, subject("dense"))
    assert {"hovering", "timeouts", "never_succeeds", "unstable_learning"} <= set(tags)
    assert "hovering" not in derive_symptoms(f, subject("sparse"))
    from remedy.cases.evidence.signature import summarize

    text = summarize(f, tags, subject("dense"), 20, 1000)
    assert text.startswith(
        "Continuous LunarLander-v3 agent (PPO, 150k steps): 100% of 20 episodes truncated at "
        "the 1000-step limit, 0% success (last reward >= 100), return IQM -120"
    )
    assert "it hovers" in text and "fell 70% from its best" in text and "oscillation" not in text


def test_diverged_checkpoint_shows_numerical_instability(cartpole_run, tmp_path):
    import torch

    from remedy.cases.evidence.rundir import RunDir, write_run_dir

    run = RunDir.load(cartpole_run)
    model = run.load_model()
    with torch.no_grad():
        for p in model.policy.parameters():
            p.fill_(float("nan"))
    write_run_dir(tmp_path / "nan", model, run.config)
    rs = signature_of_run(tmp_path / "nan", n_episodes=2, seed=0)
    assert "numerical_instability" in rs.signature.symptoms and "NaN" in rs.bundle.notes[-1]
