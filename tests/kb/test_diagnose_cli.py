"""`remedy diagnose` and the facade-level diagnosis against a real KB and a real (tiny) run directory."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from remedy.cases.errors import DiagnosisError, LMError
from remedy.cases.model import (
    Case,
    Cause,
    Diagnosis,
    Effect,
    EnvTraits,
    RemedyFamily,
    RootCause,
    Signature,
    Source,
    Status,
    Subject,
    Verification,
)
from remedy.cases.patches.check import check_fit
from remedy.cases.patches.io import load_patch
from remedy.cases.patches.spec import Patch, TrainingBudget
from remedy.kb.cli import app
from remedy.kb.diagnose import KBRetriever, diagnose_run, diagnose_signature
from remedy.retrieval.diagnosis import Attempt

LANDER = Subject(
    env_id="LunarLander-v3",
    env_kwargs={"continuous": True},
    algo="PPO",
    train_steps=150_000,
    success="last reward >= 100",
    traits=EnvTraits(action_space="continuous", obs_dim=8, action_dim=2),
)
HOVER = Signature(
    features={"truncation_rate": 1.0, "success_rate": 0.0, "ep_len_frac": 1.0, "ep_len_mean": 1000.0},
    symptoms=["hovering", "timeouts", "never_succeeds", "low_success"],
    summary="Continuous LunarLander-v3 agent (PPO): every episode hits the 1000-step time limit, "
    "none land; the lander hovers above the pad.",
)
PENDULUM = Subject(
    env_id="Pendulum-v1",
    algo="SAC",
    train_steps=20_000,
    traits=EnvTraits(action_space="continuous", obs_dim=3, action_dim=1),
)
JERKY = Signature(features={"action_jerk": 0.8}, symptoms=["jerky_actions"], summary="Pendulum torque chatters")
SCALED_SUBJECT = Subject(
    env_id="CartPole-v1",
    algo="PPO",
    train_steps=100_000,
    traits=EnvTraits(action_space="discrete", obs_dim=4, action_dim=2),
)
SCALED = Signature(
    features={"obs_abs_max": 3000.0},
    symptoms=["unscaled_observations", "low_success"],
    summary="CartPole observations scaled by 1000",
)


def _case(
    case_id: str,
    cause: str,
    patch: Patch,
    status: str,
    *,
    scenario: str | None = None,
    action_space: str = "continuous",
) -> Case:
    diff = 60.0 if status == "improved" else -60.0
    eff = Effect(
        metric="success_rate",
        treatment=diff,
        control=0.0,
        diff=diff,
        ci_low=min(diff / 2, diff * 1.5),
        ci_high=max(diff / 2, diff * 1.5),
    )
    subject = LANDER.model_copy(update={"traits": EnvTraits(action_space=action_space, obs_dim=8, action_dim=2)})
    return Case(
        case_id=case_id,
        source=Source.bench,
        subject=subject,
        signature=HOVER,
        scenario=scenario,
        diagnosis=Diagnosis(causes=[Cause(cause=cause, confidence=0.9)]),
        patch=patch,
        verification=Verification(status=Status(status), effect=eff, seeds=3),
    )


def _rank(report, cause: RootCause) -> int:
    causes = [c.cause for c in report.diagnosis.causes]
    return causes.index(cause) if cause in causes else len(causes)


# ---- cold KB ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("subject", "signature", "cause", "family"),
    [
        (LANDER, HOVER, RootCause.reward_misspecification, RemedyFamily.reward_shaping),
        (PENDULUM, JERKY, RootCause.action_jitter, RemedyFamily.action_smoothness),
        (SCALED_SUBJECT, SCALED, RootCause.observation_scaling, RemedyFamily.normalization),
    ],
)
def test_cold_kb_gives_sensible_advice_from_priors(kb, subject, signature, cause, family):
    report = diagnose_signature(kb, subject, signature)
    assert report.top_cause == cause
    assert report.candidates[0].family == family
    assert report.diagnosis.cited_cases == [] and report.diagnosis.cited_rules


# ---- warm KB ----------------------------------------------------------------------------------

BUDGET = Patch(parts=[TrainingBudget(extra_steps=40_000)])


def test_verified_improved_case_moves_its_cause_up(kb):
    cold = diagnose_signature(kb, LANDER, HOVER)
    kb.add(_case("c-hover-budget", "undertraining", BUDGET, "improved"))
    warm = diagnose_signature(kb, LANDER, HOVER)
    assert _rank(warm, RootCause.undertraining) < _rank(cold, RootCause.undertraining)
    assert warm.top_cause == RootCause.undertraining
    assert "c-hover-budget" in warm.diagnosis.cited_cases
    assert warm.candidates[0].family == RemedyFamily.training_budget


def test_the_next_round_doubles_a_budget_that_helped_without_a_working_agent(kb):
    rising = Signature(features={"success_rate": 0.0}, symptoms=["undertrained", "never_succeeds"], summary="rising")
    first = diagnose_signature(kb, PENDULUM, rising)
    budget = next(c for c in first.candidates if c.family == RemedyFamily.training_budget)
    extra = budget.patch.parts[0].extra_steps
    helped = Attempt(patch=budget.patch, status="no_effect", effect=+40.0, case_id="c-round1")
    again = diagnose_signature(kb, PENDULUM, rising, tried=[helped])
    bigger = [c for c in again.candidates if c.family == RemedyFamily.training_budget]
    assert [c.patch.parts[0].extra_steps for c in bigger] == [2 * extra] and "c-round1" in bigger[0].cites
    hurt = Attempt(patch=budget.patch, status="no_effect", effect=-40.0)
    same = diagnose_signature(kb, PENDULUM, rising, tried=[hurt])
    assert all(c.patch.parts[0].extra_steps <= extra for c in same.candidates if c.patch.budget_only)


def test_verified_worse_case_demotes_its_family(kb):
    cold = diagnose_signature(kb, LANDER, HOVER)
    assert cold.candidates[0].family == RemedyFamily.reward_shaping
    kb.add(_case("c-hover-worse", "reward_misspecification", cold.candidates[0].patch, "worse"))
    warm = diagnose_signature(kb, LANDER, HOVER)
    families = [c.family for c in warm.candidates]
    assert families[0] != RemedyFamily.reward_shaping
    assert "c-hover-worse" in warm.diagnosis.cited_cases


def test_the_evaluated_scenario_never_leaks(kb):
    kb.add(_case("c-answer", "undertraining", BUDGET, "improved", scenario="lunar_hover"))
    leaked = diagnose_signature(kb, LANDER, HOVER)
    clean = diagnose_signature(kb, LANDER, HOVER, exclude_scenario="lunar_hover")
    assert "c-answer" in leaked.diagnosis.cited_cases
    assert "c-answer" not in clean.diagnosis.cited_cases and clean.top_cause == RootCause.reward_misspecification


def test_retrieval_keeps_to_the_same_action_space(kb):
    kb.add(_case("c-discrete", "undertraining", BUDGET, "improved", action_space="discrete"))
    hits = KBRetriever(kb).similar(HOVER, 5, action_space="continuous")
    assert hits == []
    assert diagnose_signature(kb, LANDER, HOVER).diagnosis.cited_cases == []


def test_k_neighbours_are_past_failures_with_all_their_attempts(kb):
    # eleven attempts of one past failure fill the ten nearest cases; the next failure is past them
    for i in range(11):
        kb.add(_case(f"c-lr-{i:02d}", "undertraining", BUDGET, "no_effect", scenario="lunar_lr"))
    kb.add(_case("c-other", "undertraining", BUDGET, "improved", scenario="lunar_other"))
    by_case = diagnose_signature(kb, LANDER, HOVER, neighbours="cases")
    by_patient = diagnose_signature(kb, LANDER, HOVER, neighbours="patients")
    assert "c-other" not in by_case.diagnosis.cited_cases and "c-other" in by_patient.diagnosis.cited_cases
    with pytest.raises(ValueError, match="neighbours"):
        diagnose_signature(kb, LANDER, HOVER, neighbours="everyone")


# ---- a real run directory ---------------------------------------------------------------------


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


def test_diagnose_run_on_a_real_agent(run_dir, kb):
    report = diagnose_run(kb, run_dir, n_episodes=4, seed=1)
    assert "never_succeeds" in report.signature.symptoms
    assert report.top_cause == RootCause.undertraining
    assert report.candidates and all(c.patch.parts for c in report.candidates)
    for cand in report.candidates:  # every candidate fits the subject's traits and algorithm
        check_fit(cand.patch, EnvTraits(action_space="discrete", obs_dim=4, action_dim=2), "PPO")
    assert report == diagnose_run(kb, run_dir, n_episodes=4, seed=1)  # same seed, same report


def test_cli_json_and_patch_files(run_dir, tmp_path, kb_path, kb):
    out = tmp_path / "patches"
    result = CliRunner().invoke(
        app, ["diagnose", str(run_dir), "--json", "--episodes", "4", "--kb", str(kb_path), "--write-patches", str(out)]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["diagnosis"]["causes"][0]["cause"] == "undertraining"
    assert data["diagnosis"]["backend"] == "offline" and data["candidates"]
    files = sorted(out.glob("*.yaml"))
    assert [str(f) for f in files] == data["patch_files"]
    assert load_patch(files[0]).model_dump(mode="json") == data["candidates"][0]["patch"]


def test_cli_table_without_a_kb_warns_and_creates_nothing(run_dir, tmp_path):
    missing = tmp_path / "no-kb"
    result = CliRunner().invoke(app, ["diagnose", str(run_dir), "--episodes", "3", "--kb", str(missing)])
    assert result.exit_code == 0, result.output
    for text in (
        "Root causes",
        "undertraining",
        "Candidate patches",
        "training_budget",
        "prior-tiny-budget",
        "built-in priors only",
    ):
        assert text in result.output
    assert not missing.exists()


def test_cli_unknown_diagnoser_fails_before_any_rollout(tmp_path):
    result = CliRunner().invoke(app, ["diagnose", str(tmp_path), "--diagnoser", "oracle"])
    assert isinstance(result.exception, DiagnosisError) and "unknown diagnoser 'oracle'" in str(result.exception)


def test_cli_llm_without_an_lm_says_what_to_set(tmp_path, monkeypatch):
    monkeypatch.delenv("REMEDY_LM", raising=False)
    result = CliRunner().invoke(app, ["diagnose", str(tmp_path), "--diagnoser", "llm"])
    assert isinstance(result.exception, LMError) and "REMEDY_LM" in str(result.exception)


def test_cli_bad_run_dir_is_one_red_line(tmp_path, monkeypatch, capsys):
    from remedy.kb.cli import main

    monkeypatch.setattr(sys, "argv", ["remedy", "diagnose", str(tmp_path / "nope"), "--kb", str(tmp_path / "kb")])
    with pytest.raises(SystemExit) as ex:
        main()
    err = capsys.readouterr().err
    assert ex.value.code == 1 and "error:" in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2
