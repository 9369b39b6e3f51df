"""The fix loop's stop rule: stop on ``fixed`` (the agent now works), not on a merely ``improved`` confirmation;
and exploration gives a seeded share of slots to lower-ranked candidates, recorded as such.

Verification is replaced by scripted outcomes (the loop's own control flow is what is tested; the real
verification path is covered by test_fixloop.py), so nothing trains here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from remedy.cases.model import Cause, Diagnosis, Effect, RemedyFamily, RootCause, Signature, Stage, Status
from remedy.cases.patches.spec import Patch
from remedy.cases.verify.racing import RaceSettings
from remedy.cases.verify.verification import VerifyConfig
from remedy.kb import fix_state, fixloop
from remedy.kb.fixloop import AttemptRecord, fix
from remedy.retrieval.diagnosis import CandidatePatch, DiagnosisReport

PATIENT = Path(__file__).parents[2] / "cases" / "scenarios" / "checkpoints" / "cartpole_undertrained"


def _lr(x: float) -> Patch:
    return Patch.from_data({"kind": "hyperparameters", "changes": {"learning_rate": x}})


def _report(patches: list[Patch]) -> DiagnosisReport:
    cands = [
        CandidatePatch(patch=p, family=RemedyFamily.hyperparameters, score=1.0 / (i + 1)) for i, p in enumerate(patches)
    ]
    diag = Diagnosis(causes=[Cause(cause=RootCause.undertraining, confidence=0.9)], backend="scripted")
    return DiagnosisReport(signature=Signature(summary="scripted"), diagnosis=diag, candidates=cands)


def _scripted(monkeypatch, offers: list[list[Patch]], outcomes: dict[float, bool | None]) -> list[Patch]:
    """Diagnoses offer ``offers[round]``; a candidate's confirmation is improved with ``fixed=outcomes[lr]``
    (None: its screen does not clear). Returns the patches verified, in order."""
    verified: list[Patch] = []
    rounds = iter(offers)
    monkeypatch.setattr(fixloop, "diagnose_run", lambda *a, **k: _report(next(rounds)))

    def screen_then_confirm(loop, rnd, cand, report, label, stage_one=None):
        verified.append(cand.patch)
        works = outcomes[cand.patch.parts[0].changes["learning_rate"]]
        if works is None:
            return None
        eff = Effect(metric="success_rate", treatment=0.3, control=0.0, diff=0.3, ci_low=0.1, ci_high=0.5)
        rec = AttemptRecord(
            round=rnd,
            case_id=f"c{len(verified)}",
            patch=cand.patch,
            family=cand.family.value,
            status=Status.improved.value,
            effect=eff,
            env_steps=10,
            wall_time_s=0.0,
            stage=Stage.confirm.value,
            fixed=works,
        )
        loop.attempts.append(rec)
        if loop.fix_at is None:
            loop.fix_at = (10, 0.0, len(loop.attempts))
        return rec

    monkeypatch.setattr(fixloop, "_screen_then_confirm", screen_then_confirm)
    return verified


def _fix(tmp_path, **kw):
    return fix(
        None,
        PATIENT,
        store=None,
        config=VerifyConfig(seeds=1, budget_steps=256, eval_episodes=3, n_envs=2),
        race=RaceSettings(enabled=False),
        out_dir=tmp_path / "fixes",
        **kw,
    )


def test_improved_but_failing_goes_on_and_the_fix_that_works_wins(monkeypatch, tmp_path):
    verified = _scripted(monkeypatch, [[_lr(1e-3)], [_lr(3e-4)], [_lr(1e-4)]], {1e-3: False, 3e-4: True, 1e-4: True})
    result = _fix(tmp_path, rounds=3, candidates=1)
    assert verified == [_lr(1e-3), _lr(3e-4)]  # round 1 improved but failing: round 2; its fix stops the loop
    assert result.improved and result.fixed and result.winner.patch == _lr(3e-4)
    assert "the agent now works" in result.stop_reason
    assert result.as_dict()["fixed"] is True and result.as_dict()["improved"] is True


def test_only_improved_is_not_fixed(monkeypatch, tmp_path):
    _scripted(monkeypatch, [[_lr(1e-3)], [_lr(3e-4)]], {1e-3: False, 3e-4: None})
    result = _fix(tmp_path, rounds=2, candidates=1)
    assert result.improved and not result.fixed and result.winner.patch == _lr(1e-3)
    assert "still fails" in result.stop_reason


def test_exploration_takes_lower_ranked_candidates_and_says_so(monkeypatch, tmp_path):
    offers = [[_lr(x) for x in (1e-3, 3e-4, 1e-4, 3e-5, 1e-5)]]
    verified = _scripted(monkeypatch, offers, dict.fromkeys((1e-3, 3e-4, 1e-4, 3e-5, 1e-5), None))
    _fix(tmp_path, rounds=1, candidates=2, explore=1.0, explore_seed=3)
    top2 = {p.model_dump_json() for p in offers[0][:2]}
    assert len(verified) == 2 and not {p.model_dump_json() for p in verified} & top2  # both slots explored
    again = _scripted(monkeypatch, offers, dict.fromkeys((1e-3, 3e-4, 1e-4, 3e-5, 1e-5), None))
    _fix(tmp_path, rounds=1, candidates=2, explore=0.0)
    assert again == offers[0][:2]


def test_how_chosen_is_recorded(monkeypatch):
    report = _report([_lr(1e-3), _lr(3e-4)])
    loop = type("L", (), {"explored": {_lr(3e-4).model_dump_json()}})()
    first = fix_state.how_chosen(loop, report, report.candidates[0])
    second = fix_state.how_chosen(loop, report, report.candidates[1])
    assert first == {"chosen_by": "diagnosis", "rank": 1, "score": 1.0}
    assert second["chosen_by"] == "exploration" and second["rank"] == 2
    assert fix_state.chosen_tags(second) == ["chosen:exploration", "rank:2", "score:0.5"]


def test_a_bad_exploration_share_is_refused(tmp_path):
    from remedy.cases.errors import VerificationError

    with pytest.raises(VerificationError, match="exploration share"):
        _fix(tmp_path, rounds=1, explore=1.5)
