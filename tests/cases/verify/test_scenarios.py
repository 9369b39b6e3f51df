"""The fault-scenario suite: files validate, coverage, shipped checkpoints, build cache."""

from __future__ import annotations

import json

import pytest
import yaml

from remedy.cases.errors import ScenarioError
from remedy.cases.evidence.envs import env_traits
from remedy.cases.verify.scenarios import (
    CHECKPOINT_DIR,
    SCENARIO_DIR,
    Scenario,
    build_scenario,
    bundled_checkpoint,
    load_scenario,
    load_scenarios,
    scenario_hash,
)
from remedy.cases.verify.verification import BUILD_BUDGET_KEY, declared_budget

TINY = {
    "name": "tiny_cartpole",
    "description": "a few hundred steps of CartPole",
    "env_id": "CartPole-v1",
    "algo": "PPO",
    "hyperparams": {"n_steps": 32, "batch_size": 64, "n_epochs": 1, "policy_kwargs": {"net_arch": [8]}},
    "train_steps": 128,
    "n_envs": 2,
    "fault": "undertrained",
    "ground_truth": ["undertraining"],
    "expected_families": ["training_budget"],
    "success": {"kind": "terminated", "survive": True},
    "eval_episodes": 2,
}


def test_bundled_suite_covers_envs_causes_and_action_types():
    scenarios = load_scenarios()
    assert len(scenarios) >= 10
    assert len({s.env_id for s in scenarios}) >= 6
    assert len({c for s in scenarios for c in s.ground_truth}) >= 8
    kinds = {env_traits(s.env_id, s.env_kwargs).action_space.value for s in scenarios}
    assert kinds == {"discrete", "continuous"}
    hand = {f.stem for f in SCENARIO_DIR.glob("*.yaml")}
    assert hand <= {s.name for s in scenarios}  # the hand-written files, plus the templates' expansion


def test_quick_subset_is_shipped_small_and_current():
    quick = [s for s in load_scenarios() if s.quick]
    assert 3 <= len(quick) <= 4
    for s in quick:
        run = bundled_checkpoint(s)
        assert run is not None, f"{s.name}: shipped checkpoint missing or stale; rebuild it"
        size = sum(p.stat().st_size for p in (CHECKPOINT_DIR / s.name).rglob("*") if p.is_file())
        assert size < 1_000_000
        assert run.config.env_id == s.env_id


def test_every_scenario_ships_a_current_patient():
    """Patients trained on another machine differ (training is bit-identical only on one machine), so
    every bundled scenario ships its patient; a scenario edited without reshipping fails here."""
    stale = [s.name for s in load_scenarios() if bundled_checkpoint(s) is None]
    assert not stale, f"rebuild and ship: remedy bench build --no-oracle, then bench/ship_patients.py ({stale})"


def test_every_shipped_patient_declares_its_scenarios_budget():
    """The run carries its declared fine-tuning budget (build.json), so verifying it needs no scenario."""
    wrong = {}
    for s in load_scenarios():
        record = json.loads((CHECKPOINT_DIR / s.name / "build.json").read_text())
        if BUILD_BUDGET_KEY not in record or record[BUILD_BUDGET_KEY] != s.finetune_budget:
            wrong[s.name] = (record.get(BUILD_BUDGET_KEY, "absent"), s.finetune_budget)
        elif s.finetune_budget is not None:
            assert declared_budget(bundled_checkpoint(s)) == s.finetune_budget
    assert not wrong, f"build.json finetune_budget differs from the scenario (record, scenario): {wrong}"


def test_name_glob_and_outside_path_load_the_same_way(tmp_path):
    assert {s.name for s in load_scenarios("cartpole_*")} >= {"cartpole_undertrained"}
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    assert [s.name for s in load_scenarios(str(tmp_path))] == ["tiny_cartpole"]
    assert [s.name for s in load_scenarios(str(tmp_path / "*.yaml"))] == ["tiny_cartpole"]


def test_bad_scenarios_are_clear_errors(tmp_path):
    with pytest.raises(ScenarioError, match="no scenario matches"):
        load_scenarios("no_such_*")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**TINY, "ground_truth": ["not_a_cause"]}))
    with pytest.raises(ScenarioError, match="ground_truth"):
        load_scenario(bad)
    (tmp_path / "broken.yaml").write_text("name: [unclosed")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(tmp_path / "broken.yaml")


def test_hash_tracks_training_content_only():
    s = Scenario.model_validate(TINY)
    assert scenario_hash(s) == scenario_hash(Scenario.model_validate(TINY))
    assert scenario_hash(s) == scenario_hash(s.model_copy(update={"description": "reworded"}))
    assert scenario_hash(s) != scenario_hash(s.model_copy(update={"train_steps": 256}))
    assert s.budget == 128 // 5


def test_build_caches_by_hash(tmp_path):
    s = Scenario.model_validate(TINY)
    first = build_scenario(s, tmp_path)
    assert first.source == "trained" and not first.cached and first.success_rate is not None
    stamp = first.run.model_path.stat().st_mtime_ns
    second = build_scenario(s, tmp_path)
    assert second.cached and second.source == "cache" and second.run.path == first.run.path
    assert second.run.model_path.stat().st_mtime_ns == stamp  # not retrained
    forced = build_scenario(s, tmp_path, force=True, evaluate=False)
    assert forced.source == "trained" and forced.run.path == first.run.path

    record = first.run.path / "build.json"
    assert json.loads(record.read_text())[BUILD_BUDGET_KEY] is None and declared_budget(first.run) is None
    # a build from before records carried the budget, found by a scenario that declares one: written back
    old = {k: v for k, v in json.loads(record.read_text()).items() if k != BUILD_BUDGET_KEY}
    record.write_text(json.dumps(old))
    found = build_scenario(s.model_copy(update={"finetune_budget": 64}), tmp_path)
    assert found.cached and declared_budget(found.run) == 64  # the run alone declares it now
    assert {k: v for k, v in json.loads(record.read_text()).items() if k != BUILD_BUDGET_KEY} == old
