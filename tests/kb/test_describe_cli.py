"""`remedy diagnose --describe`: same report shape as a run-dir diagnosis, --tags, argument errors, retrieval by text."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from remedy.cases.errors import ValidationError
from remedy.cases.model import RootCause
from remedy.kb.cli import app
from remedy.kb.diagnose import diagnose_description

HOVER_TEXT = "The lander hovers above the pad until the time limit and never lands."


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A barely trained PPO CartPole agent (128 steps) written as a run directory."""
    import torch
    from stable_baselines3 import PPO

    from remedy.cases.evidence.rundir import RunConfig, write_run_dir
    from remedy.cases.success import Terminated

    torch.set_num_threads(1)
    model = PPO(
        "MlpPolicy",
        "CartPole-v1",
        n_steps=64,
        batch_size=64,
        n_epochs=1,
        seed=0,
        device="cpu",
        policy_kwargs={"net_arch": [16]},
    )
    model.learn(128)
    cfg = RunConfig(
        env_id="CartPole-v1",
        algo="PPO",
        hyperparams={"n_steps": 64, "batch_size": 64},
        train_steps=128,
        success=Terminated(survive=True),
    )
    path = tmp_path_factory.mktemp("runs") / "cartpole"
    write_run_dir(path, model, cfg)
    return path


def _cli(*args: str):
    return CliRunner().invoke(app, ["diagnose", *args])


def _shape(value):
    """The key structure of a JSON value (lists by their first item), to compare report shapes.

    A patch's parts differ by kind, so a patch counts by its own keys only.
    """
    if isinstance(value, dict):
        return {k: None if k == "parts" else _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return None


def test_describe_json_has_the_shape_of_a_run_dir_report(run_dir, kb_path, kb):
    from_run = _cli(str(run_dir), "--json", "--episodes", "3", "--kb", str(kb_path))
    from_text = _cli("--describe", HOVER_TEXT, "--env", "LunarLander-v3", "--json", "--kb", str(kb_path))
    assert from_run.exit_code == 0, from_run.output
    assert from_text.exit_code == 0, from_text.output
    run, text = json.loads(from_run.output), json.loads(from_text.output)
    assert run["reading"] == [] and text["reading"][0]["tag"] == "hovering"
    for key in ("candidates", "diagnosis", "signature"):
        run_shape, text_shape = _shape(run[key]), _shape(text[key])
        if key == "signature":  # features: measured for a run, none from words; the keys around them agree
            run_shape["features"] = text_shape["features"] = None
        assert run_shape == text_shape, key
    assert set(run) == set(text)
    assert _shape(text["reading"])[0] == {"tag": None, "similarity": None, "clause": None}
    assert text["diagnosis"]["causes"][0]["cause"] == "reward_misspecification"
    assert text["signature"]["features"] == {} and text["signature"]["summary"] == HOVER_TEXT


def test_describe_tags_override_and_patch_files(tmp_path, kb_path, kb):
    out = tmp_path / "patches"
    result = _cli(
        "--describe",
        HOVER_TEXT,
        "--tags",
        "jerky_actions",
        "--env",
        "Pendulum-v1",
        "--json",
        "--kb",
        str(kb_path),
        "--write-patches",
        str(out),
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["signature"]["symptoms"] == ["jerky_actions"]
    assert data["reading"] == [{"tag": "jerky_actions", "similarity": None, "clause": "set by the user"}]
    assert data["diagnosis"]["causes"][0]["cause"] == "action_jitter"
    assert data["candidates"][0]["family"] == "action_smoothness"
    assert [str(p) for p in sorted(out.glob("*.yaml"))] == data["patch_files"]


def test_describe_table_shows_the_reading_and_warns_without_a_kb(tmp_path):
    missing = tmp_path / "no-kb"
    result = _cli("--describe", HOVER_TEXT, "--kb", str(missing))
    assert result.exit_code == 0, result.output
    for text in (
        "Description",
        "read as:",
        "hovering (",
        "Root causes",
        "reward_misspecification",
        "built-in priors only",
        "assumed continuous",
    ):
        assert text in result.output, text
    assert not missing.exists()


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "exactly one of RUN_DIR or --describe"),
        (["runs/lander", "--describe", "it hovers"], "exactly one of RUN_DIR or --describe"),
        (["runs/lander", "--env", "LunarLander-v3"], "--env only apply with --describe"),
        (["runs/lander", "--tags", "hovering", "--algo", "PPO"], "--algo, --tags only apply with --describe"),
    ],
)
def test_exactly_one_of_run_dir_or_describe(args, message):
    result = _cli(*args)
    assert isinstance(result.exception, ValidationError) and message in str(result.exception)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--describe", "it hovers", "--tags", "hoverng"], "did you mean 'hovering'"),
        (["--describe", "it hovers", "--action-space", "hybrid"], "use discrete or continuous"),
        (["--describe", "   "], "description is empty"),
        ([], "exactly one of RUN_DIR or --describe"),
    ],
)
def test_describe_mistakes_are_one_red_line(tmp_path, monkeypatch, capsys, args, message):
    from remedy.kb.cli import main

    monkeypatch.setattr(sys, "argv", ["remedy", "diagnose", *args, "--kb", str(tmp_path / "kb")])
    with pytest.raises(SystemExit) as ex:
        main()
    err = capsys.readouterr().err
    assert ex.value.code == 1 and message in " ".join(err.split()) and "Traceback" not in err
    assert not (tmp_path / "kb").exists()


def test_cases_retrieved_by_the_text_carry_a_description_without_tags(kb, case_factory):
    kb.add(
        case_factory(
            "c-valley",
            env_id="MountainCar-v0",
            algo="DQN",
            summary="The car rocks at the bottom of the valley and never reaches the flag.",
            symptoms=["never_succeeds"],
            cause="insufficient_exploration",
            patch={"kind": "exploration_bonus", "count_bonus": 0.1},
            status="improved",
            effect=40.0,
        )
    )
    kb.add(case_factory("c-pole", summary="The pole tips over after a few steps.", cause="undertraining"))
    report = diagnose_description(
        kb, "My mountain car just rocks in the valley, it never gets to the flag.", env_id="MountainCar-v0", tags=[]
    )
    assert report.diagnosis.cited_cases[0] == "c-valley"
    assert report.top_cause == RootCause.insufficient_exploration
    assert report.candidates[0].family.value == "exploration_bonus"
