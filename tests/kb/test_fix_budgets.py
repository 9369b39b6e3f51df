"""The fix loop on a tiny CartPole patient: budgets learned from the KB (source recorded), rollouts computed once.

Real KB (DuckDB + LanceDB + the bundled embedder), real evidence rollouts, real fine-tunes in
worker processes. A scripted diagnoser fixes the candidates; the KB holds three confirmed
fixes of the same family with the patient's own signature, at known budgets.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from remedy.cases.evidence.rollouts import collect_evidence
from remedy.cases.evidence.rundir import RunConfig, RunDir
from remedy.cases.evidence.signature import compute_signature
from remedy.cases.model import (
    Case,
    Cause,
    Diagnosis,
    Effect,
    RemedyFamily,
    RootCause,
    Source,
    Stage,
    Status,
    Verification,
)
from remedy.cases.patches.spec import Patch
from remedy.cases.verify.verification import VerifyConfig
from remedy.kb.fixloop import fix, one_torch_thread
from remedy.retrieval.diagnosis import CandidatePatch, DiagnosisContext, DiagnosisReport

TINY = VerifyConfig(seeds=1, budget_steps=256, eval_episodes=3, n_envs=2, n_boot=200)
PATIENT = RunConfig(
    env_id="CartPole-v1",
    algo="PPO",
    train_steps=1024,
    n_envs=2,
    hyperparams={"n_steps": 64, "batch_size": 64, "n_epochs": 2, "policy_kwargs": {"net_arch": [16]}},
    success={"kind": "return_threshold", "threshold": 100},
)
LR = Patch.from_data({"kind": "hyperparameters", "changes": {"learning_rate": 0.001}})
#: (budget steps, their patient's training steps): ratios 0.25, 0.5, 0.75 -> median 0.5 -> 512 of 1024
PAST = [(250, 1000), (1000, 2000), (3000, 4000)]


class Scripted:
    """A Diagnoser that offers ``offers[round]``."""

    name = "scripted"

    def __init__(self, offers: list[list[Patch]]) -> None:
        self.offers, self.rounds = offers, 0

    def diagnose(self, ctx: DiagnosisContext) -> DiagnosisReport:
        self.rounds += 1
        patches = self.offers[min(self.rounds, len(self.offers)) - 1]
        cands = [CandidatePatch(patch=p, family=RemedyFamily(p.parts[0].kind), rationale="scripted") for p in patches]
        diag = Diagnosis(causes=[Cause(cause=RootCause.undertraining, confidence=0.9)], backend="scripted")
        return DiagnosisReport(signature=ctx.signature, diagnosis=diag, candidates=cands)


@pytest.fixture(scope="module")
def patient(tmp_path_factory):
    from remedy.cases.verify.training import train

    one_torch_thread()
    return train(PATIENT, tmp_path_factory.mktemp("fixbudget") / "run", seed=0).path


def _past_fixes(kb, patient) -> list[str]:
    """Three confirmed learning-rate fixes with the patient's own signature, at the budgets of :data:`PAST`."""
    run = RunDir.load(patient)
    subject = run.subject()
    signature = compute_signature(collect_evidence(run, n_episodes=3, seed=0), subject)
    ids = []
    for i, (budget, steps) in enumerate(PAST):
        effect = Effect(
            metric="return_iqm", treatment=50, control=20, diff=30, ci_low=5, ci_high=55, method="welch_seeds"
        )
        kb.add(
            Case(
                case_id=f"c-past-{i}",
                source=Source.verified,
                subject=subject.model_copy(update={"train_steps": steps}),
                signature=signature,
                diagnosis=Diagnosis(causes=[Cause(cause=RootCause.unstable_optimization, confidence=0.7)]),
                patch=Patch.from_data({"kind": "hyperparameters", "changes": {"learning_rate": 0.0005 + i * 1e-4}}),
                verification=Verification(
                    status=Status.improved, stage=Stage.confirm, effect=effect, seeds=3, budget_steps=budget
                ),
            )
        )
        ids.append(f"c-past-{i}")
    return ids


