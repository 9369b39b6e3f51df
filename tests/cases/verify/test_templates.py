"""Fault templates: expansion into the bundled suite, splits, oracles that fit."""

from __future__ import annotations

import pytest

from remedy.cases.errors import ScenarioError
from remedy.cases.evidence.envs import env_traits
from remedy.cases.patches.check import check_patch
from remedy.cases.verify.scenarios import SCENARIO_DIR, load_scenarios, load_template_scenarios
from remedy.cases.verify.templates import expand_templates, split_for

BASE = {"env_id": "CartPole-v1", "algo": "PPO", "train_steps": 1000, "success": {"kind": "terminated"}}
TOY = {
    "envs": {"cp": BASE},
    "templates": {
        "lr": {
            "description": "lr {learning_rate}",
            "fault": "lr {learning_rate}",
            "ground_truth": ["unstable_optimization"],
            "expected_families": ["hyperparameters"],
            "oracle": {"kind": "hyperparameters", "changes": {"learning_rate": 0.001}},
            "cells": {
                "cp": [
                    {"tag": "a", "hyperparams": {"learning_rate": 0.5}},
                    {"tag": "b", "hyperparams": {"learning_rate": 0.9}},
                ]
            },
        }
    },
}


def test_suite_has_at_least_40_unique_scenarios_in_both_splits_with_fitting_oracles():
    suite = load_scenarios()
    assert len(suite) >= 40
    assert len({s.name for s in suite}) == len(suite)
    assert {s.split for s in suite} == {"dev", "holdout"}
    assert {env_traits(s.env_id, s.env_kwargs).action_space.value for s in suite} == {"discrete", "continuous"}
    assert {
        "InvertedPendulum-v5",
        "InvertedDoublePendulum-v5",
        "Reacher-v5",
        "Hopper-v5",
        "Acrobot-v1",
        "MountainCar-v0",
        "CartPole-v1",
        "Pendulum-v1",
        "LunarLander-v3",
    } <= {s.env_id for s in suite}
    for s in suite:
        assert s.oracle is not None, s.name
        report = check_patch(s.oracle, s.env_id, s.env_kwargs, s.algo, n_random=20)
        assert report.ok, f"{s.name}: {report.message}"


def test_each_generated_family_has_several_magnitudes_or_envs():
    generated = [s for s in load_scenarios() if s.name not in {f.stem for f in SCENARIO_DIR.glob("*.yaml")}]
    by_family: dict[str, set[str]] = {}
    for s in generated:
        by_family.setdefault(s.family, set()).add(s.name)
    assert all(len(names) >= 2 for names in by_family.values()), by_family


def test_split_is_deterministic_whole_cells_and_reserved_cells_stay_dev():
    assert split_for("lr_too_high", "acrobot") == split_for("lr_too_high", "acrobot")
    cells: dict[tuple[str, str], set[str]] = {}
    for s in load_template_scenarios():
        cells.setdefault((s.family, s.name.split(f"_{s.family}_")[0]), set()).add(s.split)
    assert all(len(splits) == 1 for splits in cells.values())
    held = next(k for k in cells if cells[k] == {"holdout"})
    assert split_for(held[0], held[1], "X-v0", frozenset({(held[0], "X-v0")})) == "dev"


def test_expansion_names_fills_text_and_merges_hyperparameters():
    rows = expand_templates(TOY)
    assert [r["name"] for r in rows] == ["cp_lr_a", "cp_lr_b"]
    assert rows[0]["description"] == "lr 0.5" and rows[1]["fault"] == "lr 0.9"
    assert rows[0]["split"] == rows[1]["split"] == split_for("lr", "cp")


def test_template_errors_are_clear():
    bad = {**TOY, "envs": {}}
    with pytest.raises(ScenarioError, match="names env 'cp'"):
        expand_templates(bad)
    missing = {"envs": TOY["envs"], "templates": {"lr": {**TOY["templates"]["lr"], "fault": "x {nope}"}}}
    with pytest.raises(ScenarioError, match="nope"):
        expand_templates(missing)


def test_declared_mirroring_examples_exist():
    import json
    from importlib import resources

    folder = resources.files("remedy.cases") / "examples"
    ids = {
        json.loads(line)["case_id"]
        for f in folder.iterdir()
        if f.name.endswith(".jsonl")
        for line in f.read_text().splitlines()
        if line.strip()
    }
    declared = {i for s in load_scenarios() for i in s.examples_excluded}
    assert declared and declared <= ids


def test_obs_noise_and_action_scale_families_are_cheap_patients_with_a_budget_oracle():
    """The yield-designed families (issue 27): several envs each, budget oracles, fine-tune arms of seconds."""
    suite = {s.name: s for s in load_scenarios()}
    for family, wrapper in (("obs_noise", "obs_noise"), ("action_scale", "action_scale")):
        members = [s for s in suite.values() if s.family == family]
        assert len(members) >= 4 and len({s.env_id for s in members}) >= 2, family
        for s in members:
            assert [w.kind for w in s.wrappers] == [wrapper], s.name
            assert s.oracle is not None and s.oracle.budget_only, s.name
            assert s.train_steps <= 8000 and sum(p.extra_steps for p in s.oracle.parts) <= 30000, s.name


def test_obs_noise_and_action_scale_wrappers():
    import gymnasium as gym
    import numpy as np

    from remedy.cases.errors import EnvError
    from remedy.cases.evidence.wrappers import apply_wrappers

    def noisy(seed: int):
        env = apply_wrappers(gym.make("CartPole-v1"), [{"kind": "obs_noise", "params": {"std": 0.1, "seed": 3}}])
        obs, _ = env.reset(seed=seed)
        return obs, apply_wrappers(gym.make("CartPole-v1"), []).reset(seed=seed)[0]

    (a, clean), (b, _), (c, _) = noisy(0), noisy(0), noisy(1)
    assert np.array_equal(a, b) and not np.array_equal(a, c)  # seeded: same env seed, same noise
    assert 0 < np.abs(a - clean).max() < 1.0  # noise of std 0.1 on top of the true state
    # the noise is the agent's world: it stays at evaluation
    kept = apply_wrappers(gym.make("CartPole-v1"), [{"kind": "obs_noise", "params": {"std": 0.1}}], for_evaluation=True)
    assert type(kept).__name__ == "ObsNoise"
    env = apply_wrappers(gym.make("Pendulum-v1"), [{"kind": "action_scale", "params": {"factor": 3.0}}])
    assert env.action_space == gym.make("Pendulum-v1").action_space  # a saved policy still fits
    assert env.action(np.array([0.5], dtype=np.float32))[0] == pytest.approx(1.5)
    assert env.action(np.array([1.0], dtype=np.float32))[0] == pytest.approx(2.0)  # clipped to the bounds
    with pytest.raises(EnvError, match="Box action space"):
        apply_wrappers(gym.make("CartPole-v1"), [{"kind": "action_scale", "params": {"factor": 2.0}}])
