"""Signature coverage: timeouts, training-vs-task reward divergence, low progress / low final height.

Each tag is checked on constructed evidence (episode records built by hand)
next to a near miss that must not fire; progress is checked on real rollouts
of MountainCar, Acrobot and Pendulum.
"""

from __future__ import annotations

import numpy as np
import pytest

from remedy.cases.evidence.envs import env_traits, make_env, time_limit_of
from remedy.cases.evidence.progress import PROGRESS_MEASURES, progress_of
from remedy.cases.evidence.rollouts import EpisodeRecord, EvidenceBundle, TrainingLog, rollout
from remedy.cases.evidence.signature import compute_features, compute_signature
from remedy.cases.evidence.wrappers import WrapperSpec
from remedy.cases.model import Subject
from remedy.cases.success import FinalObs, FinalReward, ReturnThreshold, Terminated
from remedy.cases.vocab import LOW_PROGRESS, REWARD_EXCESS_T, SYMPTOMS, TIMEOUT_RATE


def _ep(seed, ret, train_ret, length, truncated, success=False, **stats) -> EpisodeRecord:
    return EpisodeRecord(
        seed=seed,
        ret=ret,
        train_ret=train_ret,
        length=length,
        terminated=not truncated,
        truncated=truncated,
        success=success,
        final_reward=0.0,
        stats=stats,
    )


def _bundle(env_id, det, sto=(), log=None, limit=1000, env_kwargs=None):
    traits = env_traits(env_id, env_kwargs)
    subject = Subject(
        env_id=env_id,
        env_kwargs=env_kwargs or {},
        algo="PPO",
        train_steps=100_000,
        success="last reward >= 100",
        traits=traits,
    )
    return EvidenceBundle(list(det), list(sto), log, limit, traits), subject


def _tags(det, sto=(), log=None, env_id="LunarLander-v3", env_kwargs=None):
    bundle, subject = _bundle(env_id, det, sto, log, env_kwargs=env_kwargs)
    return compute_signature(bundle, subject)


def _farmable_bonus_agent(rng, excess=60.0, n=20, truncated=11):
    """The issue's agent: a bonus it farms without doing the task; 55% timeouts, no success, training
    return a little above the task return (a gap too small, relative to the return, for the old rule)."""
    eps = []
    for i in range(n):
        task = float(rng.normal(-400.0, 50.0))
        eps.append(
            _ep(
                i,
                task,
                task + excess + float(rng.normal(0.0, 5.0)),
                1000 if i < truncated else 400,
                truncated=i < truncated,
            )
        )
    return eps


def test_new_tags_are_in_the_vocabulary():
    assert {"timeouts", "reward_hacking_suspected", "low_progress", "low_final_height"} <= set(SYMPTOMS)


def test_the_farmable_bonus_agent_is_tagged_timeouts_and_reward_hacking():
    rng = np.random.default_rng(0)
    det, sto = _farmable_bonus_agent(rng), _farmable_bonus_agent(rng)
    sig = _tags(det, sto)
    assert sig.features["truncation_rate"] == pytest.approx(0.55) and sig.features["success_rate"] == 0.0
    assert sig.features["reward_gap"] < 0.25  # the old divergence rule alone stayed silent here
    assert sig.features["reward_excess_t"] >= REWARD_EXCESS_T
    assert {"timeouts", "reward_hacking_suspected"} <= set(sig.symptoms)
    assert "hovering" not in sig.symptoms  # under the hovering threshold (nearly every episode)
    assert "reward hacking suspected" in sig.summary


def test_timeouts_need_most_episodes_truncated():
    few = [_ep(i, -100.0, -100.0, 1000 if i < 9 else 300, truncated=i < 9) for i in range(20)]
    assert TIMEOUT_RATE > 9 / 20 and "timeouts" not in _tags(few).symptoms
    most = [_ep(i, -100.0, -100.0, 1000 if i < 11 else 300, truncated=i < 11) for i in range(20)]
    assert "timeouts" in _tags(most).symptoms


def test_a_reward_that_is_the_task_reward_or_zero_mean_noise_is_not_hacking():
    rng = np.random.default_rng(2)
    same = [_ep(i, r, r, 300, truncated=False) for i, r in enumerate(rng.normal(-400, 50, 20))]
    assert "reward_hacking_suspected" not in _tags(same, same).symptoms
    noisy = [
        _ep(i, r, r + float(rng.normal(0, 20)), 300, truncated=False) for i, r in enumerate(rng.normal(-400, 50, 20))
    ]
    sig = _tags(noisy, noisy)
    assert abs(sig.features["reward_excess_t"]) < REWARD_EXCESS_T
    assert "reward_hacking_suspected" not in sig.symptoms


