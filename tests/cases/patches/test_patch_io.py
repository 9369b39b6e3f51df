"""Patch files: YAML/JSON by extension, single part or parts, readable code blocks, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remedy.cases.errors import PatchError
from remedy.cases.patches.io import load_patch, patch_to_yaml, save_patch
from remedy.cases.patches.spec import ActionSmoothness, Hyperparameters, Patch, RewardShaping, SafetyConstraint

HERE = Path(__file__).parent
CODE = "def shaped_reward(obs, action, reward, next_obs, terminated, truncated, info):\n    return float(reward)\n"


def test_single_part_yaml(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(
        "kind: reward_shaping\ndescription: pass-through\ncode: |\n  " + CODE.replace("\n", "\n  ").rstrip() + "\n"
    )
    patch = load_patch(f)
    assert patch.kinds == ["reward_shaping"] and patch.parts[0].code == CODE
    assert patch.parts[0].description == "pass-through"


def test_parts_json_and_yml(tmp_path):
    f = tmp_path / "p.json"
    f.write_text(
        '{"description": "d", "parts": [{"kind": "action_smoothness", "coef": 0.2}, {"kind": "training_budget", "extra_steps": 100}]}'
    )
    assert load_patch(f).kinds == ["action_smoothness", "training_budget"]
    g = tmp_path / "p.YML"
    g.write_text("kind: time_limit\nmax_episode_steps: 200\n")
    assert load_patch(g).parts[0].max_episode_steps == 200


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_round_trip(tmp_path, suffix):
    patch = Patch(
        parts=[
            RewardShaping(code=CODE, description="x"),
            ActionSmoothness(coef=0.3),
            Hyperparameters(changes={"learning_rate": 1e-4, "n_steps": 64}),
            SafetyConstraint(predicate="abs(obs[0]) > 1", mode="terminate"),
        ],
        description="combo",
    )
    path = tmp_path / "sub" / f"patch{suffix}"
    save_patch(patch, path)
    assert load_patch(path) == patch


def test_reward_code_is_a_literal_block():
    text = patch_to_yaml(Patch(parts=[RewardShaping(code=CODE)]))
    assert "code: |" in text and "    return float(reward)" in text


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200))
def test_any_code_text_survives_yaml(tmp_path, code):
    patch = Patch(parts=[RewardShaping(code=code, description=code[:20])])
    path = tmp_path / "h.yaml"
    save_patch(patch, path)
    assert load_patch(path) == patch


@pytest.mark.parametrize(
    "name, content, match",
    [
        ("p.txt", "kind: time_limit", r"must end in \.yaml, \.yml or \.json"),
        ("p.yaml", "kind: [unclosed", r"not valid YAML .*line 1"),
        ("p.json", "{nope", r"not valid JSON"),
        ("p.yaml", "", r"empty"),
        ("p.yaml", "- 1\n- 2\n", r"mapping"),
        (
            "p.yaml",
            "kind: reward_shaping\ndescription: no code\n",
            r"p\.yaml: parts\.0\.reward_shaping\.code: Field required",
        ),
        ("p.yaml", "kind: teleport\n", r"parts\.0"),
        ("p.yaml", "kind: action_smoothness\ncoef: -1\n", r"greater than 0"),
    ],
)
def test_bad_files_give_one_line_errors(tmp_path, name, content, match):
    f = tmp_path / name
    f.write_text(content)
    with pytest.raises(PatchError, match=match) as info:
        load_patch(f)
    assert "\n" not in str(info.value)


def test_missing_directory_and_oversized_files(tmp_path):
    with pytest.raises(PatchError, match="does not exist"):
        load_patch(tmp_path / "nope.yaml")
    (tmp_path / "d.yaml").mkdir()
    with pytest.raises(PatchError, match="is a directory"):
        load_patch(tmp_path / "d.yaml")
    big = tmp_path / "big.yaml"
    big.write_text("description: " + "x" * 1_100_000 + "\nkind: time_limit\nmax_episode_steps: 5\n")
    with pytest.raises(PatchError, match="bytes"):
        load_patch(big)


def test_every_corpus_file_is_a_valid_patch_file():
    files = sorted((HERE / "hostile").glob("*.yaml")) + sorted((HERE / "good_patches").glob("*.*"))
    assert len(files) >= 23
    for f in files:
        assert load_patch(f).parts
