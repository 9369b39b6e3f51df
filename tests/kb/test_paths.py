"""Paths given relative to the caller's directory are resolved before they cross into a worker.

A limited worker runs in its own scratch directory, so a relative run directory reached it as a
folder that does not exist there: `remedy verify runs/x --patch reward.yaml` recorded every
reward-shaping patch ``failed`` ("does not exist") and exited 0. Each verb that takes a run
directory or a patch file now resolves it at the entry, and a worker refuses a relative path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from remedy.cases.verify.arms import ArmSpec, evaluate_trained, preference_check, run_arm
from remedy.kb.facade import KnowledgeBase

from .conftest import invoke as _run


def _flat(text: str) -> str:
    """The text without line breaks (rich wraps a long error line)."""
    return "".join(text.split())


#: every verb that takes a run directory or a patch file, with the missing path in ``{p}``
VERBS = [
    ("signature", ["signature", "{p}"]),
    ("diagnose", ["diagnose", "{p}", "--kb", "{kb}"]),
    ("similar", ["similar", "{p}", "--kb", "{kb}"]),
    ("verify run", ["verify", "{p}", "--patch", "{patch}", "--kb", "{kb}"]),
    ("verify patch", ["verify", "{run}", "--patch", "{p}", "--kb", "{kb}"]),
    ("fix", ["fix", "{p}", "--kb", "{kb}"]),
    ("patch check", ["patch", "check", "{p}", "--env", "CartPole-v1"]),
]


@pytest.mark.parametrize("how", ["relative", "absolute"])
@pytest.mark.parametrize(("verb", "argv"), VERBS, ids=[v for v, _ in VERBS])
def test_every_verb_resolves_its_paths(verb, argv, how, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump({"kind": "hyperparameters", "changes": {"ent_coef": 0.01}}))
    (tmp_path / "notarun").mkdir()
    missing = "gone.yaml" if "patch" in verb else "gone"
    given = missing if how == "relative" else str(tmp_path / missing)
    fill = {"p": given, "kb": "kb", "patch": "ok.yaml", "run": "notarun"}
    KnowledgeBase.open(tmp_path / "kb", reconcile=False).close()  # an empty KB: only the path can be wrong
    code, _, err = _run(monkeypatch, capsys, *(a.format(**fill) for a in argv))
    assert code != 0 and "Traceback" not in err
    # the error names the path as the command saw it: absolute, whatever the caller typed
    assert _flat(str(tmp_path / missing)) in _flat(err), err


def test_the_facade_resolves_a_relative_run_dir(kb, tmp_path, monkeypatch):
    from remedy.cases.errors import RunDirError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(RunDirError) as err:
        kb.similar_to_run("gone")
    assert str(tmp_path / "gone") in str(err.value)


def test_a_worker_refuses_a_relative_path(tmp_path):
    with pytest.raises(ValueError, match="relative path"):
        preference_check("runs/lander", "{}", 1, 0)
    with pytest.raises(ValueError, match="relative path"):
        evaluate_trained(_spec(tmp_path, run_dir=str(tmp_path)), "arms/control-0")
    for field in ("run_dir", "out_dir"):
        with pytest.raises(ValueError, match=f"{field} 'rel' reached a worker as a relative path"):
            run_arm(_spec(tmp_path, **{field: "rel"}))


def _spec(tmp_path: Path, **change: str) -> ArmSpec:
    values = {"run_dir": str(tmp_path / "run"), "out_dir": str(tmp_path / "out"), **change}
    return ArmSpec(
        arm="control",
        seed=0,
        patch_json=None,
        budget_steps=64,
        n_envs=1,
        learning_rate=None,
        eval_episodes=1,
        eval_seed=0,
        **values,
    )


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """PPO on CartPole, 128 steps with a tiny net: enough of a run directory to verify a patch on."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    from remedy.cases.evidence.callback import RemedyRunCallback

    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("runs") / "cartpole"
    venv = make_vec_env("CartPole-v1", n_envs=1, seed=0, monitor_dir=str(path / "monitor"))
    model = PPO("MlpPolicy", venv, n_steps=64, batch_size=64, n_epochs=1, policy_kwargs={"net_arch": [8]}, seed=0)
    model.learn(128, callback=RemedyRunCallback(path))
    return path


REWARD = {
    "kind": "reward_shaping",
    "description": "the task's own reward, through the sandbox",
    "code": "def shaped_reward(obs, action, reward, next_obs, terminated, truncated, info):\n    return reward\n",
}


@pytest.mark.slow
def test_verify_a_reward_patch_with_relative_paths(tiny_run, tmp_path, monkeypatch, capsys):
    """The finding itself: relative run dir, patch file and KB; the reward patch is trained, not `failed`."""
    monkeypatch.chdir(tiny_run.parent)
    (tiny_run.parent / "reward.yaml").write_text(yaml.safe_dump(REWARD))
    args = ["--patch", "reward.yaml", "--seeds", "1", "--budget", "128", "--episodes", "2", "--no-confirm"]
    code, out, err = _run(monkeypatch, capsys, "verify", tiny_run.name, *args, "--kb", "kb", "--json")
    assert code == 0, err
    data = json.loads(out)
    verification = data["case"]["verification"]
    assert data["status"] != "failed", verification["reason"]
    assert verification["effect"] is not None and verification["env_steps"] > 0
    assert data["stored"] is True and (tiny_run.parent / "kb" / "controls").is_dir()
