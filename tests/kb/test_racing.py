"""Racing in the fix loop (issue 9) on a tiny CartPole patient, with real fine-tunes in worker processes.

The patient was trained at a learning rate too low to learn much (1e-5). A scripted diagnoser
offers a clearly harmful candidate (a learning rate that wrecks the policy within a few updates)
next to a helpful one (learning rate 1e-3); stage 1 under the futility rule (racing rules 2-3; the default rule 4
drops only on evidence of harm) must drop the harmful one and store it
``stopped_early`` with the evidence it reached, and the helpful one must go on to the full
screen. With ``--no-race`` both are screened at the full budget, as before. The futility stop:
a lone candidate that changes nothing (an entropy bonus of 0.001 leaves the arms bit-identical
at these budgets) is stopped at stage 1 and never screened, and its stage-1 case records the
source of the full budget (learned from the KB), not the stage's share; a lone budget-only
candidate ("+1,200 steps vs the checkpoint") races on a third of its extra steps, and, showing a
gain, goes on to the full screen.
"""

from __future__ import annotations

import pytest

from remedy.cases.evidence.rundir import RunConfig
from remedy.cases.model import Cause, Diagnosis, RemedyFamily, RootCause, Stage, Status
from remedy.cases.patches.spec import Patch
from remedy.cases.verify.budgets import LearnedBudget
from remedy.cases.verify.racing import RaceSettings
from remedy.cases.verify.verification import ScenarioRef, VerifyConfig
from remedy.kb.fixloop import fix, one_torch_thread
from remedy.retrieval.diagnosis import CandidatePatch, DiagnosisContext, DiagnosisReport

PATIENT = RunConfig(
    env_id="CartPole-v1",
    algo="PPO",
    train_steps=2000,
    n_envs=4,
    hyperparams={
        "n_steps": 64,
        "batch_size": 64,
        "n_epochs": 2,
        "learning_rate": 1e-5,
        "policy_kwargs": {"net_arch": [32, 32]},
    },
    success={"kind": "return_threshold", "threshold": 100},
)
#: full screens of 1,200 env steps per arm on 2 seeds; stage 1 takes a third (rounded up to whole rollouts)
TINY = VerifyConfig(seeds=2, budget_steps=1200, eval_episodes=5, n_envs=2)
HARMFUL = Patch.from_data({"kind": "hyperparameters", "changes": {"learning_rate": 0.5}})
HARMLESS = Patch.from_data({"kind": "hyperparameters", "changes": {"ent_coef": 0.001}})
HELPFUL = Patch.from_data({"kind": "hyperparameters", "changes": {"learning_rate": 0.001}})
BUDGET = Patch.from_data({"kind": "training_budget", "extra_steps": 1200})


class Scripted:
    """A Diagnoser that offers the same candidates every round."""

    name = "scripted"

    def __init__(self, patches: list[Patch], budget: LearnedBudget | None = None) -> None:
        self.patches, self.budget = patches, budget

    def diagnose(self, ctx: DiagnosisContext) -> DiagnosisReport:
        cands = [
            CandidatePatch(patch=p, family=RemedyFamily.hyperparameters, rationale="scripted", budget=self.budget)
            for p in self.patches
        ]
        diag = Diagnosis(causes=[Cause(cause=RootCause.unstable_optimization, confidence=0.9)], backend="scripted")
        return DiagnosisReport(signature=ctx.signature, diagnosis=diag, candidates=cands)


@pytest.fixture(scope="module")
def patient(tmp_path_factory):
    from remedy.cases.verify.training import train

    one_torch_thread()
    return train(PATIENT, tmp_path_factory.mktemp("racing") / "run", seed=0).path


def _fix(kb, patient, tmp_path, race: RaceSettings, diagnoser=None, config: VerifyConfig = TINY):
    return fix(
        kb,
        patient,
        store=kb,
        rounds=1,
        candidates=2,
        diagnoser=diagnoser or Scripted([HARMFUL, HELPFUL]),
        config=config,
        scenario=ScenarioRef("tiny_race"),
        out_dir=tmp_path / "fixes",
        n_episodes=3,
        race=race,
        confirmations=0,  # what the race selects is the point here; confirmations are test_fixloop's
    )


#: the futility rule (racing rules 2-3), which these tests of the machinery of a drop rely on; rule 4 drops only
#: on evidence of harm, which two seeds at these budgets rarely give (tests/cases/verify/test_racing.py)
FUTILITY = RaceSettings(drop="futility")


