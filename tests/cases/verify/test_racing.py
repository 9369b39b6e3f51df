"""Racing candidates (issue 9, part 2): the stage-1 rule, its settings, and that stage 1 never decides ``improved``."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from remedy.cases.errors import VerificationError
from remedy.cases.model import Case, Effect, Stage, Status, Verification
from remedy.cases.patches.spec import Patch
from remedy.cases.verify import racing
from remedy.cases.verify.outcome import verdict
from remedy.cases.verify.racing import RaceSettings, rank_stage_one, stage_config, standardized
from remedy.cases.verify.verification import VerifyConfig


def eff(diff: float, low: float, high: float, metric: str = "return_iqm") -> Effect:
    return Effect(metric=metric, treatment=diff, control=0.0, diff=diff, ci_low=low, ci_high=high)


LR = Patch.from_data({"kind": "hyperparameters", "changes": {"learning_rate": 0.001}})
ENT = Patch.from_data({"kind": "hyperparameters", "changes": {"ent_coef": 0.01}})
BUDGET = Patch.from_data({"kind": "training_budget", "extra_steps": 512})
TINY_BUDGET = Patch.from_data({"kind": "training_budget", "extra_steps": 1})


def test_standardized_is_the_difference_over_the_half_width():
    assert standardized(eff(2.0, 1.0, 3.0)) == pytest.approx(2.0)  # half-width 1
    assert standardized(eff(-1.0, -5.0, 3.0)) == pytest.approx(-0.25)  # half-width 4
    assert standardized(eff(0.0, 0.0, 0.0)) == 0.0
    assert standardized(eff(0.5, 0.5, 0.5)) == racing.SCORE_CAP  # a zero-width interval stays finite
    assert standardized(None) is None


def test_bottom_half_and_intervals_below_zero_are_dropped():
    # scores: 0.5, 2.0, none, -5.0 (hand-computed); three measured -> the top 1 goes on
    out = rank_stage_one([eff(1.0, -1.0, 3.0), eff(2.0, 1.0, 3.0), None, eff(-5.0, -6.0, -4.0)], rule="futility")
    assert [s.survived for s in out] == [False, True, False, False]
    assert [s.rank for s in out] == [2, 1, 0, 3] and all(s.of == 3 for s in out)
    assert "below zero" in out[3].rule and "no measurement" in out[2].rule and "ranked 2 of 3" in out[0].rule


def test_four_measured_keep_two_but_never_one_wholly_below_zero():
    out = rank_stage_one(
        [eff(-3.0, -4.0, -2.0), eff(-4.0, -5.0, -3.0), eff(0.2, -1.0, 1.4), eff(0.5, -1.0, 2.0)], rule="futility"
    )
    assert [s.survived for s in out] == [False, False, True, True]
    # top half by score would keep candidate 0 (rank 3 of 4 is not top 2) - and its CI is below zero anyway
    two = rank_stage_one([eff(-3.0, -4.0, -2.0), eff(-4.0, -5.0, -3.0)], rule="futility")
    assert [s.survived for s in two] == [False, False]  # nothing that cannot win goes on, even as the best


def test_ties_keep_the_diagnosis_order():
    out = rank_stage_one([eff(0.5, -1.0, 2.0), eff(0.5, -1.0, 2.0)], rule="futility")
    assert [s.survived for s in out] == [True, False]


def test_futility_drops_any_candidate_without_a_gain_even_the_best_or_a_lone_one():
    # one candidate: the halving quota keeps it, futility does not (difference <= 0 on its metric)
    (lone,) = rank_stage_one([eff(-0.1, -1.0, 0.8)], rule="futility")
    assert not lone.survived and "no sign of gain" in lone.rule and lone.rank == 1
    (tie,) = rank_stage_one([eff(0.0, -1.0, 1.0)], rule="futility")
    assert not tie.survived and "+0 <= 0" in tie.rule  # exactly no gain is no sign of gain
    (gain,) = rank_stage_one([eff(0.01, -5.0, 5.0)], rule="futility")
    assert gain.survived and gain.rule == "ranked 1 of 1"  # any gain goes on, however wide the interval
    # two candidates: the best of the round is dropped too when it shows no gain
    out = rank_stage_one([eff(-0.5, -2.0, 1.0), eff(0.0, -0.2, 0.2)], rule="futility")
    assert [s.survived for s in out] == [False, False] and [s.rank for s in out] == [2, 1]
    assert all("no sign of gain" in s.rule for s in out)


def test_a_success_tie_is_decided_by_the_return_effect():
    tied = eff(0.0, -0.3, 0.3, metric="success_rate")
    up, down = eff(12.0, -5.0, 29.0), eff(-3.0, -9.0, 3.0)
    kept, dropped, unknown = rank_stage_one([tied, tied, tied], [up, down, None], rule="futility")
    assert kept.survived and "success rate tied, return_iqm +12 > 0" in kept.rule
    assert not dropped.survived and "no sign of gain" in dropped.rule
    assert not unknown.survived  # no return measured: a tie is no sign of gain
    # a success rate that fell is no gain whatever the return did; a return tie is not rescued by anything
    (fell,) = rank_stage_one([eff(-0.1, -0.4, 0.2, metric="success_rate")], [up], rule="futility")
    (flat,) = rank_stage_one([eff(0.0, -1.0, 1.0)], [up], rule="futility")
    assert not fell.survived and not flat.survived
    assert racing.shows_gain(tied, up) and not racing.shows_gain(tied, down)
    assert not racing.shows_gain(eff(0.0, -1.0, 1.0), up)  # the return itself tied: nothing else to read


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
    assert s.applies(VerifyConfig(seeds=3), [LR, BUDGET])  # budget-only patches race too
    assert s.applies(VerifyConfig(seeds=3), [LR])  # one candidate: futility only
    assert s.applies(VerifyConfig(seeds=3), [BUDGET])
    assert not s.applies(VerifyConfig(seeds=3), [TINY_BUDGET])  # a third of 1 step rounds to none
    assert not RaceSettings(enabled=False).applies(VerifyConfig(seeds=3), [LR, ENT])


def test_stage_config_takes_a_share_of_the_budget_on_the_first_seeds():
    cfg = stage_config(VerifyConfig(seeds=3, seed_base=6), 3000, RaceSettings())
    assert (cfg.budget_steps, cfg.seeds, cfg.seed_base) == (1000, 2, 6)
    assert cfg.confidence == racing.HARM_CONFIDENCE == 0.9  # the interval the drop rule reads
    # never more seeds than the screen has, so a confirmation's fresh block stays untouched
    assert stage_config(VerifyConfig(seeds=2), 900, RaceSettings(seeds=5, fraction=0.5)).seeds == 2
    assert stage_config(VerifyConfig(seeds=2), 1, RaceSettings()).budget_steps == 1


@pytest.mark.parametrize("stage", [Stage.race, Stage.screen, Stage.confirm])
def test_only_a_confirmation_turns_a_clear_interval_into_improved(stage):
    ctx = SimpleNamespace(stage=stage)
    status, passed, note = verdict(ctx, eff(5.0, 2.0, 8.0), None, "")
    if stage is Stage.confirm:
        assert (status, passed) == (Status.improved, False)
    elif stage is Stage.screen:
        assert (status, passed) == (Status.inconclusive, True)
    else:  # stage 1 of a race: neither a fix nor a cleared screen
        assert (status, passed) == (Status.inconclusive, False) and "race" in note


def test_a_budget_only_patch_races_on_a_share_of_its_extra_steps():
    assert racing.raceable(BUDGET) and racing.raceable(LR) and not racing.raceable(TINY_BUDGET)
    assert racing.raceable(TINY_BUDGET, fraction=0.6)  # 0.6 of a step rounds to one
    staged = racing.stage_patch(BUDGET, RaceSettings())
    assert staged.budget_only and staged.parts[0].extra_steps == 171  # round(512 / 3)
    assert racing.stage_patch(BUDGET, RaceSettings(fraction=0.5)).parts[0].extra_steps == 256
    assert racing.stage_patch(LR, RaceSettings()) == LR  # other patches train as they are, on a share of the budget
    assert racing.full_budget(BUDGET, 9000) == 512 and racing.full_budget(LR, 9000) == 9000
    two = Patch.from_data(
        {"parts": [{"kind": "training_budget", "extra_steps": 300}, {"kind": "training_budget", "extra_steps": 90}]}
    )
    assert racing.full_budget(two, 1) == 390
    assert [p.extra_steps for p in racing.stage_patch(two, RaceSettings()).parts] == [100, 30]
    mixed = Patch.from_data({"parts": [{"kind": "training_budget", "extra_steps": 300}, LR.parts[0].model_dump()]})
    assert racing.stage_patch(mixed, RaceSettings()) == mixed and racing.full_budget(mixed, 1000) == 1000


def _race_case(patch: Patch, verification: Verification) -> Case:
    """A stored case of a CartPole PPO candidate with ``verification`` (stage-1 cases of the tests below)."""
    from remedy.cases.model import ActionSpaceType, EnvTraits, Signature, Source, Subject

    traits = EnvTraits(action_space=ActionSpaceType.discrete, obs_dim=4, action_dim=2)
    subject = Subject(env_id="CartPole-v1", algo="PPO", traits=traits)
    return Case(
        case_id="s1",
        source=Source.verified,
        subject=subject,
        signature=Signature(summary="x"),
        patch=patch,
        verification=verification,
    )


def test_a_stage_one_case_records_the_full_budgets_source_and_the_candidates_patch():
    from remedy.cases.verify.budgets import BudgetChoice

    def stage_case(patch, source):
        v = Verification(status=Status.no_effect, stage=Stage.race, seeds=2, budget_steps=171, budget_source=source)
        return _race_case(patch, v)

    full = BudgetChoice(900, "kb", ("c1", "c2"))
    case = racing.as_stage_one(stage_case(LR, "user"), LR, full)
    assert case.verification.budget_source == "kb" and case.verification.budget_cases == ["c1", "c2"]
    staged = racing.stage_patch(BUDGET, RaceSettings())
    case = racing.as_stage_one(stage_case(staged, "patch"), BUDGET, full)
    assert case.patch == BUDGET and case.verification.budget_source == "patch"  # its own steps, whatever the budget
    assert case.verification.budget_steps == 171  # what stage 1 trained, a share of the patch's 512


def test_a_flat_tie_is_no_evidence_so_the_futility_stop_lets_it_go_on():
    flat = Effect(diff=0.0, ci_low=0.0, ci_high=0.0, treatment=-500.0, control=-500.0, metric="return_iqm")
    spread = Effect(diff=0.0, ci_low=-3.0, ci_high=3.0, treatment=-90.0, control=-90.0, metric="return_iqm")
    assert racing.uninformative(flat) and not racing.futile(flat)
    assert racing.futile(spread)  # an informative tie: no sign of gain
    alone, tied = racing.rank_stage_one([flat], rule="futility"), racing.rank_stage_one([spread], rule="futility")
    assert alone[0].survived and "flat tie" in alone[0].rule
    assert not tied[0].survived and "no sign of gain" in tied[0].rule
    # a flat success tie whose return fell is evidence against
    success = Effect(diff=0.0, ci_low=0.0, ci_high=0.0, treatment=0.0, control=0.0, metric="success_rate")
    fell = Effect(diff=-5.0, ci_low=-9.0, ci_high=-1.0, treatment=-95.0, control=-90.0, metric="return_iqm")
    assert racing.futile(success, fell) and not racing.futile(success, None)


def test_resume_from_finds_the_stage_one_runs_that_exist_in_both_arms(tmp_path):
    """Which seeds a survivor goes on from: those whose stage-1 runs exist in both arms (a budget-only patch's
    control is the checkpoint, so only its treatments); never a curriculum, never a stage other than 1."""
    from remedy.cases.verify.controls import ControlCache

    def case(patch, stage=Stage.race, controls=(), comparison="same_budget_control"):
        v = Verification(
            status=Status.no_effect,
            stage=stage,
            seeds=2,
            seed_base=4,
            budget_steps=333,
            controls=list(controls),
            comparison=comparison,
        )
        return _race_case(patch, v)

    def run(path):
        path.mkdir(parents=True)
        (path / "model.zip").write_bytes(b"x")

    arms = tmp_path / "arms"
    run(arms / "treatment-4")
    run(arms / "treatment-5")
    run(arms / "control-4")  # seed 5's control is missing: seed 5 cannot go on in both arms
    own = racing.resume_from(case(LR), arms, None)
    assert own is not None and set(own.starts) == {4}
    assert own.starts[4] == (str(arms / "treatment-4"), str(arms / "control-4"))
    assert own.treatment_steps == own.control_steps == 333
    # shared controls: found in the cache under the keys the stage-1 case lists, in seed order
    cache = ControlCache(tmp_path / "controls")
    run(cache.run_dir("ctl-a"))
    run(cache.run_dir("ctl-b"))
    shared = racing.resume_from(case(LR, controls=("ctl-a", "ctl-b")), arms, str(tmp_path / "controls"))
    assert shared is not None and shared.starts[5] == (str(arms / "treatment-5"), str(cache.run_dir("ctl-b")))
    # a budget-only patch: its control is the checkpoint, which trains nothing and goes on from nothing
    budget = racing.resume_from(case(BUDGET, comparison="budget_vs_none"), arms, None)
    assert budget is not None and budget.starts == {
        4: (str(arms / "treatment-4"), None),
        5: (str(arms / "treatment-5"), None),
    }
    assert (budget.treatment_steps, budget.control_steps) == (333, 0)
    curriculum = Patch.from_data(
        {
            "kind": "curriculum",
            "stages": [{"env_kwargs": {}, "fraction": 0.5}, {"env_kwargs": {}, "fraction": 0.5}],
        }
    )
    assert not racing.continuable(curriculum) and racing.continuable(LR) and racing.continuable(BUDGET)
    assert racing.resume_from(case(curriculum), arms, None) is None
    assert racing.resume_from(case(LR, stage=Stage.screen), arms, None) is None
    assert racing.resume_from(case(LR), tmp_path / "nothing-kept", None) is None


# -- rule 4: only evidence of harm drops a candidate ----------------------------------------------------------


def test_the_harm_rule_drops_only_a_candidate_behind_its_control():
    """What the futility rule dropped (no gain, the bottom half) goes on; an interval below zero does not."""
    effects = [eff(-0.1, -1.0, 0.8), eff(0.0, -1.0, 1.0), eff(2.0, 1.0, 3.0), eff(-5.0, -6.0, -4.0), None]
    out = rank_stage_one(effects)  # the default rule: harm
    assert [s.survived for s in out] == [True, True, True, False, False]
    assert "no evidence of harm" in out[0].rule and "ranked 3 of 4" in out[0].rule
    assert "below zero" in out[3].rule and "no measurement" in out[4].rule
    assert [s.survived for s in rank_stage_one(effects, rule="futility")] == [False, False, True, False, False]
    with pytest.raises(VerificationError, match="unknown stage-1 drop rule 'coin'"):
        rank_stage_one(effects, rule="coin")
    with pytest.raises(VerificationError, match="stage-1 confidence"):
        RaceSettings(confidence=1.0).check()


def test_racing_keeps_a_slow_acting_budget_fix_on_a_tiny_simulated_patient():
    """A tiny simulated patient whose fix is more training that acts late: at a third of its extra steps ("+X/3
    steps vs the checkpoint") the treatment's 2 seeds are no better than the checkpoint yet (the same
    distribution of seed values), at the full budget every seed is 2 seed-SDs ahead. Stage 1 measures the
    effect as a race does (seed-level Welch interval at the race's confidence). The futility rule drops the fix
    about half the time; the harm rule keeps it in more than 90% of races, and still drops a candidate
    that wrecks the agent more often than not."""
    from remedy.cases.verify.stats import effect, iqm

    rng = np.random.default_rng(7)

    def stage_one(shift: float, confidence: float) -> Effect:
        seeds = [rng.normal(rng.normal(m, 1.0), 1.0, 20) for m in (shift, shift, 0.0, 0.0)]
        return effect("return_iqm", seeds[:2], seeds[2:], aggregate=iqm, confidence=confidence)

    trials = 400
    kept = sum(rank_stage_one([stage_one(0.0, RaceSettings().confidence)])[0].survived for _ in range(trials))
    kept_before = sum(rank_stage_one([stage_one(0.0, 0.95)], rule="futility")[0].survived for _ in range(trials))
    assert kept / trials > 0.9  # false drops under 10% (binomial sd at 400 trials: 0.012)
    assert kept_before / trials < 0.65  # the futility rule threw about half of them away
    wrecked = sum(not rank_stage_one([stage_one(-6.0, RaceSettings().confidence)])[0].survived for _ in range(200))
    assert wrecked / 200 > 0.5
