"""Which budget a verification runs at: the user's, else the KB's, else the scenario's, else the prior."""

from __future__ import annotations

import pytest

from remedy.cases.errors import VerificationError
from remedy.cases.verify.budgets import LearnedBudget, choose_budget
from remedy.cases.verify.verification import VerifyConfig

LEARNED = LearnedBudget(steps=7_000, fraction=0.07, cases=["c-1", "c-2", "c-3"])


def test_the_users_budget_always_wins():
    got = choose_budget(VerifyConfig(budget_steps=500), 100_000, declared=30_000, learned=LEARNED)
    assert (got.steps, got.source, got.cases) == (500, "user", ())


def test_a_learned_budget_beats_the_scenario_and_the_prior():
    got = choose_budget(VerifyConfig(), 100_000, declared=30_000, learned=LEARNED)
    assert (got.steps, got.source, got.cases) == (7_000, "kb", ("c-1", "c-2", "c-3"))
    assert "median of 3" in got.text()


def test_without_a_learned_budget_the_scenario_then_the_prior_fraction():
    scenario = choose_budget(VerifyConfig(), 100_000, declared=30_000)
    prior = choose_budget(VerifyConfig(budget_fraction=0.25), 100_000)
    assert (scenario.steps, scenario.source) == (30_000, "scenario")
    assert (prior.steps, prior.source) == (25_000, "prior")
    assert VerifyConfig().budget_for(100_000) == 20_000  # the old entry point still applies the default rule


def test_no_budget_at_all_is_the_users_to_fix():
    with pytest.raises(VerificationError, match="--budget"):
        choose_budget(VerifyConfig(), None)


def test_cli_verify_records_and_prints_the_budget_source(cartpole_run, tmp_path, monkeypatch, capsys):
    import json
    import sys

    import yaml

    from remedy.kb import cli

    patch_file = tmp_path / "patch.yaml"
    patch_file.write_text(yaml.safe_dump({"kind": "hyperparameters", "changes": {"ent_coef": 0.01}}))
    args = [str(cartpole_run), "--patch", str(patch_file), "--seeds", "1", "--episodes", "3", "--no-confirm"]
    monkeypatch.setattr(sys, "argv", ["remedy", "verify", *args, "--no-store", "--json"])
    with pytest.raises(SystemExit) as ex:
        cli.main()
        raise SystemExit(0)
    assert not ex.value.code
    v = json.loads(capsys.readouterr().out)["case"]["verification"]
    # no --budget, no scenario, no KB budget: 20% of the run's 512 training steps
    assert (v["budget_source"], v["budget_steps"], v["budget_cases"]) == ("prior", round(0.2 * 512), [])
    monkeypatch.setattr(sys, "argv", ["remedy", "verify", *args, "--no-store", "--budget", "64"])
    with pytest.raises(SystemExit):
        cli.main()
        raise SystemExit(0)
    assert "source user" in capsys.readouterr().out