def test_a_harmful_candidate_is_stopped_early_and_the_other_goes_on(kb, patient, tmp_path):
    result = _fix(kb, patient, tmp_path, FUTILITY)
    dropped, screen = result.attempts[0], result.attempts[1]
    assert dropped.patch == HARMFUL and screen.patch == HELPFUL
    # the harmful one: stopped at stage 1 with the evidence it reached, never a full-budget no_effect
    assert dropped.status == Status.stopped_early.value and dropped.stage == Stage.race.value
    case = kb.get(dropped.case_id)
    v = case.verification
    assert v is not None and v.status is Status.stopped_early and v.stage is Stage.race
    assert v.effect is not None and v.effect.diff < 0 and v.seeds == 2
    assert v.budget_steps == 400 and v.race is not None and not v.race.survived
    assert v.race.full_budget_steps == 1200 and v.race.env_steps == v.env_steps > 0
    assert "stopped early" in v.reason
    # the helpful one: a gain at stage 1, so screened at the full budget, carrying its stage-1 evidence and steps
    assert screen.stage == Stage.screen.value and screen.status != Status.stopped_early.value
    sv = kb.get(screen.case_id).verification
    assert sv is not None and sv.race is not None and sv.race.survived and sv.race.rank == 1
    assert sv.race.effect is not None and sv.race.effect.diff > 0
    assert sv.budget_steps == 1200 and sv.race.budget_steps == 400
    assert sv.env_steps > sv.race.env_steps > 0  # stage-1 steps are part of the case's account
    # stage 1 never yields improved; the loop's account includes every stage-1 step
    assert all(a.status != Status.improved.value for a in result.attempts if a.stage != Stage.confirm.value)
    assert result.total_env_steps == sum(a.env_steps for a in result.attempts)
    assert result.stopped_early == 1 and result.as_dict()["race"]["enabled"] is True
    assert result.as_dict()["attempts"][0]["race"]["survived"] is False
    # every stage-1 control was shared: two seeds at the stage budget, trained once for both candidates
    assert v.race.controls == sv.race.controls and len(v.race.controls) == 2
    # the survivor went on from its stage-1 runs in both arms on both seeds: it learned only the rest, and its
    # controls are the stage-1 controls continued (new keys: a control that goes on is another computation)
    assert sv.resumed_seeds == [0, 1] and "went on from their stage-1 runs" in sv.reason
    assert len(sv.controls) == 2 and not set(sv.controls) & set(sv.race.controls)
    # rollouts of 64 steps x 2 envs = 128: stage 1 trained 400 -> 512 per arm, the rest 800 -> 896 per arm
    assert sv.env_steps - sv.race.env_steps == 4 * 896  # two seeds x two arms, each only the rest of its budget
    assert sv.race.env_steps == 2 * 512  # its treatments; the harmful candidate's stage 1 trained the shared controls


def test_with_resume_off_a_survivor_trains_its_full_budget_afresh(kb, patient, tmp_path):
    """The race of the test above with ``resume`` off: the survivor's screen trains every arm's full budget from
    the checkpoint (1200 -> 1280 steps per arm), where going on trained only the rest (896)."""
    afresh = _fix(kb, patient, tmp_path, RaceSettings(resume=False, drop="futility"))
    v = kb.get(afresh.attempts[1].case_id).verification
    assert v is not None and v.stage is Stage.screen and v.race is not None and v.race.survived
    assert v.resumed_seeds == [] and "went on" not in v.reason
    assert v.env_steps - v.race.env_steps == 4 * 1280
    assert afresh.as_dict()["race"]["resume"] is False


def test_no_race_screens_every_candidate_at_the_full_budget(kb, patient, tmp_path):
    result = _fix(kb, patient, tmp_path, RaceSettings(enabled=False))
    assert [a.patch for a in result.attempts[:2]] == [HARMFUL, HELPFUL]
    assert [a.stage for a in result.attempts[:2]] == [Stage.screen.value] * 2
    assert all(a.race is None and a.status != Status.stopped_early.value for a in result.attempts)
    budgets = [kb.get(a.case_id).verification.budget_steps for a in result.attempts[:2]]
    assert budgets == [1200, 1200] and result.stopped_early == 0
    assert result.as_dict()["race"]["enabled"] is False


def test_a_lone_candidate_that_changes_nothing_is_stopped_and_never_screened(kb, patient, tmp_path):
    learned = LearnedBudget(steps=1200, fraction=0.6, cases=["fix-a", "fix-b", "fix-c"])
    result = _fix(kb, patient, tmp_path, FUTILITY, Scripted([HARMLESS], budget=learned), VerifyConfig(**_no_budget()))
    (only,) = result.attempts  # one candidate was raced (the halving quota would keep it) and never screened
    assert only.patch == HARMLESS and only.status == Status.stopped_early.value and only.stage == Stage.race.value
    v = kb.get(only.case_id).verification
    assert v is not None and v.effect is not None and v.effect.diff == 0  # bit-identical arms: no sign of gain
    assert v.race is not None and (v.race.rank, v.race.of, v.race.survived) == (1, 1, False)
    assert "no sign of gain" in v.race.rule and "no sign of gain" in v.reason
    # a third of the full budget, whose source (the KB) the stage-1 case records, not "user"
    assert (v.budget_steps, v.race.full_budget_steps) == (400, 1200)
    assert v.budget_source == "kb" and v.budget_cases == ["fix-a", "fix-b", "fix-c"]
    assert only.budget_source == "kb" and result.total_env_steps == v.env_steps == v.race.env_steps > 0


