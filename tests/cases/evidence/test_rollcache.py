"""Rollouts once: a session's rollouts of the unmodified checkpoint are reused bit for bit, never recomputed."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
import yaml

import remedy.cases.evidence.rollouts as ev
from remedy.cases.evidence.rollcache import RolloutCache, rollout_key
from remedy.cases.evidence.rollouts import EpisodeRecord, collect_evidence
from remedy.cases.evidence.rundir import RunDir
from remedy.cases.verify import arms, checkpoint_arm
from remedy.cases.verify.arms import ArmSpec, run_arm
from remedy.cases.verify.checkpoint_arm import checkpoint_control


@pytest.fixture
def calls(monkeypatch):
    """Counts real rollouts: every call of ``rollouts.rollout`` (also where the arms imported it by name)."""
    counter = [0]
    real = ev.rollout

    def counted(*args, **kwargs):
        counter[0] += 1
        return real(*args, **kwargs)

    for module in (ev, arms, checkpoint_arm):
        monkeypatch.setattr(module, "rollout", counted)
    return counter


def _same(a: EpisodeRecord, b: EpisodeRecord) -> bool:
    """Field by field, arrays bit for bit."""
    for f in dataclasses.fields(EpisodeRecord):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if x is None or y is None or x.dtype != y.dtype or not np.array_equal(x, y, equal_nan=True):
                return False
        elif isinstance(x, dict):
            if x.keys() != y.keys() or not all(np.array_equal(x[k], y[k], equal_nan=True) for k in x):
                return False
        elif x != y and not (x != x and y != y):  # NaN stats equal NaN
            return False
    return True


def _all_same(a: list[EpisodeRecord], b: list[EpisodeRecord]) -> bool:
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))


def test_cached_evidence_is_bit_identical_to_recomputing_and_skips_the_rollouts(cartpole_run, calls):
    run = RunDir.load(cartpole_run)
    plain = collect_evidence(run, n_episodes=5, seed=3)
    assert calls[0] == 2  # deterministic and stochastic
    cache = RolloutCache()
    first = collect_evidence(run, n_episodes=5, seed=3, cache=cache)
    assert calls[0] == 4 and cache.savings.hits == 0
    second = collect_evidence(run, n_episodes=5, seed=3, cache=cache)
    assert calls[0] == 4, "the second evidence collection must not roll the agent out again"
    for bundle in (first, second):
        assert _all_same(bundle.deterministic, plain.deterministic)
        assert _all_same(bundle.stochastic, plain.stochastic)
    saved = cache.savings
    assert (saved.hits, saved.reused_episodes) == (2, 10)
    assert saved.reused_env_steps == sum(r.length for r in plain.deterministic + plain.stochastic)
    collect_evidence(run, n_episodes=5, seed=4, cache=cache)  # other seeds: another computation
    assert calls[0] == 6 and cache.savings.misses == 4


def test_fewer_kept_trajectories_reuse_the_entry_and_match_a_fresh_computation(cartpole_run, calls):
    run = RunDir.load(cartpole_run)
    cache = RolloutCache()
    collect_evidence(run, n_episodes=4, seed=0, cache=cache, keep_trajectories=3)
    fewer = collect_evidence(run, n_episodes=4, seed=0, cache=cache, keep_trajectories=1)
    assert calls[0] == 2
    assert _all_same(
        fewer.deterministic, collect_evidence(run, n_episodes=4, seed=0, keep_trajectories=1).deterministic
    )


def test_the_key_separates_views_only_when_evaluation_drops_a_wrapper(cartpole_run, tmp_path):
    run = RunDir.load(cartpole_run)
    kw = dict(n_episodes=4, seed=0, deterministic=True)
    assert rollout_key(run, for_evaluation=True, **kw) == rollout_key(run, for_evaluation=False, **kw)
    assert rollout_key(run, **kw) != rollout_key(run, **{**kw, "deterministic": False})
    assert rollout_key(run, **kw) != rollout_key(run, **{**kw, "seed": 1})
    shaped = tmp_path / "shaped"
    shutil.copytree(cartpole_run, shaped)
    data = yaml.safe_load((shaped / "run.yaml").read_text())
    data["wrappers"] = [{"kind": "reward_scale", "params": {"factor": 2.0}}]
    (shaped / "run.yaml").write_text(yaml.safe_dump(data))
    other = RunDir.load(shaped)
    # evaluation drops the reward wrapper: the same env as the plain run, a different one in training view
    assert rollout_key(other, for_evaluation=True, **kw) == rollout_key(run, for_evaluation=True, **kw)
    assert rollout_key(other, for_evaluation=False, **kw) != rollout_key(run, for_evaluation=False, **kw)


def test_the_checkpoint_control_in_process_equals_the_worker_job_and_reuses_the_evidence(cartpole_run, tmp_path, calls):
    spec = ArmSpec(
        arm="control",
        seed=0,
        run_dir=str(cartpole_run),
        patch_json=None,
        budget_steps=0,
        n_envs=1,
        learning_rate=None,
        eval_episodes=4,
        eval_seed=100,
        out_dir=str(tmp_path / "control"),
        shifted=(("sutton_barto", json.dumps({"sutton_barto_reward": True})),),
    )
    worker = run_arm(spec)  # what the executor job computes: a checkpoint copy, evaluated
    worker_calls = calls[0]
    run = RunDir.load(cartpole_run)
    cache = RolloutCache()
    collect_evidence(run, n_episodes=4, seed=100, cache=cache)  # this run has no wrappers: same episodes
    before = calls[0]
    mine = checkpoint_control(run, spec, cache)
    assert calls[0] == before + 1, "only the shifted variant is new; the nominal evaluation is the evidence"
    assert mine.nominal == worker.nominal and mine.shifted == worker.shifted and mine.env_steps == 0
    again = checkpoint_control(run, spec, cache)
    assert calls[0] == before + 1 and again.nominal == worker.nominal and again.shifted == worker.shifted
    assert worker_calls == 2  # the job rolled out the nominal env and the shifted one
