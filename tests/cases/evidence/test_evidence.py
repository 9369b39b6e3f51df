"""Evidence: seeded rollouts (original vs training reward), training logs, bundles."""

from __future__ import annotations

import numpy as np
import pytest

from remedy.cases.evidence.constraints import Constraint
from remedy.cases.evidence.envs import make_env
from remedy.cases.evidence.rollouts import collect_evidence, read_training_logs, rollout, to_evidence
from remedy.cases.evidence.rundir import RunDir
from remedy.cases.evidence.wrappers import WrapperSpec
from remedy.cases.success import FinalReward, ReturnThreshold, Terminated


class RandomAgent:
    """An agent that acts uniformly at random (seeded): the simplest real policy."""

    def __init__(self, action_space, seed: int = 0):
        self.space = action_space
        self.space.seed(seed)

    def predict(self, obs, state=None, episode_start=None, deterministic=True):
        return np.stack([self.space.sample() for _ in range(len(obs))]), None


def test_rollout_is_seeded_and_keeps_few_trajectories(cartpole_run):
    run = RunDir.load(cartpole_run)
    model = run.load_model()
    kw = dict(n_episodes=5, seed=7, success=Terminated(survive=True), keep_trajectories=2)
    a = rollout(model, run.make_env, **kw)
    b = rollout(model, run.make_env, **kw)
    assert [r.seed for r in a] == [7, 8, 9, 10, 11]
    assert [(r.ret, r.length) for r in a] == [(r.ret, r.length) for r in b]
    assert a[0].actions is not None and a[1].observations is not None and a[2].actions is None
    first = a[0]
    assert first.observations.shape == (first.length + 1, 4) and first.rewards.sum() == first.ret
    for r in a:  # CartPole pays 1 per step; an untrained agent falls early
        assert r.ret == r.train_ret == r.length and r.terminated and not r.success


def test_batched_and_single_env_rollouts_agree(cartpole_run):
    """Deterministic episodes do not depend on how many run side by side."""
    import remedy.cases.evidence.rollouts as ev

    run = RunDir.load(cartpole_run)
    model = run.load_model()
    kw = dict(n_episodes=4, seed=0, success=ReturnThreshold(threshold=475))
    batched = [r.ret for r in rollout(model, run.make_env, **kw)]
    old, ev.MAX_BATCH = ev.MAX_BATCH, 1
    try:
        single = [r.ret for r in rollout(model, run.make_env, **kw)]
    finally:
        ev.MAX_BATCH = old
    assert batched == single


def test_survival_reward_train_return_differs_from_original():
    def factory():
        return make_env(
            "LunarLander-v3", wrappers=[WrapperSpec(kind="survival_reward", params={"bonus_per_step": 1.0})]
        )

    agent = RandomAgent(factory().action_space, seed=0)
    recs = rollout(agent, factory, n_episodes=3, seed=0, success=FinalReward(value=100.0), keep_trajectories=1)
    for r in recs:
        assert r.train_ret > r.ret + 0.5 * r.length  # +1 per step alive
        assert set(r.reward_components) >= {"survival", "fuel_refund"}
        assert r.reward_components["survival"].sum() == pytest.approx(r.length)
        assert not r.success
    assert recs[0].rewards.sum() == pytest.approx(recs[0].ret)


def test_constraint_violations_are_counted():
    env_f = lambda: make_env("CartPole-v1")  # noqa: E731
    agent = RandomAgent(env_f().action_space, seed=1)
    always = Constraint(name="always", expr="obs[0] > -100")
    never = Constraint(name="never", expr="obs[0] > 100")
    recs = rollout(agent, env_f, n_episodes=3, seed=0, success=Terminated(survive=True), constraints=[always])
    assert [r.violations for r in recs] == [r.length for r in recs]
    recs = rollout(agent, env_f, n_episodes=3, seed=0, success=Terminated(survive=True), constraints=[never])
    assert all(r.violations == 0 for r in recs)