def test_a_budget_only_candidate_races_on_a_share_of_its_steps_and_a_gain_goes_on(kb, patient, tmp_path):
    result = _fix(kb, patient, tmp_path, RaceSettings(), Scripted([BUDGET]))
    (screen,) = result.attempts
    assert screen.patch == BUDGET and screen.stage == Stage.screen.value
    v = kb.get(screen.case_id).verification
    assert v is not None and v.comparison == "budget_vs_none" and v.budget_source == "patch"
    assert v.budget_steps == 1200  # the full screen: all of its extra steps
    race = v.race
    assert race is not None and race.survived and race.effect is not None and race.effect.diff > 0
    # stage 1 was "+400 steps vs the checkpoint": a third of its extra steps, the checkpoint as control
    assert (race.budget_steps, race.full_budget_steps, race.seeds) == (400, 1200, 2)
    assert race.controls == []  # the checkpoint control trains nothing and is no shared control
    assert 0 < race.env_steps < v.env_steps - race.env_steps  # only the two treatments trained, a third as long


def _no_budget() -> dict:
    """TINY's settings without the user's budget (so a learned budget decides)."""
    return {"seeds": TINY.seeds, "eval_episodes": TINY.eval_episodes, "n_envs": TINY.n_envs}


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["fix", "{tmp}", "--race-seeds", "1"], "--race-seeds: got 1: should be greater than or equal to 2"),
        (["fix", "{tmp}", "--race-fraction", "1.5"], "--race-fraction: got 1.5: should be less than 1"),
        (["bench", "run", "--race-fraction", "0"], "--race-fraction must be between 0 and 1"),
    ],
)
def test_cli_refuses_race_settings_that_cannot_rank(tmp_path, monkeypatch, capsys, args, says):
    import sys

    from remedy.kb.cli import main

    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    monkeypatch.setattr(sys, "argv", ["remedy", *argv, "--kb", str(tmp_path / "kb")])
    with pytest.raises(SystemExit) as ex:
        main()
    err = capsys.readouterr().err
    assert ex.value.code == 1 and says in err and "Traceback" not in err
    assert not (tmp_path / "kb").exists()  # refused before anything was created


def test_fix_output_names_the_stage_and_counts_the_stopped(capsys, tmp_path):
    from remedy.cases.model import Effect
    from remedy.kb.cli.diagnose import _render_fix
    from remedy.kb.fixloop import AttemptRecord, FixResult

    effect = Effect(metric="return_iqm", treatment=9.0, control=40.0, diff=-31.0, ci_low=-60.0, ci_high=-2.0)
    rec = AttemptRecord(
        round=1,
        case_id="c-dropped",
        patch=HARMFUL,
        family="hyperparameters",
        status="stopped_early",
        effect=effect,
        env_steps=2400,
        wall_time_s=3.0,
        stage="race",
    )
    _render_fix(FixResult(run_dir=tmp_path, scenario=None, attempts=(rec,), diagnoses=(), rounds_used=1))
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    assert "race:" in flat and "stopped_early" in flat and "1 candidate(s) stopped early at stage 1" in flat


def test_survivors_left_unscreened_by_a_fix_are_still_accounted(patient, tmp_path):
    """A loop that stops at a confirmed fix stores the other stage-1 survivors: their steps were spent."""
    from remedy.cases.evidence.rundir import RunDir
    from remedy.cases.model import Case, Effect, Signature, Source, Verification
    from remedy.cases.verify.racing import rank_stage_one
    from remedy.kb.fix_state import LoopState
    from remedy.kb.fixloop import _unscreened

    run = RunDir.load(patient)
    effect = Effect(metric="return_iqm", treatment=50.0, control=40.0, diff=10.0, ci_low=-20.0, ci_high=40.0)
    stage_one = Case(
        case_id="stage-one",
        source=Source.verified,
        subject=run.subject(),
        signature=Signature(summary="tiny"),
        patch=HARMLESS,
        verification=Verification(
            status=Status.inconclusive, effect=effect, seeds=2, budget_steps=400, env_steps=1600, stage=Stage.race
        ),
    )
    (standing,) = rank_stage_one([effect])
    loop = LoopState(
        kb=None,
        store=None,
        run=run,
        config=TINY,
        executor=None,
        scenario=None,
        source=Source.verified,
        progress=None,
    )
    cand = CandidatePatch(patch=HARMLESS, family=RemedyFamily.hyperparameters)
    diag = Diagnosis(causes=[Cause(cause=RootCause.unstable_optimization, confidence=0.9)], backend="scripted")
    report = DiagnosisReport(signature=stage_one.signature, diagnosis=diag, candidates=[cand])
    _unscreened(loop, 1, report, [(cand, (stage_one, standing, tmp_path)), (cand, None)])
    (rec,) = loop.attempts
    assert rec.status == Status.stopped_early.value and rec.stage == Stage.race.value and loop.steps == 1600
    assert rec.race is not None and rec.race.survived and "stopped at a confirmed fix" in rec.race.rule
