"""The fix loop on a tiny CartPole patient: real diagnosis, real verification in worker processes, real KB.

A scripted diagnoser (the ``Diagnoser`` seam) fixes which candidates each round
offers, so the loop's own behaviour is what is tested: every attempt stored with
its diagnosis and parent, hostile candidates recorded as ``failed`` without
stopping the loop, what was tried handed to the next diagnosis, already-tried
patches never verified twice, a cleared screen confirmed on fresh seeds, and the
stop at the first confirmed improvement.
"""

from __future__ import annotations

import pytest

from remedy.cases.evidence.rundir import RunConfig
from remedy.cases.model import Cause, Diagnosis, Effect, RemedyFamily, RootCause, Source, Stage, Status
from remedy.cases.patches.io import load_patch
from remedy.cases.patches.spec import Patch
from remedy.cases.verify.racing import RaceSettings
from remedy.cases.verify.verification import ScenarioRef, VerifyConfig
from remedy.kb.fixloop import AttemptRecord, FixResult, fix, one_torch_thread
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


def _hostile(i: int) -> Patch:
    code = (
        f"import os\n\ndef shaped_reward(obs, action, reward, next_obs, terminated, truncated, info):\n"
        f"    os.system('touch /tmp/remedy_pwned_{i}')\n    return reward\n"
    )
    return Patch.from_data({"kind": "reward_shaping", "description": f"hostile {i}", "code": code})


class Scripted:
    """A Diagnoser that offers ``offers[round]`` and remembers every context it was given."""

    name = "scripted"

    def __init__(self, offers: list[list[Patch]]) -> None:
        self.offers, self.seen = offers, []

    def diagnose(self, ctx: DiagnosisContext) -> DiagnosisReport:
        self.seen.append(ctx)
        patches = self.offers[min(len(self.seen), len(self.offers)) - 1]
        cands = [CandidatePatch(patch=p, family=RemedyFamily(p.parts[0].kind), rationale="scripted") for p in patches]
        diag = Diagnosis(causes=[Cause(cause=RootCause.undertraining, confidence=0.9)], backend="scripted")
        return DiagnosisReport(signature=ctx.signature, diagnosis=diag, candidates=cands)


@pytest.fixture(scope="module")
def patient(tmp_path_factory):
    from remedy.cases.verify.training import train

    one_torch_thread()  # what the CLI does: evidence rollouts on one thread
    return train(PATIENT, tmp_path_factory.mktemp("fixloop") / "run", seed=0).path


def _check_stored(kb, result: FixResult, scenario: str | None) -> None:
    """Every attempt is a stored case carrying its diagnosis, the scenario and the link to the attempt before."""
    previous = None
    for a in result.attempts:
        case = kb.get(a.case_id)
        assert case.status == a.status and case.patch == a.patch
        assert case.diagnosis is not None and case.scenario == scenario
        assert case.parent_id == previous == a.parent_id
        previous = a.case_id


def test_hostile_candidates_are_recorded_as_failed_and_the_loop_goes_on(kb, patient, tmp_path):
    # every round re-offers hostile 1 first: the loop must skip it (already tried) and take the next one
    script = Scripted([[_hostile(1)], [_hostile(1), _hostile(2)], [_hostile(1), _hostile(2), _hostile(3)]])
    result = fix(
        kb,
        patient,
        store=kb,
        rounds=3,
        candidates=1,
        diagnoser=script,
        config=TINY,
        scenario=ScenarioRef("tiny_hostile"),
        out_dir=tmp_path / "fixes",
        n_episodes=3,
    )
    assert [a.patch for a in result.attempts] == [_hostile(1), _hostile(2), _hostile(3)]
    assert all(a.status == Status.failed.value and a.effect is None and a.reason for a in result.attempts)
    assert [a.round for a in result.attempts] == [1, 2, 3] and result.rounds_used == 3
    assert not result.fixed and result.patch_path is None and result.attempts_to_fix is None
    assert not (tmp_path / "fixes").exists()
    # round n's diagnosis saw what rounds 1..n-1 tried and that it failed
    assert [[(t.patch, t.status) for t in ctx.tried] for ctx in script.seen] == [
        [],
        [(_hostile(1), "failed")],
        [(_hostile(1), "failed"), (_hostile(2), "failed")],
    ]
    _check_stored(kb, result, "tiny_hostile")
    assert kb.count() == 3 and all(kb.get(a.case_id).source is Source.verified for a in result.attempts)