def _log(final: float) -> TrainingLog:
    ts = np.arange(1, 41) * 1000.0
    return TrainingLog(ts, np.linspace(-300.0, final, 40))


def test_training_logs_alone_reveal_a_reward_that_pays_for_something_else():
    # a user's own reward in their code: rollouts cannot see it (training return == task return), the logs can
    eps = [_ep(i, -400.0 + i, -400.0 + i, 300, truncated=False) for i in range(20)]
    sig = _tags(eps, eps, log=_log(300.0))
    assert sig.features["train_task_gap"] > 1.0 and "reward_hacking_suspected" in sig.symptoms
    honest = _tags(eps, eps, log=_log(-390.0))  # the logs agree with the task: nothing to suspect
    assert abs(honest.features["train_task_gap"]) < 0.1 and "reward_hacking_suspected" not in honest.symptoms


def test_progress_tags_from_constructed_progress():
    low = [_ep(i, -200.0, -200.0, 200, truncated=True, progress_max=0.3, progress_final=0.1) for i in range(10)]
    sig = _tags(low, env_id="MountainCar-v0")
    assert sig.features["progress_max"] == pytest.approx(0.3) and LOW_PROGRESS > 0.3
    assert {"low_progress", "low_final_height"} <= set(sig.symptoms)
    near = [_ep(i, -200.0, -200.0, 200, truncated=True, progress_max=0.8, progress_final=0.2) for i in range(10)]
    tags = _tags(near, env_id="MountainCar-v0").symptoms
    assert "low_progress" not in tags and "low_final_height" in tags
    assert "progress_max" not in _tags([_ep(0, 9.0, 9.0, 9, truncated=False)], env_id="CartPole-v1").features


class _Constant:
    """Always the same action (seeded envs make the episodes reproducible)."""

    def __init__(self, action):
        self.action = action

    def predict(self, obs, state=None, episode_start=None, deterministic=True):
        return np.stack([np.asarray(self.action)] * len(obs)), None


def _real(env_id, agent, success, wrappers=(), n=3):
    factory = lambda: make_env(env_id, wrappers=wrappers)  # noqa: E731
    probe = factory()
    recs = rollout(agent, factory, n_episodes=n, seed=0, success=success)
    traits = env_traits(env_id)
    subject = Subject(env_id=env_id, algo="PPO", train_steps=1000, success=success.describe(), traits=traits)
    bundle = EvidenceBundle(recs, [], None, time_limit_of(probe), traits, probe.action_space, probe.observation_space)
    return compute_signature(bundle, subject), compute_features(bundle, subject)


def test_real_rollouts_measure_progress_on_the_envs_own_quantity():
    # MountainCar without pushing stays in the valley: low progress, low final position
    sig, _ = _real("MountainCar-v0", _Constant(1), FinalObs(index=0, op=">=", value=0.5))
    assert sig.features["progress_max"] < 0.2 and {"low_progress", "low_final_height"} <= set(sig.symptoms)
    # Acrobot hanging still: the tip stays at the bottom
    sig, _ = _real("Acrobot-v1", _Constant(1), Terminated())
    assert sig.features["progress_max"] < 0.1 and "low_progress" in sig.symptoms
    # Pendulum: the measure is read from the env's state, so a scaled observation does not change it
    plain, _ = _real("Pendulum-v1", _Constant([0.0]), ReturnThreshold(threshold=-200))
    scaled, _ = _real(
        "Pendulum-v1",
        _Constant([0.0]),
        ReturnThreshold(threshold=-200),
        wrappers=(WrapperSpec(kind="obs_scale", params={"factor": 1000.0}),),
    )
    assert plain.features["progress_final"] == pytest.approx(scaled.features["progress_final"])


def test_lander_altitude_is_measured_from_the_start_to_the_pad():
    env = make_env("LunarLander-v3", seed=0)
    assert progress_of(env) == pytest.approx(0.0, abs=0.05)  # at the start level
    assert set(PROGRESS_MEASURES) >= {"MountainCarEnv", "AcrobotEnv", "LunarLander", "PendulumEnv"}
    assert np.isnan(progress_of(make_env("CartPole-v1", seed=0)))
    sig, _ = _real("LunarLander-v3", _Constant(0), FinalReward(op=">=", value=100), n=2)
    assert sig.features["progress_max"] > 0.5  # falling without firing the engines gets it down to the ground
