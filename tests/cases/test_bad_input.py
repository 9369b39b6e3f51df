"""Bad input in files: run directories, scenario files and patch files; one RemedyError naming the problem."""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

import pytest
import yaml

from remedy.cases.errors import CheckpointError, PatchError, RunDirError, ScenarioError
from remedy.cases.evidence.rundir import RunDir
from remedy.cases.patches.io import load_patch
from remedy.cases.verify.scenarios import load_scenario
from remedy.cases.yamlfile import MAX_YAML_ALIASES

SHIPPED = Path(str(resources.files("remedy.cases") / "scenarios" / "checkpoints" / "cartpole_lr_too_low"))
SCENARIO = Path(str(resources.files("remedy.cases") / "scenarios" / "cartpole_lr_too_low.yaml"))

# A "billion laughs": nine levels of nine references, a few hundred bytes, 9**7 strings expanded.
BOMB = """
a: &a ["x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
"""


def _indent(text: str, n: int) -> str:
    return "".join(" " * n + line + "\n" for line in text.strip().splitlines())


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """A copy of a shipped, valid run directory (PPO on CartPole)."""
    dst = tmp_path / "run"
    shutil.copytree(SHIPPED, dst)
    return dst


def _edit_run_yaml(run: Path, **changes) -> None:
    data = yaml.safe_load((run / "run.yaml").read_text())
    data.update(changes)
    (run / "run.yaml").write_text(yaml.safe_dump(data))


# -- run directories -------------------------------------------------------------------------------


def test_shipped_run_dir_is_valid(run_dir):
    assert RunDir.load(run_dir).config.algo == "PPO"


def test_mislabelled_checkpoint(run_dir):
    _edit_run_yaml(run_dir, algo="A2C")
    with pytest.raises(CheckpointError, match=r"saved by PPO.*declares algo: A2C; set algo to PPO"):
        RunDir.load(run_dir)


def test_mislabelled_as_off_policy(run_dir):
    _edit_run_yaml(run_dir, algo="DQN")
    with pytest.raises(CheckpointError, match="declares algo: DQN"):
        RunDir.load(run_dir)


@pytest.mark.parametrize(
    ("name", "write", "error", "says"),
    [
        ("missing-dir", None, RunDirError, "does not exist"),
        ("no-run-yaml", lambda r: (r / "run.yaml").unlink(), RunDirError, "has no run.yaml"),
        (
            "not-a-mapping",
            lambda r: (r / "run.yaml").write_text("- just\n- a list\n"),
            RunDirError,
            "must be a mapping",
        ),
        ("bad-yaml", lambda r: (r / "run.yaml").write_text("env_id: [unclosed\n"), RunDirError, "not valid YAML"),
        ("unknown-key", lambda r: _edit_run_yaml(r, colour="red"), RunDirError, "field 'colour'"),
        ("unknown-algo", lambda r: _edit_run_yaml(r, algo="PPOO"), RunDirError, "did you mean 'PPO'"),
        ("negative-steps", lambda r: _edit_run_yaml(r, train_steps=-5), RunDirError, "field 'train_steps'"),
        (
            "bomb",
            lambda r: (r / "run.yaml").write_text("env_id: CartPole-v1\nalgo: PPO\nenv_kwargs:\n" + _indent(BOMB, 2)),
            RunDirError,
            "once aliases are expanded",
        ),
        (
            "too-big",
            lambda r: (r / "run.yaml").write_text("notes: '" + "x" * 1_100_000 + "'\n"),
            RunDirError,
            "must be under",
        ),
        ("not-utf8", lambda r: (r / "run.yaml").write_bytes(b"env_id: \xff\xfe\n"), RunDirError, "not UTF-8"),
        ("zip-not-zip", lambda r: (r / "model.zip").write_text("nope"), CheckpointError, "is not a zip file"),
        ("no-model", lambda r: (r / "model.zip").unlink(), CheckpointError, "is missing"),
    ],
)
def test_bad_run_dirs(run_dir, tmp_path, name, write, error, says):
    path = run_dir if write is not None else tmp_path / "nowhere"
    if write is not None:
        write(run_dir)
    with pytest.raises(error) as info:
        RunDir.load(path)
    assert says in str(info.value)


# -- scenario files --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("bomb", "name: x\nenv_kwargs:\n" + _indent(BOMB, 2), "once aliases are expanded"),
        (
            "aliases",
            "name: x\nl: &l 1\nrefs: [" + ", ".join(["*l"] * (MAX_YAML_ALIASES + 1)) + "]\n",
            f"more than {MAX_YAML_ALIASES} YAML aliases",
        ),
        ("bad-yaml", "name: [x\n", "not valid YAML"),
        ("missing-fields", "name: x\n", "field '"),
        ("not-a-mapping", "42\n", "must be a mapping"),
    ],
)
def test_bad_scenario_files(tmp_path, name, text, says):
    p = tmp_path / f"{name}.yaml"
    p.write_text(text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(p)
    assert says in str(info.value)


def test_shipped_scenario_loads():
    assert load_scenario(SCENARIO).name == "cartpole_lr_too_low"


# -- patch files ---------------------------------------------------------------------------------


def _nested_json(depth_items: int) -> str:
    return (
        '{"kind": "curriculum", "stages": [{"fraction": 1.0, "env_kwargs": {"k": ['
        + ",".join(["[1,2,3,4,5,6,7,8,9,10]"] * depth_items)
        + "]}}]}"
    )


@pytest.mark.parametrize(
    ("name", "suffix", "text", "says"),
    [
        (
            "curriculum-bomb",
            ".yaml",
            "kind: curriculum\nstages:\n  - fraction: 1.0\n    env_kwargs:\n" + _indent(BOMB, 6),
            "once aliases are expanded",
        ),
        (
            "many-aliases",
            ".yaml",
            "kind: hyperparameters\nx: &x 1\nchanges: {"
            + ", ".join(f"k{i}: *x" for i in range(MAX_YAML_ALIASES + 1))
            + "}\n",
            "YAML aliases",
        ),
        ("json-huge-kwargs", ".json", _nested_json(12_000), "once aliases are expanded"),
        ("empty", ".yaml", "", "the patch file is empty"),
        ("unknown-kind", ".yaml", "kind: magic\n", "magic"),
        ("list", ".yaml", "- kind: time_limit\n", "must be a mapping"),
        ("bad-json", ".json", "{kind: 1}", "not valid JSON"),
    ],
)
def test_bad_patch_files(tmp_path, name, suffix, text, says):
    p = tmp_path / f"{name}{suffix}"
    p.write_text(text)
    with pytest.raises(PatchError) as info:
        load_patch(p)
    assert says in str(info.value)


def test_patch_wrong_suffix(tmp_path):
    p = tmp_path / "patch.txt"
    p.write_text("kind: time_limit\nmax_episode_steps: 10\n")
    with pytest.raises(PatchError, match="must end in .yaml, .yml or .json"):
        load_patch(p)


def test_a_lone_surrogate_is_one_problem_not_a_traceback(tmp_path):
    import json

    from remedy.cases.io import read_cases
    from remedy.kb.facade import example_files

    record = json.loads(example_files()[0].read_text().splitlines()[0])
    record["case_id"] = "ex-surrogate-1"
    record["signature"]["summary"] = "bad \ud800 text"
    path = tmp_path / "sur.jsonl"
    path.write_text(json.dumps(record) + "\n")  # json.dumps escapes it as \ud800, as a hostile file would
    cases, problems = read_cases(path, skip_invalid=True)
    assert cases == [] and len(problems) == 1
    assert "surrogate" in problems[0][1] and "signature.summary" in problems[0][1]
