"""The offline diagnoser: cold-KB advice from priors, and how verified cases move the ranking."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from remedy.cases.errors import DiagnosisError
from remedy.cases.model import (
    Case,
    Cause,
    Diagnosis,
    Effect,
    EnvTraits,
    LiteratureEffect,
    RemedyFamily,
    RootCause,
    Signature,
    Source,
    Status,
    Subject,
    Verification,
)
from remedy.cases.patches.spec import ActionSmoothness, Hyperparameters, Patch, TrainingBudget
from remedy.retrieval.diagnosis import Attempt, DiagnosisContext, RetrievedCase, get_diagnoser, without_noops
from remedy.retrieval.offline import OfflineDiagnoser, OfflineSettings

LANDER = Subject(
    env_id="LunarLander-v3",
    env_kwargs={"continuous": True},
    algo="PPO",
    train_steps=150_000,
    success="last reward >= 100",
    traits=EnvTraits(action_space="continuous", obs_dim=8, action_dim=2),
)
PENDULUM = Subject(
    env_id="Pendulum-v1",
    algo="SAC",
    train_steps=20_000,
    traits=EnvTraits(action_space="continuous", obs_dim=3, action_dim=1),
)
CARTPOLE = Subject(
    env_id="CartPole-v1",
    algo="PPO",
    train_steps=50_000,
    traits=EnvTraits(action_space="discrete", obs_dim=4, action_dim=2),
)

HOVER = Signature(
    features={"truncation_rate": 1.0, "success_rate": 0.0, "ep_len_frac": 1.0, "ep_len_mean": 1000.0},
    symptoms=["hovering", "timeouts", "never_succeeds", "low_success"],
    summary="lander hovers until the time limit and never lands",
)
JERKY = Signature(
    features={"action_jerk": 0.8, "action_saturation": 0.7, "return_iqm": -400.0},
    symptoms=["jerky_actions", "saturated_actions"],
    summary="torque chatters between the bounds",
)
SCALED = Signature(
    features={"obs_abs_max": 4000.0, "obs_scale_ratio": 3.0, "success_rate": 0.2},
    symptoms=["unscaled_observations", "low_success"],
    summary="observations are 1000x unit scale",
)


def _ctx(subject=LANDER, signature=HOVER, **kw) -> DiagnosisContext:
    return DiagnosisContext(subject=subject, signature=signature, **kw)


def _case(
    case_id: str,
    cause: str,
    patch: Patch,
    status: str | None,
    *,
    source: str = "verified",
    env_id: str = "LunarLander-v3",
    effect: float = 50.0,
) -> Case:
    verification = literature = None
    if status is not None:
        eff = Effect(
            metric="return_iqm",
            treatment=effect,
            control=0.0,
            diff=effect,
            ci_low=min(effect / 2, effect * 1.5),
            ci_high=max(effect / 2, effect * 1.5),
            prob_improvement=0.9 if effect > 0 else 0.1,
        )
        verification = Verification(status=Status(status), effect=eff, seeds=3)
    if source == "example":
        literature = LiteratureEffect(claim="helps", source="SB3 tips")
    return Case(
        case_id=case_id,
        source=Source(source),
        subject=LANDER.model_copy(update={"env_id": env_id}),
        signature=HOVER,
        diagnosis=Diagnosis(causes=[Cause(cause=cause, confidence=0.9)]),
        patch=patch,
        verification=verification,
        literature=literature,
    )


def _rank(report, cause: RootCause) -> int:
    return [c.cause for c in report.diagnosis.causes].index(cause)


def _families(report) -> list[RemedyFamily]:
    return [c.family for c in report.candidates]


# ---- cold KB: priors only ------------------------------------------------------------------------


def test_cold_hovering_lander_blames_the_reward_and_proposes_a_time_cost():
    report = OfflineDiagnoser().diagnose(_ctx())
    assert report.top_cause == RootCause.reward_misspecification
    top = report.candidates[0]
    assert top.family == RemedyFamily.reward_shaping and "time cost" in top.patch.summary()
    assert "prior-hovering-time-cost" in report.diagnosis.cited_rules
    assert "truncation_rate=1" in report.diagnosis.causes[0].rationale  # rationale quotes the evidence
    assert "Tips and Tricks" in top.rationale and top.side_effects  # source and side effects named


def test_cold_jerky_pendulum_blames_action_jitter_and_proposes_smoothness():
    report = OfflineDiagnoser().diagnose(_ctx(PENDULUM, JERKY))
    assert report.top_cause == RootCause.action_jitter
    assert report.candidates[0].family == RemedyFamily.action_smoothness
    assert "CAPS" in report.candidates[0].rationale


def test_cold_scaled_observations_propose_normalization():
    report = OfflineDiagnoser().diagnose(_ctx(CARTPOLE, SCALED))
    assert report.top_cause == RootCause.observation_scaling
    assert report.candidates[0].family == RemedyFamily.normalization
    assert report.candidates[0].patch.parts[0].obs is True


def test_budget_scales_with_the_original_training_steps():
    sig = Signature(
        features={"curve_final_slope": 0.4}, symptoms=["undertrained", "low_success"], summary="still rising"
    )
    report = OfflineDiagnoser().diagnose(_ctx(CARTPOLE, sig))
    assert report.top_cause == RootCause.undertraining
    budget = next(c for c in report.candidates if c.family == RemedyFamily.training_budget)
    assert budget.patch.parts[0].extra_steps == 50_000  # doubling: 1 x 50k, within the Zoo's 100k in total


def test_small_budgets_get_a_multiple_of_themselves():
    sig = Signature(
        features={"curve_final_slope": 0.4}, symptoms=["undertrained", "low_success"], summary="still rising"
    )
    subject = CARTPOLE.model_copy(update={"train_steps": 8_000})
    report = OfflineDiagnoser().diagnose(_ctx(subject, sig))
    budget = next(c for c in report.candidates if c.family == RemedyFamily.training_budget)
    assert budget.patch.parts[0].extra_steps == 8_000  # doubling: 1 x 8k


def test_nothing_matched_is_unknown():
    report = OfflineDiagnoser().diagnose(_ctx(signature=Signature(summary="looks fine")))
    assert report.top_cause == RootCause.unknown and report.candidates == []


def test_smoothness_is_never_offered_for_discrete_actions():
    report = OfflineDiagnoser().diagnose(_ctx(CARTPOLE, JERKY))
    assert RemedyFamily.action_smoothness not in _families(report)


def test_confidences_are_ranked_and_bounded():
    report = OfflineDiagnoser().diagnose(_ctx())
    conf = [c.confidence for c in report.diagnosis.causes]
    assert conf == sorted(conf, reverse=True) and 0 < sum(conf) <= 1


def test_same_context_same_report():
    ctx = _ctx(
        cases=(
            RetrievedCase(
                _case("c-1", "undertraining", Patch(parts=[TrainingBudget(extra_steps=30_000)]), "improved"), 0.9
            ),
        )
    )
    assert OfflineDiagnoser().diagnose(ctx) == OfflineDiagnoser().diagnose(ctx)


# ---- verified cases shift the ranking ----------------------------------------------------------

BUDGET = Patch(parts=[TrainingBudget(extra_steps=30_000)])


def test_an_improved_case_with_another_cause_moves_it_up():
    cold = OfflineDiagnoser().diagnose(_ctx())
    warm = OfflineDiagnoser().diagnose(
        _ctx(cases=(RetrievedCase(_case("c-more", "undertraining", BUDGET, "improved"), 0.95),))
    )
    assert _rank(warm, RootCause.undertraining) < _rank(cold, RootCause.undertraining)
    assert warm.top_cause == RootCause.undertraining
    assert warm.candidates[0].family == RemedyFamily.training_budget and "c-more" in warm.candidates[0].cites
    assert warm.diagnosis.cited_cases == ["c-more"]
    # the budget was rescaled from the case's 150k steps to this subject's (same here) and cites the case
    assert warm.candidates[0].patch.parts[0].extra_steps == 30_000


def _confidence(report, cause: RootCause) -> float:
    return next((c.confidence for c in report.diagnosis.causes if c.cause == cause), 0.0)


def test_an_outcome_votes_on_the_cause_its_patch_addresses_not_every_diagnosed_cause():
    """A budget patch that did nothing, on a case diagnosed [undertraining, reward misspecification]: with patch
    credit it counts against undertraining (what more training addresses) and leaves the reward cause alone."""
    case = _case("c-budget-nothing", "undertraining", Patch(parts=[TrainingBudget(extra_steps=50_000)]), "no_effect")
    two = Diagnosis(
        causes=[Cause(cause="undertraining", confidence=0.9), Cause(cause="reward_misspecification", confidence=0.8)]
    )
    case = case.model_copy(update={"diagnosis": two})
    near = (RetrievedCase(case, 0.95),)

    def score(credit: str, cause: RootCause) -> float:
        report = OfflineDiagnoser(OfflineSettings(cause_credit=credit)).diagnose(_ctx(cases=near))
        return next((c.confidence for c in report.diagnosis.causes if c.cause == cause), 0.0)

    cold = OfflineDiagnoser().diagnose(_ctx())
    cold_reward = next(c.confidence for c in cold.diagnosis.causes if c.cause == RootCause.reward_misspecification)
    # diagnosis credit spreads the failure over both causes; patch credit spares the one the budget did not address
    assert score("diagnosis", RootCause.reward_misspecification) < score("patch", RootCause.reward_misspecification)
    assert score("patch", RootCause.reward_misspecification) >= cold_reward
    assert OfflineSettings().cause_credit == "patch"


def test_a_worse_case_demotes_its_family():
    cold = OfflineDiagnoser().diagnose(_ctx())
    shaping = cold.candidates[0].patch
    assert cold.candidates[0].family == RemedyFamily.reward_shaping
    warm = OfflineDiagnoser().diagnose(
        _ctx(cases=(RetrievedCase(_case("c-bad", "reward_misspecification", shaping, "worse", effect=-80.0), 0.95),))
    )
    fams = _families(warm)
    assert fams and fams[0] != RemedyFamily.reward_shaping
    assert RemedyFamily.reward_shaping not in fams or fams.index(RemedyFamily.reward_shaping) > 0
    assert _confidence(warm, RootCause.reward_misspecification) < _confidence(cold, RootCause.reward_misspecification)
    assert "c-bad" in warm.diagnosis.cited_cases


def test_example_cases_count_less_than_verified_ones():
    smooth = Patch(parts=[ActionSmoothness(coef=0.2)])
    verified = _ctx(cases=(RetrievedCase(_case("c-v", "action_jitter", smooth, "improved"), 0.9),))
    example = _ctx(cases=(RetrievedCase(_case("c-e", "action_jitter", smooth, None, source="example"), 0.9),))
    score = lambda r: next(c.confidence for c in r.diagnosis.causes if c.cause == RootCause.action_jitter)  # noqa: E731
    assert score(OfflineDiagnoser().diagnose(verified)) > score(OfflineDiagnoser().diagnose(example)) > 0


def test_cases_below_min_similarity_are_ignored():
    far = _ctx(cases=(RetrievedCase(_case("c-far", "undertraining", BUDGET, "improved"), 0.1),))
    report = OfflineDiagnoser(min_similarity=0.3).diagnose(far)
    assert report.diagnosis.cited_cases == [] and report.top_cause == RootCause.reward_misspecification


def test_reward_code_from_another_env_does_not_travel():
    code = (
        "def shaped_reward(obs, action, reward, next_obs, terminated, truncated, info):\n"
        "    return float(reward) + 10.0 * float(next_obs[6])\n"
    )  # pays LunarLander's leg contact
    foreign = Patch.from_data({"kind": "reward_shaping", "description": "leg-contact bonus", "code": code})
    other = LANDER.model_copy(update={"env_id": "MountainCarContinuous-v0"})
    ctx = _ctx(subject=other, cases=(RetrievedCase(_case("c-x", "reward_misspecification", foreign, "improved"), 0.9),))
    report = OfflineDiagnoser().diagnose(ctx)
    assert report.top_cause == RootCause.reward_misspecification  # the case still votes for its cause
    assert all(c.patch != foreign for c in report.candidates)  # but its lander code is not offered here


# ---- fix-loop memory, rules, knobs -------------------------------------------------------------


def test_a_tried_and_failed_patch_is_demoted():
    first = OfflineDiagnoser().diagnose(_ctx()).candidates[0]
    again = OfflineDiagnoser().diagnose(_ctx(tried=(Attempt(patch=first.patch, status="no_effect", effect=0.0),)))
    assert again.candidates[0].patch != first.patch
    assert first.patch in [c.patch for c in again.candidates]  # demoted, not forgotten


@dataclass(frozen=True)
class _Rule:
    id: str
    conditions: tuple
    recommendation: dict


def test_matching_rules_vote_and_are_cited():
    rule = _Rule(
        "rule-7",
        ("symptom hovering",),
        {
            "cause": "time_limit_misconfiguration",
            "confidence": 1.0,
            "patch": {"kind": "time_limit", "max_episode_steps": 400},
        },
    )
    report = OfflineDiagnoser(w_rules=2.0).diagnose(_ctx(rules=(rule,)))
    assert report.top_cause == RootCause.time_limit_misconfiguration
    assert "rule-7" in report.diagnosis.cited_rules
    assert report.candidates[0].family == RemedyFamily.time_limit and "rule-7" in report.candidates[0].cites


def test_knobs_change_the_outcome_and_the_program_version():
    ctx = _ctx(cases=(RetrievedCase(_case("c-more", "undertraining", BUDGET, "improved"), 0.95),))
    strong_prior = OfflineDiagnoser(w_prior=5.0)
    assert strong_prior.diagnose(ctx).top_cause == RootCause.reward_misspecification
    assert strong_prior.program_version != OfflineDiagnoser().program_version


def test_registry():
    assert get_diagnoser("offline", k=3).settings.k == 3
    with pytest.raises(DiagnosisError, match="unknown diagnoser 'oracle'"):
        get_diagnoser("oracle")


def test_report_round_trips_through_json():
    from remedy.retrieval.diagnosis import DiagnosisReport

    report = OfflineDiagnoser().diagnose(_ctx(PENDULUM, JERKY))
    assert DiagnosisReport.model_validate_json(report.model_dump_json()) == report


def test_settings_are_one_serializable_value_and_overrides_apply():
    from remedy.retrieval.offline import OfflineSettings

    tuned = OfflineDiagnoser(sim_floor=0.55, k=4)
    assert tuned.settings == OfflineSettings(sim_floor=0.55, k=4)
    restored = OfflineSettings.model_validate_json(tuned.settings.model_dump_json())
    assert OfflineDiagnoser(restored).program_version == tuned.program_version != OfflineDiagnoser().program_version
    with pytest.raises(ValueError):
        OfflineDiagnoser(sim_flor=0.5)  # a misspelt knob is refused, not ignored


# ---- a family's offers: failures order them, a tried one gives way ---------------------------------

# neither is what LANDER (PPO, no hyperparameters set: 3e-4 and 0.99) already trains with
LR = Patch(parts=[Hyperparameters(changes={"learning_rate": 1e-3})])
GAMMA = Patch(parts=[Hyperparameters(changes={"gamma": 0.999})])


def _hyper(report) -> Patch:
    return next(c.patch for c in report.candidates if c.family == RemedyFamily.hyperparameters)


def test_a_tried_offer_gives_way_to_the_familys_next_one():
    cases = (
        RetrievedCase(_case("c-lr", "unstable_optimization", LR, "improved"), 0.95),
        RetrievedCase(_case("c-gamma", "unstable_optimization", GAMMA, "improved"), 0.90),
    )
    first = OfflineDiagnoser().diagnose(_ctx(cases=cases))
    assert _hyper(first) == LR  # the stronger case's patch
    tried = (Attempt(patch=LR, status="no_effect", effect=0.0),)
    again = OfflineDiagnoser().diagnose(_ctx(cases=cases, tried=tried))
    assert _hyper(again) == GAMMA  # before: LR again, and a loop that skips tried patches had none left


def test_similar_failures_of_the_same_patch_demote_its_offer():
    cases = (
        RetrievedCase(_case("c-lr", "unstable_optimization", LR, "improved"), 0.95),
        RetrievedCase(_case("c-gamma", "unstable_optimization", GAMMA, "improved"), 0.90),
        RetrievedCase(_case("c-lr-no1", "unstable_optimization", LR, "no_effect", effect=0.0), 0.93),
        RetrievedCase(_case("c-lr-no2", "unstable_optimization", LR, "no_effect", effect=0.0), 0.92),
    )
    assert _hyper(OfflineDiagnoser().diagnose(_ctx(cases=cases))) == GAMMA
    assert _hyper(OfflineDiagnoser(offer_against_weight=0.0).diagnose(_ctx(cases=cases))) == LR  # wins alone


def _of(patient: str, case: Case) -> Case:
    return case.model_copy(update={"scenario": patient})


def test_the_k_nearest_past_failures_vote_with_all_their_attempts():
    cases = (
        RetrievedCase(_of("s", _case("c-s1", "unstable_optimization", LR, "no_effect", effect=0.0)), 0.95),
        RetrievedCase(_of("s", _case("c-s2", "unstable_optimization", GAMMA, "improved")), 0.94),
        RetrievedCase(_of("t", _case("c-t1", "unstable_optimization", LR, "improved")), 0.93),
    )
    one = OfflineDiagnoser(k=1).diagnose(_ctx(cases=cases))
    assert _hyper(one) == GAMMA  # before, k=1 kept one case: s's failed LR, and no offer at all
    assert "c-s2" in one.diagnosis.cited_cases and "c-t1" not in one.diagnosis.cited_cases
    assert "c-t1" in OfflineDiagnoser(k=2).diagnose(_ctx(cases=cases)).diagnosis.cited_cases


def test_one_failures_repeats_of_one_remedy_share_one_vote():
    repeats = tuple(
        RetrievedCase(_of("s", _case(f"c-s{i}", "unstable_optimization", LR, "no_effect", effect=0.0)), 0.93)
        for i in range(4)
    )
    cases = (
        RetrievedCase(_of("t", _case("c-t", "unstable_optimization", LR, "improved")), 0.95),
        *repeats,
        RetrievedCase(_of("u", _case("c-u", "unstable_optimization", GAMMA, "improved")), 0.80),
    )
    # four tries of LR on one past failure are one failure of LR there: LR, fixed elsewhere, still leads
    assert _hyper(OfflineDiagnoser().diagnose(_ctx(cases=cases))) == LR
    # counted as four failures, they bury it
    assert _hyper(OfflineDiagnoser(repeat_share=False).diagnose(_ctx(cases=cases))) == GAMMA


def test_more_training_that_failed_a_far_longer_trained_failure_does_not_vote():
    """Budgets that did nothing for agents trained 10x longer say nothing about this one: the doubling it would
    try first stays below where they started. Within reach (1x, 2x its steps) the same failures count against
    undertraining and against the budget patch; with the knob off they always count."""
    short = LANDER.model_copy(update={"train_steps": 15_000})

    def failed_budgets(trained: int) -> tuple[RetrievedCase, ...]:
        out = []
        for i in range(3):
            case = _case(
                f"c-budget-{trained}-{i}",
                "undertraining",
                Patch(parts=[TrainingBudget(extra_steps=trained)]),
                "no_effect",
            )
            case = case.model_copy(update={"subject": LANDER.model_copy(update={"train_steps": trained})})
            out.append(RetrievedCase(case, 0.95))
        return tuple(out)

    def under(trained: int | None, **knobs) -> float:
        cases = failed_budgets(trained) if trained else ()
        return _confidence(
            OfflineDiagnoser(**knobs).diagnose(_ctx(subject=short, cases=cases)), RootCause.undertraining
        )

    cold = under(None)
    assert cold > 0
    assert under(150_000) == pytest.approx(cold)  # 10x longer: beyond reach, no vote
    assert under(30_000) < cold  # 2x: within reach (the default reach is 1 + the budget patch's multiple)
    assert under(15_000) < cold
    assert under(150_000, budget_failure_reach=None) < cold

    def budget_score(trained: int | None) -> float:
        cases = failed_budgets(trained) if trained else ()
        report = OfflineDiagnoser().diagnose(_ctx(subject=short, cases=cases))
        return max((c.score for c in report.candidates if c.family == RemedyFamily.training_budget), default=-1e9)

    assert budget_score(150_000) == pytest.approx(budget_score(None))  # nor against the budget patch
    assert budget_score(15_000) < budget_score(None)


def test_more_training_that_did_not_help_also_counts_against_less():
    """A similar failure at the same training steps where +1x its steps did nothing: the budget offer is not the
    smaller +0.5x the priors also propose (less of what did not suffice), but the +1x itself keeps leading its
    family; with the knob off only the exact +1x is counted against, so the smaller offer wins."""
    subject = LANDER.model_copy(update={"train_steps": 16_000})
    failed = _case("c-budget-1x", "undertraining", Patch(parts=[TrainingBudget(extra_steps=16_000)]), "no_effect")
    failed = failed.model_copy(update={"subject": subject})
    ctx = _ctx(subject=subject, cases=(RetrievedCase(failed, 0.97),))

    def budget_steps(**knobs) -> int:
        report = OfflineDiagnoser(**knobs).diagnose(ctx)
        (cand,) = [c for c in report.candidates if c.family == RemedyFamily.training_budget]
        return sum(p.extra_steps for p in cand.patch.parts)

    cold = OfflineDiagnoser().diagnose(_ctx(subject=subject))
    (prior,) = [c for c in cold.candidates if c.family == RemedyFamily.training_budget]
    assert sum(p.extra_steps for p in prior.patch.parts) == 16_000  # the priors' first budget: +1x
    assert budget_steps(budget_against_smaller=False) == 8_000  # exact match only: the failed +1x loses to +0.5x
    assert budget_steps() == 16_000  # both are counted against, so the priors' order stands


def test_a_past_fix_this_run_already_trains_with_is_not_offered():
    """A similar failure was fixed by gamma=0.99; this run already trains at gamma 0.99 (set, or PPO's default
    when unset), so offering it would verify a do-nothing patch. The offer keeps only what changes something,
    and a fix that changes nothing here is not a candidate at all."""
    fix = Patch(parts=[Hyperparameters(changes={"gamma": 0.99, "n_epochs": 20})])
    only_gamma = Patch(parts=[Hyperparameters(changes={"gamma": 0.99})])

    def hyper_patches(subject: Subject, patch: Patch) -> list[dict]:
        case = _case("c-gamma-fix", "unstable_optimization", patch, "improved")
        report = OfflineDiagnoser().diagnose(_ctx(subject=subject, cases=(RetrievedCase(case, 0.97),)))
        return [
            p.changes
            for c in report.candidates
            if c.family == RemedyFamily.hyperparameters and "c-gamma-fix" in c.cites
            for p in c.patch.parts
        ]

    low_gamma = LANDER.model_copy(update={"hyperparams": {"gamma": 0.9}})
    own_gamma = LANDER.model_copy(update={"hyperparams": {"gamma": 0.99}})
    assert hyper_patches(low_gamma, fix) == [{"gamma": 0.99, "n_epochs": 20}]  # both change something
    assert hyper_patches(own_gamma, fix) == [{"n_epochs": 20}]  # gamma is already 0.99: only n_epochs is offered
    assert hyper_patches(LANDER, fix) == [{"n_epochs": 20}]  # unset: PPO's default gamma is 0.99
    assert hyper_patches(low_gamma, only_gamma) == [{"gamma": 0.99}]
    assert hyper_patches(own_gamma, only_gamma) == []  # nothing left to change: not offered
    assert without_noops(only_gamma, own_gamma) is None
    assert without_noops(only_gamma, low_gamma) == only_gamma