def test_loop_stops_when_nothing_new_is_offered(kb, patient):
    script = Scripted([[_hostile(1)]])  # the same single candidate every round
    result = fix(kb, patient, store=kb, rounds=3, candidates=2, diagnoser=script, config=TINY, n_episodes=3)
    assert len(result.attempts) == 1 and result.rounds_used == 2
    assert "not tried already" in result.stop_reason


def test_real_candidates_after_a_hostile_one(kb, patient, tmp_path):
    """Structure that holds whatever the numbers: a hostile first candidate, then real fine-tunes."""
    budget = Patch.from_data({"kind": "training_budget", "extra_steps": 512})
    lr = Patch.from_data({"kind": "hyperparameters", "changes": {"learning_rate": 0.001}})
    script = Scripted([[_hostile(1), budget], [lr]])
    result = fix(
        kb,
        patient,
        store=kb,
        rounds=2,
        candidates=2,
        diagnoser=script,
        config=TINY,
        scenario=ScenarioRef("tiny_real"),
        out_dir=tmp_path / "fixes",
        n_episodes=3,
        source=Source.bench,
    )
    first = result.attempts[0]
    assert first.patch == _hostile(1) and first.status == "failed" and len(result.attempts) >= 2
    assert result.attempts[1].patch == budget and result.attempts[1].status in {s.value for s in Status}
    statuses = [a.status for a in result.attempts]
    assert "improved" not in statuses  # one seed per arm can never be improved (inconclusive)
    if "improved" in statuses:  # stopped at the first improvement, and it is the winner written to disk
        i = statuses.index("improved")
        assert len(result.attempts) == i + 1 and result.winner == result.attempts[i]
        assert result.attempts_to_fix == i + 1
        assert result.env_steps_to_fix == sum(a.env_steps for a in result.attempts)
        assert load_patch(result.patch_path) == result.winner.patch
        assert result.winner.effect.ci_low > 0
    else:  # no fix: every offered candidate was verified and stored
        assert [a.patch for a in result.attempts] == [_hostile(1), budget, lr] and result.winner is None
    for a in result.attempts[1:]:
        assert a.status == "failed" or (a.effect is not None and a.env_steps > 0)
    _check_stored(kb, result, "tiny_real")
    assert all(kb.get(a.case_id).source is Source.bench for a in result.attempts)
    assert result.total_env_steps == sum(a.env_steps for a in result.attempts)
    data = result.as_dict()
    assert data["attempts"][0]["status"] == "failed" and data["fixed"] == result.fixed


def test_cli_fix_on_a_directory_that_is_not_a_run(tmp_path, monkeypatch, capsys):
    import sys

    from remedy.kb.cli import main

    monkeypatch.setattr(sys, "argv", ["remedy", "fix", str(tmp_path), "--kb", str(tmp_path / "kb")])
    with pytest.raises(SystemExit) as ex:
        main()
    err = capsys.readouterr().err
    assert ex.value.code == 1 and "run.yaml" in err and "Traceback" not in err
    assert not (tmp_path / "kb").exists()  # nothing created for a bad input


def test_only_a_confirmation_can_win():
    effect = Effect(metric="success_rate", treatment=1.0, control=0.0, diff=1.0, ci_low=0.5, ci_high=1.0)
    patch = Patch.from_data({"kind": "training_budget", "extra_steps": 10})
    legacy = AttemptRecord(
        round=1,
        case_id="c-1",
        patch=patch,
        family="training_budget",
        status="improved",
        effect=effect,
        env_steps=1,
        wall_time_s=0.0,
    )  # a screen stored before confirmations
    confirmed = AttemptRecord(
        round=1,
        case_id="c-2",
        patch=patch,
        family="training_budget",
        status="improved",
        effect=effect,
        env_steps=1,
        wall_time_s=0.0,
        stage="confirm",
        confirms="c-1",
    )
    assert not legacy.improved and confirmed.improved
    assert confirmed.as_dict()["stage"] == "confirm" and confirmed.as_dict()["confirms"] == "c-1"


