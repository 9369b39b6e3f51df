"""Budgets from experience: learned from similar confirmed fixes of the family, else the default rule."""

from __future__ import annotations

import pytest

from remedy.cases.model import (
    Case,
    Cause,
    Diagnosis,
    EnvTraits,
    RemedyFamily,
    RootCause,
    Signature,
    Source,
    Stage,
    Status,
    Subject,
    Verification,
)
from remedy.cases.patches.spec import Patch
from remedy.retrieval.budgets import (
    EXTRA_FRACTION_BOUNDS,
    LADDER_MAX_MULTIPLE,
    MIN_BUDGET_CASES,
    VERIFY_FRACTION_BOUNDS,
    ladder_steps,
    learned_budget,
    learned_extra_steps,
    size_candidates,
)
from remedy.retrieval.diagnosis import Attempt, CandidatePatch, DiagnosisReport, RetrievedCase

LR = {"kind": "hyperparameters", "changes": {"learning_rate": 0.0003}}


def _case(
    cid: str,
    budget: int,
    train_steps: int,
    patch: dict = LR,
    status: Status = Status.improved,
    stage: Stage = Stage.confirm,
) -> Case:
    return Case(
        case_id=cid,
        source=Source.bench,
        subject=Subject(
            env_id="CartPole-v1",
            algo="PPO",
            train_steps=train_steps,
            traits=EnvTraits(action_space="discrete", obs_dim=4, action_dim=2),
        ),
        signature=Signature(summary="the pole falls"),
        diagnosis=Diagnosis(causes=[Cause(cause=RootCause.undertraining, confidence=0.8)]),
        patch=Patch.from_data(patch),
        verification=Verification(status=status, stage=stage, seeds=3, budget_steps=budget),
    )


def _near(*cases: Case, similarity: float = 0.9) -> list[RetrievedCase]:
    return [RetrievedCase(case=c, similarity=similarity) for c in cases]


def test_the_budget_is_the_median_ratio_of_similar_confirmed_fixes_times_this_patients_training():
    # ratios 0.1, 0.3, 0.5 of their own patients' training: median 0.3
    near = _near(_case("c-a", 10_000, 100_000), _case("c-b", 60_000, 200_000), _case("c-c", 25_000, 50_000))
    got = learned_budget(near, RemedyFamily.hyperparameters, 40_000)
    assert got is not None and got.steps == 12_000 and got.fraction == pytest.approx(0.3)
    assert got.cases == ["c-a", "c-b", "c-c"]


def test_too_few_cases_other_families_screens_failures_and_far_cases_do_not_count():
    fixes = [_case(f"c-{i}", 20_000, 100_000) for i in range(MIN_BUDGET_CASES - 1)]
    noise = [
        _case("c-smooth", 90_000, 100_000, patch={"kind": "action_smoothness", "coef": 0.1}),
        _case("c-screen", 90_000, 100_000, status=Status.inconclusive, stage=Stage.screen),
        _case("c-none", 90_000, 100_000, status=Status.no_effect),
    ]
    near = _near(*fixes, *noise) + _near(_case("c-far", 90_000, 100_000), similarity=0.2)
    assert learned_budget(near, RemedyFamily.hyperparameters, 100_000) is None
    enough = near + _near(_case("c-last", 40_000, 100_000))
    got = learned_budget(enough, RemedyFamily.hyperparameters, 100_000)
    assert got is not None and got.steps == 20_000 and "c-far" not in got.cases and len(got.cases) == 3


def test_a_learned_budget_is_clipped_to_sane_bounds():
    huge = _near(*(_case(f"c-{i}", 500_000, 100_000) for i in range(3)))
    got = learned_budget(huge, RemedyFamily.hyperparameters, 10_000)
    assert got is not None and got.steps == round(VERIFY_FRACTION_BOUNDS[1] * 10_000)


def test_a_budget_part_combined_with_others_is_not_counted_in_the_ratio():
    combined = {"parts": [LR, {"kind": "training_budget", "extra_steps": 30_000}]}
    # budget_steps records base + extra (both arms got the extra): the base 20k of 100k is what counts
    near = _near(*(_case(f"c-{i}", 50_000, 100_000, patch=combined) for i in range(3)))
    got = learned_budget(near, RemedyFamily.hyperparameters, 100_000)
    assert got is not None and got.fraction == pytest.approx(0.2)


def test_a_budget_patch_size_is_learned_from_confirmed_budget_fixes():
    def budget(extra: int) -> dict:
        return {"kind": "training_budget", "extra_steps": extra}

    near = _near(
        _case("c-a", 50_000, 100_000, patch=budget(50_000)),  # 0.5
        _case("c-b", 160_000, 200_000, patch=budget(160_000)),  # 0.8
        _case("c-c", 5_000, 10_000, patch=budget(7_000)),  # 0.7
    )
    got = learned_extra_steps(near, 30_000)
    assert got is not None and got.steps == 21_000 and got.cases == ["c-a", "c-b", "c-c"]
    # a budget patch is verified against the checkpoint: no verification budget is learned for it
    assert learned_budget(near, RemedyFamily.training_budget, 30_000) is None
    assert learned_extra_steps(near[:2], 30_000) is None
    capped = _near(*(_case(f"c-{i}", 1, 1_000, patch=budget(9_000)) for i in range(3)))
    assert learned_extra_steps(capped, 1_000).steps == round(EXTRA_FRACTION_BOUNDS[1] * 1_000)


