"""Oracle solvability: shard and resume logic, the results file, and one real tiny check."""

from __future__ import annotations

import json

import pytest

from remedy.cases.errors import ScenarioError
from remedy.cases.verify.scenarios import Scenario
from remedy.cases.verify.solvability import (
    OracleSettings,
    by_cost,
    check_scenarios,
    latest_results,
    not_failing,
    oracle_key,
    oracle_verdict,
    parse_shard,
    pending,
    read_results,
    shard_of,
)

TINY = {
    "name": "tiny_oracle_cartpole",
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
    "finetune_budget": 128,
    "oracle": {"kind": "training_budget", "extra_steps": 256},
}


def _scenarios(n: int) -> list[Scenario]:
    return [Scenario.model_validate({**TINY, "name": f"s{i}", "train_steps": 128 * (n - i)}) for i in range(n)]


def test_shards_partition_the_suite_and_parse_strictly():
    suite = _scenarios(5)
    parts = [shard_of(suite, (i, 3)) for i in (1, 2, 3)]
    assert sorted(s.name for p in parts for s in p) == sorted(s.name for s in suite)
    assert all(set(map(id, a)).isdisjoint(map(id, b)) for a in parts for b in parts if a is not b)
    assert shard_of(suite, None) == suite and parse_shard("2/3") == (2, 3) and parse_shard(None) is None
    for bad in ("3/2", "0/2", "x", "1-2"):
        with pytest.raises(ScenarioError, match="--shard"):
            parse_shard(bad)
    assert [s.name for s in by_cost(suite)] == ["s4", "s3", "s2", "s1", "s0"]  # cheapest first


def test_resume_skips_recorded_scenarios_retries_errors_and_survives_a_torn_line(tmp_path):
    suite, settings, path = _scenarios(3), OracleSettings(), tmp_path / "oracle.jsonl"
    rec = {"split": "dev", "family": None, "patient_success": 0.0, "oracle": "x"}
    lines = [
        dict(scenario="s0", key=oracle_key(suite[0], settings), verdict="solvable", **rec),
        dict(scenario="s1", key=oracle_key(suite[1], settings), verdict="error", **rec),
        dict(scenario="s2", key="stale-key", verdict="unsolvable", **rec),
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"scenario": "s2", "ke')
    assert len(read_results(path)) == 3
    assert set(latest_results(suite, path, settings)) == {"s0", "s1"}  # s2's record is for another oracle/hash
    assert [s.name for s in pending(suite, path, settings)] == ["s1", "s2"]
    assert oracle_key(suite[0], OracleSettings(seeds=2)) != oracle_key(suite[0], settings)
    # confirmations on another seed count are another check (the fix loop's default is 8)
    assert oracle_key(suite[0], OracleSettings(confirm_seeds=3)) != oracle_key(suite[0], settings)


def test_check_records_a_real_verdict_once_then_skips(tmp_path):
    (s,) = _scenarios(1)
    path, cache = tmp_path / "oracle.jsonl", tmp_path / "cache"
    kept: list = []
    (first,) = check_scenarios([s], results=path, cache_dir=cache, on_cases=kept.extend)
    assert first.scenario == "s0" and first.verdict in ("solvable", "unsolvable", "not_failing")
    assert first.patient_success is not None
    if first.verdict == "not_failing":
        assert kept == []  # nothing verified, nothing kept
    else:
        assert first.oracle_status and first.env_steps > 0 and first.oracle_per_seed
        # the oracle's verified cases reach the caller: its screen, and the confirmation behind the record
        assert kept and kept[0].verification.stage.value == "screen" and kept[0].scenario == "s0"
        assert kept[-1].verification.status.value == first.oracle_status
        assert sum(c.verification.env_steps for c in kept) == first.env_steps
        # a screen never says improved: the record is the confirmation's whenever the screen cleared
        assert first.oracle_status != "inconclusive" or "confirm:" not in first.reason
        assert (first.verdict == "solvable") == ("confirm:" in first.reason and first.oracle_status == "improved")
    assert check_scenarios([s], results=path, cache_dir=cache) == []  # done: skipped on resume
    assert len(read_results(path)) == 1


def test_only_a_confirmed_oracle_makes_a_patient_solvable():
    """Version 1 read the screen's status, which is never ``improved``: every failing patient came out unsolvable
    (a 3-seed screen of +139 return [+88, +189] on an InvertedPendulum patient was recorded ``unsolvable``)."""
    assert oracle_verdict("improved") == "solvable"  # a confirmation on fresh seeds
    assert (
        oracle_verdict("inconclusive") == "unsolvable"
    )  # a cleared screen alone, or a confirmation that did not agree
    assert oracle_verdict("no_effect") == "unsolvable" and oracle_verdict("worse") == "unsolvable"
    assert oracle_verdict("failed") == "error"
    assert OracleSettings().seeds == 3


def test_the_screen_level_is_part_of_the_key_and_old_records_keep_theirs():
    s = _scenarios(1)[0]
    # records made before the screen had its own level screened at 0.95: that setting still reads them
    assert oracle_key(s, OracleSettings(screen_confidence=0.95)) != oracle_key(s, OracleSettings())
    assert oracle_key(s, OracleSettings(screen_confidence=0.8)) == oracle_key(s, OracleSettings())


def test_a_not_failing_patient_is_skipped_whatever_screen_level_found_it(tmp_path):
    suite, path = _scenarios(3), tmp_path / "oracle.jsonl"
    rec = {"split": "dev", "family": None, "patient_success": 0.9, "oracle": "x"}
    old, new = OracleSettings(screen_confidence=0.95), OracleSettings()
    lines = [
        dict(scenario="s0", key=oracle_key(suite[0], old), verdict="not_failing", **rec),  # before the screen level
        dict(scenario="s1", key=oracle_key(suite[1], new), verdict="not_failing", **rec),
        dict(scenario="s2", key=oracle_key(suite[2], old), verdict="unsolvable", **rec),
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert not_failing(suite, path) == {"s0", "s1"}
    assert latest_results(suite, path).keys() == {"s1"}  # solvability itself is read at the current level only