# A budget patch against the unpatched checkpoint: 8k more steps lift this 1k-step patient from 0.15 success
# to 0.7 and 0.5 on two seeds, each on its own block of evaluation episodes (seeded fine-tunes: the same
# result every run). At 95% that interval crosses 0 (two seed values, t on about one degree of freedom);
# these tests are about what follows a cleared screen, so they screen at 80% confidence, where it clears.
# These tests are about confirmations, so they screen without a race: at a third of its steps (+2,731) this
# patch shows no gain yet (success 0.1 vs the checkpoint's 0.2, measured), and the futility stop would drop
# it at stage 1 - a late gain, the cost racing pays in fix rate (cases.verify.racing).
SCREEN = VerifyConfig(seeds=2, budget_steps=256, eval_episodes=10, n_envs=2, confidence=0.8)
NO_RACE = RaceSettings(enabled=False)


@pytest.mark.slow
def test_a_cleared_screen_is_confirmed_on_fresh_seeds(kb, patient, tmp_path):
    budget = Patch.from_data({"kind": "training_budget", "extra_steps": 8192})
    script = Scripted([[budget]])
    result = fix(
        kb,
        patient,
        store=kb,
        rounds=1,
        candidates=1,
        diagnoser=script,
        config=SCREEN,
        scenario=ScenarioRef("tiny_confirm"),
        out_dir=tmp_path / "fixes",
        n_episodes=3,
        race=NO_RACE,
    )
    screen, confirmation = result.attempts
    assert screen.stage == "screen" and screen.passed_screen and screen.status == Status.inconclusive.value
    assert confirmation.stage == "confirm" and confirmation.confirms == screen.case_id
    assert confirmation.parent_id == screen.case_id and confirmation.patch == budget
    stored_screen, stored_conf = kb.get(screen.case_id).verification, kb.get(confirmation.case_id).verification
    assert stored_screen.stage is Stage.screen and stored_conf.stage is Stage.confirm
    assert stored_conf.confirms == screen.case_id
    screen_seeds = set(range(stored_screen.seed_base, stored_screen.seed_base + 2))
    conf_seeds = set(range(stored_conf.seed_base, stored_conf.seed_base + 2))
    assert screen_seeds == {0, 1} and conf_seeds == {2, 3}
    assert stored_conf.eval_seed != stored_screen.eval_seed
    if confirmation.status == Status.improved.value:  # the confirmation, never the screen, is the winner
        assert result.improved and result.winner == confirmation and result.attempts_to_fix == 2
        assert result.fixed == bool(confirmation.fixed)  # fixed: improved AND the agent now works
        assert load_patch(result.patch_path) == budget
    else:
        assert not result.improved and not result.fixed and result.winner is None and result.patch_path is None
    _check_stored(kb, result, "tiny_confirm")


@pytest.mark.slow
def test_confirmations_are_capped(kb, patient, tmp_path):
    """Zero confirmations allowed: a cleared screen stays inconclusive and nothing wins."""
    budget = Patch.from_data({"kind": "training_budget", "extra_steps": 8192})
    result = fix(
        kb,
        patient,
        store=kb,
        rounds=1,
        candidates=1,
        diagnoser=Scripted([[budget]]),
        config=SCREEN,
        out_dir=tmp_path / "fixes",
        n_episodes=3,
        confirmations=0,
        exhaustive=True,
        race=NO_RACE,
    )
    assert [a.stage for a in result.attempts] == ["screen"] and result.attempts[0].passed_screen
    assert not result.fixed and "without a confirmed improvement" in result.stop_reason
