"""`remedy adopt` through the real CLI entry point: table, --json, one error line, and `remedy signature` on the result."""

from __future__ import annotations

import json
import shutil
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
import yaml

from .conftest import invoke as _run


@pytest.fixture(scope="module")
def zoo_run(tmp_path_factory) -> Path:
    """``logs/ppo/CartPole-v1_1/`` of a tiny normalized PPO, as RL Zoo writes it (config/args as OrderedDict YAML)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)
    run = tmp_path_factory.mktemp("zoo") / "logs" / "ppo" / "CartPole-v1_1"
    params = run / "CartPole-v1"
    params.mkdir(parents=True)
    venv = VecNormalize(make_vec_env("CartPole-v1", n_envs=2, seed=0, monitor_dir=str(run)))
    model = PPO("MlpPolicy", venv, n_steps=128, batch_size=64, n_epochs=1, policy_kwargs={"net_arch": [8]}, seed=0)
    model.learn(256)
    model.save(str(run / "CartPole-v1"))
    venv.save(str(params / "vecnormalize.pkl"))
    venv.close()
    config = OrderedDict(
        [("n_envs", 2), ("normalize", "dict(norm_obs=True, norm_reward=False)"), ("policy", "MlpPolicy")]
    )
    (params / "config.yml").write_text(yaml.dump(config))
    (params / "args.yml").write_text(yaml.dump(OrderedDict([("algo", "ppo"), ("env", "CartPole-v1"), ("seed", 0)])))
    return run


def test_adopt_prints_every_file_then_signature_reads_the_run(tmp_path, zoo_run, monkeypatch, capsys):
    from remedy.kb.cli.common import console

    monkeypatch.setattr(console, "width", 160)  # file names whole, not folded at 80 columns
    out = tmp_path / "adopted"
    code, stdout, err = _run(monkeypatch, capsys, "adopt", zoo_run, "--out", out)
    assert code == 0, err
    for name in ("CartPole-v1.zip", "config.yml", "args.yml", "vecnormalize.pkl", "0.monitor.csv"):
        assert name in stdout
    assert "PPO on CartPole-v1" in stdout and f"next: remedy signature {out}" in stdout
    code, stdout, err = _run(monkeypatch, capsys, "signature", out, "--episodes", "2", "--json")
    assert code == 0, err
    signature = json.loads(stdout)
    assert 0.0 <= signature["features"]["success_rate"] <= 1.0 and signature["summary"]


def test_adopt_json_lists_used_and_ignored_files(tmp_path, zoo_run, monkeypatch, capsys):
    extra = tmp_path / "zoo"
    shutil.copytree(zoo_run, extra)
    (extra / "replay_buffer.pkl").write_bytes(b"not read")
    code, stdout, err = _run(monkeypatch, capsys, "adopt", extra, "--out", tmp_path / "run", "--json")
    assert code == 0, err
    report = json.loads(stdout)
    assert report["layout"] == "zoo" and report["config"]["algo"] == "PPO"
    files = {Path(f["path"]).name: f for f in report["files"]}
    assert files["vecnormalize.pkl"]["used"] and files["vecnormalize.pkl"]["copied_to"] == "vecnormalize.pkl"
    assert not files["replay_buffer.pkl"]["used"] and "pickle" in files["replay_buffer.pkl"]["note"]


def test_adopt_without_success_definition_is_one_error_line(tmp_path, zoo_run, monkeypatch, capsys):
    code, _, err = _run(
        monkeypatch, capsys, "adopt", zoo_run / "CartPole-v1.zip", "--out", tmp_path / "run", "--env", "Acrobot-v1x"
    )
    assert code == 1 and "unknown env 'Acrobot-v1x'" in err and "Traceback" not in err
    code, _, err = _run(monkeypatch, capsys, "adopt", zoo_run, "--out", tmp_path / "run", "--env", "Pendulum-v1")
    assert code == 1 and "--success" in err and "return>=" in err and len(err.strip().splitlines()) <= 3
    assert not (tmp_path / "run").exists()


def test_a_zoo_run_gets_a_diagnosis_page_with_its_normalization(tmp_path, zoo_run, monkeypatch, capsys):
    """Adopt an RL Zoo run, then `diagnose --report`: the page paints in headless Chromium with its plots."""
    from matplotlib.image import imread

    from .test_diagnosis_page import CHROMIUM, _chromium

    out = tmp_path / "adopted"
    assert _run(monkeypatch, capsys, "adopt", zoo_run, "--out", out)[0] == 0
    args = ("diagnose", out, "--kb", tmp_path / "kb", "--episodes", "3", "--report", tmp_path / "page")
    code, _, err = _run(monkeypatch, capsys, *args)
    assert code == 0, err
    page = tmp_path / "page" / "diagnosis.html"
    assert 'class="episode-plot"' in page.read_text() and "data:image/gif;base64," in page.read_text()
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install chromium); CI installs it")
    shot = tmp_path / "shot.png"
    _chromium(tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,2000", page.resolve().as_uri())
    pixels = imread(shot)[..., :3]
    assert (pixels < 0.95).any(axis=-1).mean() > 0.05, "the page is nearly blank"
    assert (pixels.max(axis=-1) - pixels.min(axis=-1) > 0.3).mean() > 0.001, "the coloured plots are missing"