def test_fix_verifies_at_the_kb_budget_and_records_its_source_and_rollouts_once(kb, patient, tmp_path):
    ids = _past_fixes(kb, patient)
    budget = Patch.from_data({"kind": "training_budget", "extra_steps": 256})
    result = fix(
        kb,
        patient,
        store=kb,
        rounds=2,
        candidates=1,
        diagnoser=Scripted([[LR], [budget]]),
        config=replace(TINY, budget_steps=None),
        out_dir=tmp_path / "fixes",
        n_episodes=3,
    )
    lr, more = result.attempts
    assert lr.budget_source == "kb" and lr.budget_steps == 512 and set(lr.budget_cases) == set(ids)
    stored = kb.get(lr.case_id).verification
    assert stored.budget_source == "kb" and stored.budget_steps == 512 and set(stored.budget_cases) == set(ids)
    assert more.budget_source == "patch" and more.budget_steps == 256  # a budget patch: its own extra steps
    data = json.loads(json.dumps(result.as_dict()))  # what `remedy fix --json` prints
    assert data["attempts"][0]["budget_source"] == "kb" and data["attempts"][0]["budget_cases"] == list(lr.budget_cases)
    # round 2's diagnosis (3 + 3 episodes at seed 0), the second verification's evidence (3 + 3 at the
    # evaluation seed) and the budget patch's checkpoint control (the evidence's 3 deterministic episodes:
    # this patient has no wrappers, so training and evaluation views are the same env) were all reused
    saved = data["rollouts"]
    assert saved["reused_episodes"] == 15 and saved["hits"] == 5 and saved["reused_env_steps"] > 0
    assert kb.get(more.case_id).verification.status in {Status.inconclusive, Status.no_effect, Status.worse}


def test_the_users_budget_wins_over_the_kb(kb, patient, tmp_path):
    _past_fixes(kb, patient)
    result = fix(
        kb,
        patient,
        store=kb,
        rounds=1,
        candidates=1,
        diagnoser=Scripted([[LR]]),
        config=TINY,
        out_dir=tmp_path / "fixes",
        n_episodes=3,
    )
    (a,) = result.attempts
    assert (a.budget_source, a.budget_steps, a.budget_cases) == ("user", 256, ())


def test_cli_fix_json_shows_the_budget_source(kb_path, embedder, patient, monkeypatch, capsys):
    import sys

    from remedy.kb import KnowledgeBase
    from remedy.kb.cli import main

    with KnowledgeBase.open(kb_path, embedder=embedder) as kb:
        _past_fixes(kb, patient)
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "remedy",
            "fix",
            str(patient),
            "--kb",
            str(kb_path),
            "--rounds",
            "1",
            "--candidates",
            "1",
            "--seeds",
            "1",
            "--json",
        ],
    )
    try:
        main()
    except SystemExit as ex:  # typer may exit 0 explicitly
        assert ex.code in (0, None)
    out = json.loads(capsys.readouterr().out)
    # the offline vote follows the three confirmed learning-rate fixes; that family is verified at their budget
    lr = [a for a in out["attempts"] if a["family"] == "hyperparameters"]
    assert lr and all(a["budget_source"] == "kb" and a["budget_steps"] == 512 for a in lr)
    assert all(sorted(a["budget_cases"]) == ["c-past-0", "c-past-1", "c-past-2"] for a in lr)
    assert out["rollouts"]["computed_episodes"] > 0


def test_the_bench_passes_no_budget_of_its_own_so_the_scenarios_is_recorded_as_such():
    from remedy.cases.verify.budgets import choose_budget
    from remedy.cases.verify.scenarios import load_scenarios
    from remedy.kb.bench import BenchSettings

    scenarios = load_scenarios()
    for s in scenarios:
        choice = choose_budget(BenchSettings().verify_config(s), s.train_steps, s.finetune_budget)
        assert choice.steps == s.budget and choice.source == ("scenario" if s.finetune_budget else "prior")
    assert BenchSettings(budget=500).verify_config(scenarios[0]).budget_steps == 500
