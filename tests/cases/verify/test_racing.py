"""Racing candidates (issue 9, part 2): the stage-1 rule, its settings, and that stage 1 never decides ``improved``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from remedy.cases.errors import VerificationError
from remedy.cases.model import Effect, Stage, Status
from remedy.cases.patches.spec import Patch
from remedy.cases.verify import racing
from remedy.cases.verify.racing import RaceSettings, rank_stage_one, stage_config, standardized
from remedy.cases.verify.verification import VerifyConfig, _verdict


def eff(diff: float, low: float, high: float) -> Effect:
    return Effect(metric="return_iqm", treatment=diff, control=0.0, diff=diff, ci_low=low, ci_high=high)


LR = Patch.from_data({"kind": "hyperparameters", "changes": {"learning_rate": 0.001}})
ENT = Patch.from_data({"kind": "hyperparameters", "changes": {"ent_coef": 0.01}})
BUDGET = Patch.from_data({"kind": "training_budget", "extra_steps": 512})


def test_standardized_is_the_difference_over_the_half_width():
    assert standardized(eff(2.0, 1.0, 3.0)) == pytest.approx(2.0)  # half-width 1
    assert standardized(eff(-1.0, -5.0, 3.0)) == pytest.approx(-0.25)  # half-width 4
    assert standardized(eff(0.0, 0.0, 0.0)) == 0.0
    assert standardized(eff(0.5, 0.5, 0.5)) == racing.SCORE_CAP  # a zero-width interval stays finite
    assert standardized(None) is None


def test_bottom_half_and_intervals_below_zero_are_dropped():
    # scores: 0.5, 2.0, none, -5.0 (hand-computed); three measured -> the top 1 goes on
    out = rank_stage_one([eff(1.0, -1.0, 3.0), eff(2.0, 1.0, 3.0), None, eff(-5.0, -6.0, -4.0)])
    assert [s.survived for s in out] == [False, True, False, False]
    assert [s.rank for s in out] == [2, 1, 0, 3] and all(s.of == 3 for s in out)
    assert "below zero" in out[3].rule and "no measurement" in out[2].rule and "ranked 2 of 3" in out[0].rule


def test_four_measured_keep_two_but_never_one_wholly_below_zero():
    out = rank_stage_one([eff(-3.0, -4.0, -2.0), eff(-4.0, -5.0, -3.0), eff(-0.1, -1.0, 0.8), eff(0.0, -1.0, 1.0)])
    assert [s.survived for s in out] == [False, False, True, True]
    # top half by score would keep candidate 0 (rank 3 of 4 is not top 2) - and its CI is below zero anyway
    two = rank_stage_one([eff(-3.0, -4.0, -2.0), eff(-4.0, -5.0, -3.0)])
    assert [s.survived for s in two] == [False, False]  # nothing that cannot win goes on, even as the best


def test_ties_keep_the_diagnosis_order():
    out = rank_stage_one([eff(0.0, -1.0, 1.0), eff(0.0, -1.0, 1.0)])
    assert [s.survived for s in out] == [True, False]


def test_settings_refuse_what_cannot_rank():
    with pytest.raises(VerificationError, match="--race-seeds must be at least 2"):
        RaceSettings(seeds=1).check()
    for bad in (0.0, 1.0, 1.5, -0.2):
        with pytest.raises(VerificationError, match="--race-fraction"):
            RaceSettings(fraction=bad).check()
    RaceSettings().check()


def test_when_a_round_races():
    s = RaceSettings()
    assert s.applies(VerifyConfig(seeds=3), [LR, ENT])
    assert not s.applies(VerifyConfig(seeds=1), [LR, ENT])  # one seed per arm: nothing to rank on
    assert not s.applies(VerifyConfig(seeds=3), [LR, BUDGET])  # one raceable candidate
    assert not s.applies(VerifyConfig(seeds=3), [LR])
    assert not RaceSettings(enabled=False).applies(VerifyConfig(seeds=3), [LR, ENT])


def test_stage_config_takes_a_share_of_the_budget_on_the_first_seeds():
    cfg = stage_config(VerifyConfig(seeds=3, seed_base=6), 3000, RaceSettings())
    assert (cfg.budget_steps, cfg.seeds, cfg.seed_base) == (1000, 2, 6)
    # never more seeds than the screen has, so a confirmation's fresh block stays untouched
    assert stage_config(VerifyConfig(seeds=2), 900, RaceSettings(seeds=5, fraction=0.5)).seeds == 2
    assert stage_config(VerifyConfig(seeds=2), 1, RaceSettings()).budget_steps == 1


@pytest.mark.parametrize("stage", [Stage.race, Stage.screen, Stage.confirm])
def test_only_a_confirmation_turns_a_clear_interval_into_improved(stage):
    ctx = SimpleNamespace(stage=stage)
    status, passed, note = _verdict(ctx, eff(5.0, 2.0, 8.0), None, "")
    if stage is Stage.confirm:
        assert (status, passed) == (Status.improved, False)
    elif stage is Stage.screen:
        assert (status, passed) == (Status.inconclusive, True)
    else:  # stage 1 of a race: neither a fix nor a cleared screen
        assert (status, passed) == (Status.inconclusive, False) and "race" in note