def test_training_logs_from_monitor_and_progress(cartpole_run, tmp_path):
    log = read_training_logs(cartpole_run)
    assert log is not None and "monitor" in log.sources and "progress.csv" in log.sources
    assert len(log.ep_return) > 5 and np.all(np.diff(log.timesteps) > 0)
    assert log.timesteps[-1] <= 512
    assert "entropy_loss" in log.scalars and len(log.scalars["entropy_loss"]) == len(log.scalar_steps["entropy_loss"])
    assert read_training_logs(tmp_path) is None
    (tmp_path / "events.out.tfevents.1.host").write_bytes(b"\x00")
    assert "TensorBoard" in read_training_logs(tmp_path).notes[0]


def test_collect_evidence_and_summary(cartpole_run):
    run = RunDir.load(cartpole_run)
    bundle = collect_evidence(run, n_episodes=4, seed=0)
    assert len(bundle.deterministic) == len(bundle.stochastic) == 4
    assert bundle.time_limit == 500 and bundle.traits.action_dim == 2 and bundle.log is not None
    ev = to_evidence(bundle)
    assert ev.n_episodes == 4 and ev.has_training_logs
    assert {e.termination for e in ev.episodes} == {"terminated"}
    assert [e.ret for e in ev.episodes] == [r.ret for r in bundle.deterministic]


def _pb_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _pb(num: int, wt: int, payload: bytes) -> bytes:
    body = _pb_varint(len(payload)) + payload if wt == 2 else payload
    return _pb_varint(num << 3 | wt) + body


def _event(step: int, tag: str, value: float, tensor: bool = False) -> bytes:
    """One TFRecord holding an Event with one scalar, encoded per the protobuf wire format."""
    import struct

    if tensor:  # TF2 style: TensorProto{dtype=DT_FLOAT, float_val=[value]}
        val = _pb(8, 2, _pb(1, 0, _pb_varint(1)) + _pb(5, 2, struct.pack("<f", value)))
    else:  # simple_value, as torch's SummaryWriter (and so SB3) writes it
        val = _pb(2, 5, struct.pack("<f", value))
    summary = _pb(1, 2, _pb(1, 2, tag.encode()) + val)
    data = _pb(1, 1, struct.pack("<d", 1.0)) + _pb(2, 0, _pb_varint(step)) + _pb(5, 2, summary)
    return struct.pack("<Q", len(data)) + b"\0" * 4 + data + b"\0" * 4


def test_tensorboard_scalars_are_read_without_tensorboard(tmp_path):
    import struct

    header = _pb(3, 2, b"brain.Event:2")
    records = struct.pack("<Q", len(header)) + b"\0" * 4 + header + b"\0" * 4
    for i in range(12):
        records += _event(100 * (i + 1), "rollout/ep_rew_mean", float(i))
        records += _event(100 * (i + 1), "train/approx_kl", 0.01 * i, tensor=True)
    (tmp_path / "PPO_1").mkdir()
    (tmp_path / "PPO_1" / "events.out.tfevents.123.host.1.0").write_bytes(records + b"\x05\x00")  # torn tail
    log = read_training_logs(tmp_path)
    assert log.sources == ["tensorboard"]
    np.testing.assert_allclose(log.ep_return, np.arange(12.0))
    np.testing.assert_allclose(log.timesteps, 100.0 * np.arange(1, 13))
    np.testing.assert_allclose(log.scalars["approx_kl"], 0.01 * np.arange(12), rtol=1e-6)


def test_diverged_policy_gives_nan_episodes_not_a_crash(cartpole_run):
    import torch

    run = RunDir.load(cartpole_run)
    model = run.load_model()
    with torch.no_grad():
        for p in model.policy.parameters():
            p.fill_(float("nan"))
    for deterministic in (True, False):
        recs = rollout(
            model,
            run.make_env,
            n_episodes=3,
            seed=0,
            deterministic=deterministic,
            success=ReturnThreshold(threshold=475),
        )
        assert len(recs) == 3 and all(not r.success for r in recs)
    assert any(r.nan for r in recs)  # stochastic sampling from NaN logits fails: flagged, not raised
