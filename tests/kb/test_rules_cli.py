"""`remedy mine` / `remedy rules ...` on a real KB, and accepted rules changing what `remedy diagnose` says."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from remedy.cases.model import Case, Cause, Diagnosis, Effect, EnvTraits, Signature, Subject, Verification
from remedy.cases.patches import Patch
from remedy.kb import KnowledgeBase
from remedy.kb.cli import app

runner = CliRunner()
_T0 = datetime(2026, 12, 1, tzinfo=UTC)
_PENDULUM = ("Pendulum-v1", "continuous", 3, 1)
_LANDER = ("LunarLander-v3", "discrete", 8, 4)


def _case(n: int, env: tuple, family: dict, status: str, symptoms: list[str], cause: str) -> Case:
    env_id, space, obs_dim, act_dim = env
    diff = 0.5 if status == "improved" else 0.0
    return Case(
        case_id=f"c-rule-{n:03d}",
        source="bench",
        subject=Subject(
            env_id=env_id,
            algo="PPO",
            train_steps=50_000,
            traits=EnvTraits(action_space=space, obs_dim=obs_dim, action_dim=act_dim),
        ),
        signature=Signature(features={}, symptoms=symptoms, summary=f"{env_id} agent, {' and '.join(symptoms)}"),
        diagnosis=Diagnosis(causes=[Cause(cause=cause, confidence=0.6)]),
        patch=Patch.from_data(family),
        verification=Verification(
            status=status,
            effect=Effect(
                metric="success_rate", treatment=diff, control=0.0, diff=diff, ci_low=diff - 0.3, ci_high=diff + 0.3
            ),
            seeds=3,
            stage="confirm",
        ),
        scenario=f"scn-{n % 4}",
        provenance={"created_at": _T0 + timedelta(minutes=n)},
    )


def _cases() -> list[Case]:
    """Chattering pendulums that more training fixed (5 of 6), and landers a budget did not help."""
    budget = {"kind": "training_budget", "extra_steps": 25_000}
    out = [
        _case(i, _PENDULUM, budget, "improved" if i else "no_effect", ["jerky_actions", "low_success"], "undertraining")
        for i in range(6)
    ]
    out += [
        _case(10 + i, _LANDER, budget, "no_effect", ["hovering", "timeouts"], "reward_misspecification")
        for i in range(6)
    ]
    return out


@pytest.fixture
def kb_dir(tmp_path, embedder, monkeypatch) -> Path:
    import remedy.kb.facade as facade

    monkeypatch.setattr(facade, "default_embedder", lambda: embedder)  # the session's model, loaded once
    from remedy.kb.cli.common import console

    monkeypatch.setattr(console, "width", 200)
    root = tmp_path / "kb"
    with KnowledgeBase.open(root, embedder=embedder) as kb:
        kb.add_many(_cases())
    return root


def _ok(*args) -> str:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


def _diagnose(kb_dir: Path) -> dict:
    out = _ok(
        "diagnose", "--describe", "the torque chatters between its bounds", "--env", "Pendulum-v1", "--algo", "PPO",
        "--action-space", "continuous", "--tags", "jerky_actions,low_success", "--kb", kb_dir, "--json",
    )  # fmt: skip
    return json.loads(out)


def _rank(report: dict, family: str) -> tuple[int, float]:
    fams = [c["family"] for c in report["candidates"]]
    return fams.index(family), report["candidates"][fams.index(family)]["score"]


def test_mine_then_accept_changes_the_diagnosis_and_reject_undoes_it(kb_dir):
    mined = json.loads(_ok("mine", "--kb", kb_dir, "--json"))
    assert mined["attempts"] == 12 and mined["rules"], mined
    rule = next(r for r in mined["rules"] if r["family"] == "training_budget")
    assert rule["evidence"]["wins"] == 5 and rule["evidence"]["support"] == 6
    assert {"field": "symptom", "value": "jerky_actions"} in rule["conditions"] or any(
        c["value"] in ("continuous", "small") for c in rule["conditions"]
    )
    before = _diagnose(kb_dir)
    assert rule["id"] not in before["diagnosis"]["cited_rules"]  # proposed rules do not vote

    assert "accepted " + rule["id"] in _ok("rules", "accept", rule["id"], "--kb", kb_dir, "--reviewer", "ada")
    accepted = _diagnose(kb_dir)
    assert rule["id"] in accepted["diagnosis"]["cited_rules"]
    rank_before, score_before = _rank(before, "training_budget")
    rank_after, score_after = _rank(accepted, "training_budget")
    assert score_after > score_before and rank_after <= rank_before
    causes = [c["cause"] for c in accepted["diagnosis"]["causes"]]
    assert causes.index("undertraining") <= [c["cause"] for c in before["diagnosis"]["causes"]].index("undertraining")

    _ok("rules", "reject", rule["id"], "--note", "pendulum only", "--kb", kb_dir)
    rejected = _diagnose(kb_dir)
    assert rejected["candidates"] == before["candidates"] and rejected["diagnosis"] == before["diagnosis"]


def test_rules_list_show_and_re_mine(kb_dir):
    first = _ok("mine", "--kb", kb_dir)
    assert "mined rules" in first and "training_budget" in first and "new " in first
    ids = [r["id"] for r in json.loads(_ok("rules", "list", "--kb", kb_dir, "--json"))]
    assert ids and len(ids) == len(set(ids))
    again = _ok("mine", "--kb", kb_dir)
    assert f"new 0 / updated {len(ids)} / flagged 0" in again
    assert [r["id"] for r in json.loads(_ok("rules", "list", "--kb", kb_dir, "--json"))] == ids
    shown = _ok("rules", "show", ids[0], "--kb", kb_dir)
    assert "supporting cases" in shown and "counter-evidence" in shown and "c-rule-" in shown
    assert "review   none yet" in shown
    _ok("rules", "accept", ids[0], "--kb", kb_dir, "--reviewer", "ada", "--note", "seen it")
    assert "review   accepted by ada" in _ok("rules", "show", ids[0], "--kb", kb_dir)
    assert ids[0] in _ok("rules", "list", "--status", "accepted", "--kb", kb_dir)
    assert "no rules rejected" in _ok("rules", "list", "--status", "rejected", "--kb", kb_dir)


def test_rule_errors_are_one_line_and_write_nothing(kb_dir, tmp_path, monkeypatch, capsys):
    import sys

    from remedy.kb.cli import main

    def run(*args) -> tuple[int, str]:
        monkeypatch.setattr(sys, "argv", ["remedy", *map(str, args)])
        capsys.readouterr()
        try:
            main()
            code = 0
        except SystemExit as ex:
            code = ex.code if isinstance(ex.code, int) else 1
        return code, capsys.readouterr().err

    _ok("mine", "--kb", kb_dir)
    rid = json.loads(_ok("rules", "list", "--kb", kb_dir, "--json"))[0]["id"]
    code, err = run("rules", "accept", rid[:-1] + "x", "--kb", kb_dir)
    assert code == 1 and err.startswith("error: no rule") and f"did you mean '{rid}'" in " ".join(err.split())
    code, err = run("rules", "reject", rid, "--note", " ", "--kb", kb_dir)
    assert code == 1 and "--note" in err
    small = tmp_path / "small"
    with KnowledgeBase.open(small, reconcile=False) as kb:
        kb.store.add_many(_cases()[:4])
    code, err = run("mine", "--kb", small)
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "need at least 10 measured cases" in " ".join(err.split()) and "the KB has 4" in err
    assert json.loads(_ok("rules", "list", "--kb", small, "--json")) == []  # nothing written
