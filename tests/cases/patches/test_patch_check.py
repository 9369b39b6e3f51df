"""Fit checks, the full patch check, the hostile corpus (every file refused or contained) and `remedy patch check`."""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from remedy.cases.errors import EnvError, PatchRejectedError
from remedy.cases.model import ActionSpaceType, EnvTraits
from remedy.cases.patches.check import CheckReport, check_fit, check_patch
from remedy.cases.patches.io import load_patch
from remedy.cases.patches.spec import (
    ActionMagnitude,
    ActionSmoothness,
    Curriculum,
    CurriculumStage,
    ExplorationBonus,
    FrameStack,
    Hyperparameters,
    Normalization,
    Patch,
)

HERE = Path(__file__).parent
HOSTILE = sorted((HERE / "hostile").glob("*.yaml"))
GOOD = sorted((HERE / "good_patches").glob("*.*"))
SENTINELS = [Path("/tmp/remedy_pwned"), Path("/tmp/remedy_pwned.npy")]

DISCRETE = EnvTraits(action_space=ActionSpaceType.discrete, obs_dim=4, action_dim=2)
CONTINUOUS = EnvTraits(action_space=ActionSpaceType.continuous, obs_dim=3, action_dim=1)


def header(path: Path) -> dict[str, str]:
    """The ``# key: value`` comment lines at the top of a corpus file."""
    out = {}
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        key, _, value = line[1:].partition(":")
        out[key.strip()] = value.strip()
    return out


# --------------------------------------------------------------------------- the hostile corpus


def test_corpus_is_big_and_every_file_says_what_it_tries():
    assert len(HOSTILE) >= 20
    for f in HOSTILE:
        h = header(f)
        assert h.get("tries") and h.get("expect"), f.name


def _check_file(path: Path) -> CheckReport:
    h = header(path)
    return check_patch(
        load_patch(path), h.get("env", "Pendulum-v1"), algo=h.get("algo"), n_random=20, fuzz_timeout_s=60
    )


@pytest.fixture(scope="module")
def hostile_reports() -> dict[str, CheckReport]:
    """Every corpus file checked once; a few at a time, since most of the cost is worker start-up."""
    for s in SENTINELS:
        s.unlink(missing_ok=True)
    with ThreadPoolExecutor(max_workers=3) as pool:
        reports = dict(zip([p.name for p in HOSTILE], pool.map(_check_file, HOSTILE)))
    assert not any(s.exists() for s in SENTINELS), "hostile code touched the file system"
    return reports


@pytest.mark.parametrize("path", HOSTILE, ids=[p.stem for p in HOSTILE])
def test_every_hostile_patch_is_refused_or_contained(path, hostile_reports):
    report = hostile_reports[path.name]
    assert isinstance(report, CheckReport) and not report.ok
    expected = header(path)["expect"].split("|")
    assert any(report.rule == e or report.rule.startswith(e + ":") for e in expected), (
        f"{path.name}: got {report.rule}: {report.message}"
    )
    assert "\n" not in report.message
    if report.rule.startswith("fuzz:"):  # contained at run time: the worker saw it and reported it
        assert report.fuzz is not None and report.fuzz.problems


@pytest.mark.parametrize("path", GOOD, ids=[p.name for p in GOOD])
def test_good_patches_are_accepted(path):
    h = header(path) if path.suffix != ".json" else {}
    report = check_patch(load_patch(path), h.get("env", "Pendulum-v1"), algo=h.get("algo"))
    assert report.ok, f"{report.rule}: {report.message}"
    assert report.rule is None and report.message == "accepted"
    patch = load_patch(path)
    if any(k in ("reward_shaping", "safety_constraint") for k in patch.kinds):
        assert report.fuzz is not None and report.fuzz.calls > 100 and not report.fuzz.problems


def test_unknown_env_is_an_error_not_a_rejection():
    with pytest.raises(EnvError, match="did you mean 'Pendulum-v1'"):
        check_patch(Patch(parts=[ActionSmoothness()]), "Pendulm-v1")


# --------------------------------------------------------------------------- fit


def rule_of(patch: Patch, traits: EnvTraits = CONTINUOUS, algo: str | None = None, **kw) -> str:
    with pytest.raises(PatchRejectedError) as info:
        check_fit(patch, traits, algo, **kw)
    return info.value.rule


def test_penalties_need_continuous_actions():
    assert rule_of(Patch(parts=[ActionSmoothness()]), DISCRETE) == "action_smoothness_needs_continuous_actions"
    assert rule_of(Patch(parts=[ActionMagnitude()]), DISCRETE) == "action_magnitude_needs_continuous_actions"
    check_fit(Patch(parts=[ActionSmoothness(), ActionMagnitude()]), CONTINUOUS)


def test_ent_coef_only_for_algorithms_that_have_it():
    for algo in ("DQN", "QRDQN", "TD3", "DDPG"):
        assert rule_of(Patch(parts=[ExplorationBonus(ent_coef=0.01)]), DISCRETE, algo) == "ent_coef_unsupported"
        assert (
            rule_of(Patch(parts=[Hyperparameters(changes={"ent_coef": 0.01})]), DISCRETE, algo)
            == "ent_coef_unsupported"
        )
    check_fit(Patch(parts=[ExplorationBonus(ent_coef=0.01)]), DISCRETE, "PPO")
    check_fit(Patch(parts=[Hyperparameters(changes={"ent_coef": "auto"})]), CONTINUOUS, "SAC")
    check_fit(Patch(parts=[ExplorationBonus(count_bonus=0.1)]), DISCRETE, "DQN")