def _report(*cands: CandidatePatch) -> DiagnosisReport:
    return DiagnosisReport(
        signature=Signature(summary="s"),
        diagnosis=Diagnosis(causes=[Cause(cause=RootCause.undertraining, confidence=0.5)]),
        candidates=list(cands),
    )


def _subject(train_steps: int) -> Subject:
    return Subject(
        env_id="CartPole-v1",
        algo="PPO",
        train_steps=train_steps,
        traits=EnvTraits(action_space="discrete", obs_dim=4, action_dim=2),
    )


def test_candidates_are_sized_from_the_kb_with_the_source_in_their_rationale():
    prior_budget = CandidatePatch(
        patch=Patch.from_data({"kind": "training_budget", "extra_steps": 100_000}),
        family=RemedyFamily.training_budget,
        rationale="more training",
        cites=["prior-undertrained"],
    )
    lr = CandidatePatch(patch=Patch.from_data(LR), family=RemedyFamily.hyperparameters, rationale="lower lr")
    budget_fixes = [
        _case(f"c-b{i}", 1, 100_000, patch={"kind": "training_budget", "extra_steps": 30_000}) for i in range(3)
    ]
    lr_fixes = [_case(f"c-l{i}", 10_000, 100_000) for i in range(3)]
    sized = size_candidates(_report(prior_budget, lr), _near(*budget_fixes, *lr_fixes), _subject(100_000))
    budget, lr_sized = sized.candidates
    assert budget.patch.parts[0].extra_steps == 30_000 and "learned from the KB" in budget.rationale
    assert "learned from the KB" in (budget.patch.description or "") and "c-b0" in budget.cites
    assert lr_sized.budget is not None and lr_sized.budget.steps == 10_000 and lr_sized.budget.cases[0] == "c-l0"
    # a cold KB: the prior's size stands and says so; no verification budget is attached
    cold = size_candidates(_report(prior_budget, lr), [], _subject(100_000))
    assert cold.candidates[0].patch == prior_budget.patch and "prior multiple" in cold.candidates[0].rationale
    assert cold.candidates[1].budget is None


def _budget_cand(extra: int, score: float = 1.0) -> CandidatePatch:
    return CandidatePatch(
        patch=Patch.from_data({"kind": "training_budget", "extra_steps": extra}),
        family=RemedyFamily.training_budget,
        rationale="more training",
        score=score,
    )


def _tried(extra: int, status: str, effect: float | None, cid: str = "c-t") -> Attempt:
    patch = Patch.from_data({"kind": "training_budget", "extra_steps": extra})
    return Attempt(patch=patch, status=status, effect=effect, case_id=cid)


def test_a_budget_that_helped_without_a_working_agent_is_doubled_in_the_next_round():
    lr = CandidatePatch(patch=Patch.from_data(LR), family=RemedyFamily.hyperparameters, rationale="lower lr")
    tried = [_tried(2_000, "no_effect", +12.5, "c-small"), _tried(1_000, "improved", +30.0, "c-tiny")]
    sized = size_candidates(_report(_budget_cand(2_000), _budget_cand(1_000), lr), [], _subject(2_000), tried)
    # both budget candidates climb to the same rung (twice the largest budget that helped) and merge into one
    budget, lr_kept = sized.candidates
    assert budget.patch.parts[0].extra_steps == 4_000 and "budget ladder" in (budget.patch.description or "")
    assert "twice the 2,000" in budget.rationale and "c-small" in budget.cites
    assert lr_kept.patch == lr.patch
    # without attempts, the prior's sizes stand
    cold = size_candidates(_report(_budget_cand(2_000), lr), [], _subject(2_000))
    assert cold.candidates[0].patch.parts[0].extra_steps == 2_000


def test_the_ladder_skips_budgets_that_did_not_help_and_stops_at_its_cap():
    assert ladder_steps([_tried(2_000, "no_effect", -5.0)], 2_000) is None  # more training did not help
    assert ladder_steps([_tried(2_000, "failed", None)], 2_000) is None  # never measured
    # a race's stage-1 drop measured a third of the budget: the ladder still climbs past it
    dropped = ladder_steps([_tried(2_000, "stopped_early", -3.0)], 2_000)
    assert dropped is not None and dropped[0] == 4_000
    lr_attempt = Attempt(patch=Patch.from_data(LR), status="no_effect", effect=+50.0)
    assert ladder_steps([lr_attempt], 2_000) is None  # not a budget patch
    cap = int(LADDER_MAX_MULTIPLE * 2_000)
    assert ladder_steps([_tried(cap // 2 + 1_000, "no_effect", 1.0)], 2_000)[0] == cap
    assert ladder_steps([_tried(cap, "no_effect", 1.0)], 2_000) is None  # at the cap: nothing larger to offer
    # a candidate already above the next rung keeps its own size
    big = size_candidates(_report(_budget_cand(9_000)), [], _subject(2_000), [_tried(2_000, "no_effect", 3.0)])
    assert big.candidates[0].patch.parts[0].extra_steps == 9_000
