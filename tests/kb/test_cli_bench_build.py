"""`remedy bench build` on a tiny scenario outside the repo: trains once, then reports it cached."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from remedy.kb.cli import app as remedy_app

TINY = {
    "name": "tiny_cli_cartpole",
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


def _app():
    return remedy_app


def test_bench_build_json_then_cached(tmp_path):
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    args = [
        "bench",
        "build",
        "--scenarios",
        str(tmp_path / "tiny.yaml"),
        "--cache",
        str(tmp_path / "cache"),
        "--results",
        str(tmp_path / "oracle.jsonl"),
        "--json",
    ]
    first = CliRunner().invoke(_app(), args)
    assert first.exit_code == 0, first.output
    row = json.loads(first.output)[0]
    assert row["scenario"] == "tiny_cli_cartpole" and row["cached"] is False and row["train_steps"] == 128
    assert row["verdict"] in ("no_oracle", "not_failing") and row["split"] == "dev"
    second = CliRunner().invoke(_app(), args)
    again = json.loads(second.output)[0]
    assert again["cached"] is True and again["source"] == "recorded"  # resumed: the record is reused
    assert len((tmp_path / "oracle.jsonl").read_text().splitlines()) == 1
    bad = CliRunner().invoke(_app(), [*args[:-1], "--shard", "3/2"])
    assert bad.exit_code != 0
    table = CliRunner().invoke(_app(), args[:-1])
    assert table.exit_code == 0 and "tiny_cli_cartpole" in table.output