def test_hyperparameters_are_checked_against_the_constructor():
    with pytest.raises(PatchRejectedError, match="did you mean learning_rate") as info:
        check_fit(Patch(parts=[Hyperparameters(changes={"learning_rat": 1e-3})]), DISCRETE, "PPO")
    assert info.value.rule == "unknown_hyperparameter"
    assert rule_of(Patch(parts=[Hyperparameters(changes={"n_epochs": 5})]), DISCRETE, "DQN") == "unknown_hyperparameter"
    assert (
        rule_of(Patch(parts=[Hyperparameters(changes={"policy_kwargs": {}})]), DISCRETE, "PPO")
        == "frozen_hyperparameter"
    )
    for algo, name in (("PPO", "use_sde"), ("SAC", "use_sde"), ("PPO", "net_arch")):
        # a change of architecture is refused before any training, with the reason, not found out at load time
        with pytest.raises(PatchRejectedError, match=f"'{name}' changes the policy's architecture") as info:
            check_fit(Patch(parts=[Hyperparameters(changes={name: True, "gamma": 0.9})]), CONTINUOUS, algo)
        assert info.value.rule == "architecture_hyperparameter"
    check_fit(Patch(parts=[Hyperparameters(changes={"sde_sample_freq": 4})]), CONTINUOUS, "PPO")  # no new parameters
    check_fit(
        Patch(parts=[Hyperparameters(changes={"learning_rate": 1e-4, "n_steps": 64, "gamma": 0.99})]), DISCRETE, "PPO"
    )
    check_fit(
        Patch(parts=[Hyperparameters(changes={"exploration_final_eps": 0.1, "train_freq": [1, "step"]})]),
        DISCRETE,
        "DQN",
    )


@pytest.mark.parametrize(
    "changes",
    [
        {"learning_rate": 0},
        {"learning_rate": -1e-3},
        {"learning_rate": 5.0},
        {"learning_rate": "fast"},
        {"gamma": 0.0},
        {"gamma": 1.5},
        {"n_steps": 0},
        {"n_steps": 2.5},
        {"batch_size": True},
        {"clip_range": 0},
        {"ent_coef": -0.1},
        {"gae_lambda": 1.2},
        {"exploration_final_eps": 2},
    ],
)
def test_obviously_bad_values(changes):
    # no algorithm named: the value rules still apply
    assert rule_of(Patch(parts=[Hyperparameters(changes=changes)]), DISCRETE) == "bad_hyperparameter_value"


def test_non_finite_values():
    assert (
        rule_of(Patch(parts=[Hyperparameters(changes={"vf_coef": float("nan")})]), DISCRETE)
        == "non_finite_hyperparameter"
    )


def test_env_structure_rules():
    import gymnasium.spaces as S

    stages = [
        CurriculumStage(env_kwargs={"g": 5.0}, fraction=0.5),
        CurriculumStage(env_kwargs={"g": 10.0}, fraction=0.4),
    ]
    assert rule_of(Patch(parts=[Curriculum(stages=stages)])) == "curriculum_fractions"
    stages[1] = CurriculumStage(env_kwargs={"g": 10.0}, fraction=0.5)
    check_fit(Patch(parts=[Curriculum(stages=stages)]), CONTINUOUS)
    assert rule_of(Patch(parts=[FrameStack(n=4)]), observation_space=S.Discrete(16)) == "frame_stack_needs_box"
    assert rule_of(Patch(parts=[Normalization()]), observation_space=S.Discrete(16)) == "normalization_needs_box"
    check_fit(Patch(parts=[Normalization(obs=False, reward=True)]), DISCRETE, observation_space=S.Discrete(16))
    check_fit(Patch(parts=[FrameStack(n=4)]), CONTINUOUS, observation_space=S.Box(-1, 1, (3,)))


# --------------------------------------------------------------------------- the command line


def _remedy(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run the real ``remedy`` entry point in-process (its error mapping included); (exit code, stdout, stderr)."""
    from remedy.kb.cli import main

    monkeypatch.setattr(sys, "argv", ["remedy", "patch", "check", *args])
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "300")
    code = 0
    try:
        main()
    except SystemExit as ex:
        code = int(ex.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_accepts_and_rejects_with_exit_codes(monkeypatch, capsys):
    code, out, _ = _remedy(
        monkeypatch, capsys, str(HERE / "good_patches" / "effort_penalty.yaml"), "--env", "Pendulum-v1"
    )
    assert code == 0 and out.startswith("accepted") and "fuzz calls" in out
    code, out, _ = _remedy(monkeypatch, capsys, str(HERE / "hostile" / "open_read.yaml"), "--env", "Pendulum-v1")
    lines = out.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("rejected: forbidden-name:open: ")


def test_cli_json_and_bad_input(monkeypatch, capsys):
    code, out, _ = _remedy(
        monkeypatch, capsys, str(HERE / "hostile" / "returns_nan.yaml"), "--env", "Pendulum-v1", "--json"
    )
    data = json.loads(out)
    assert code == 1 and data["ok"] is False and data["rule"] == "fuzz:non-finite" and data["fuzz"]["problems"]
    good = str(HERE / "good_patches" / "effort_penalty.yaml")
    for args, message in (
        (("--env", "Pendulum-v1", "--env-kwargs", "{g: 1"), "--env-kwargs is not valid JSON"),
        (("--env", "Pendulum-v1", "--env-kwargs", "[1]"), "must be a JSON object"),
        (("--env", "Pendulm-v1"), "did you mean 'Pendulum-v1'"),
        (("--env", "Pendulum-v1", "--algo", "PP0"), "did you mean 'PPO'"),
    ):
        code, _, err = _remedy(monkeypatch, capsys, good, *args)
        assert code == 1 and message in err and len(err.strip().splitlines()) == 1, err
    code, _, err = _remedy(monkeypatch, capsys, str(HERE / "nope.yaml"), "--env", "Pendulum-v1")
    assert code == 1 and "does not exist" in err
