"""Bench baselines and honest splits: hand-computed figures on toy lists, the report's sections, example exclusion."""

from __future__ import annotations

import pytest

from remedy.cases.verify.scenarios import load_scenarios
from remedy.kb.baselines import (
    cause_counts,
    default_candidates,
    most_frequent_causes,
    random_candidates,
    score_constant,
    zoo_hyperparameters,
)
from remedy.kb.bench import (
    BenchReport,
    BenchSettings,
    ScenarioResult,
    split_summaries,
    summarize,
)
from remedy.kb.bench_report import render_markdown

TRUTHS = [
    ["undertraining"],
    ["undertraining", "sparse_reward"],
    ["reward_hacking", "reward_misspecification"],
    ["observation_scaling"],
    ["sparse_reward", "insufficient_exploration"],
]


def test_cause_counts_and_most_frequent_are_by_scenario_and_deterministic():
    counts = cause_counts([*TRUTHS, ["undertraining", "undertraining"]])  # a cause counts once per scenario
    assert counts["undertraining"] == 3 and counts["sparse_reward"] == 2
    # ties (one scenario each) are broken alphabetically
    assert most_frequent_causes(TRUTHS) == ["sparse_reward", "undertraining", "insufficient_exploration"]


def test_constant_answers_score_by_hand():
    assert score_constant(["undertraining"], TRUTHS) == (pytest.approx(2 / 5), pytest.approx(2 / 5))
    top1, top3 = score_constant(["undertraining", "sparse_reward", "observation_scaling"], TRUTHS)
    assert top1 == pytest.approx(2 / 5) and top3 == pytest.approx(4 / 5)
    assert score_constant([], TRUTHS) == (0.0, 0.0) and score_constant(["x"], []) == (0.0, 0.0)


def _row(
    name: str,
    split: str,
    truth: list[str],
    top1: bool,
    fixed: bool,
    solvable: bool | None,
    budget_only: bool = False,
    arms: dict | None = None,
) -> ScenarioResult:
    return ScenarioResult(
        scenario=name,
        env_id="CartPole-v1",
        ground_truth=truth,
        expected_families=[],
        first_causes=[],
        top1=top1,
        top3=top1,
        fixed=fixed,
        attempts=1,
        attempts_to_fix=1 if fixed else None,
        env_steps_to_fix=None,
        wall_time_to_fix_s=None,
        total_env_steps=0,
        total_wall_time_s=0.0,
        winning_patch=None,
        winning_effect=None,
        cited_cases=[],
        case_ids=[],
        statuses=[],
        split=split,
        solvable=solvable,
        budget_only_fix=budget_only,
        baselines=arms,
    )


ROWS = [
    _row(
        "d1",
        "dev",
        ["undertraining"],
        True,
        True,
        True,
        budget_only=True,
        arms={"tuned_defaults": {"fixed": True}, "random_search": {"fixed": False}},
    ),
    _row(
        "d2",
        "dev",
        ["reward_hacking"],
        False,
        True,
        True,
        arms={"tuned_defaults": {"fixed": False}, "random_search": {"fixed": False}},
    ),
    _row("d3", "dev", ["sparse_reward"], False, False, False),  # unsolvable: out of the fix denominators
    _row(
        "d4",
        "dev",
        ["undertraining"],
        True,
        False,
        None,
        arms={"tuned_defaults": {"fixed": False}, "random_search": {"fixed": True}},
    ),
    _row("h1", "holdout", ["observation_scaling"], False, False, True),
]


def test_split_summaries_keep_splits_apart_and_drop_unsolvable_from_fix_rates():
    dev, hold = split_summaries(ROWS, answer=["undertraining", "sparse_reward", "reward_hacking"])
    assert (dev.split, dev.n, hold.split, hold.n) == ("dev", 4, "holdout", 1)
    assert dev.top1_accuracy == pytest.approx(0.5) and dev.baseline_top1 == pytest.approx(0.5)
    assert dev.baseline_top3 == pytest.approx(1.0) and hold.baseline_top3 == 0.0
    assert dev.unsolvable == ["d3"] and dev.unchecked == ["d4"] and dev.fix_denominator == 3
    assert dev.fix_rate == pytest.approx(2 / 3)
    assert dev.budget_only_fix_rate == pytest.approx(1 / 3) and dev.other_fix_rate == pytest.approx(1 / 3)
    assert dev.baseline_fix_rates == {"random_search": pytest.approx(1 / 3), "tuned_defaults": pytest.approx(1 / 3)}
    assert hold.fix_rate == 0.0 and hold.baseline_fix_rates == {}


def test_report_has_dev_and_holdout_sections_with_baselines():
    report = BenchReport(
        label="cold",
        kb=None,
        settings=BenchSettings(),
        scenarios=ROWS,
        summary=summarize(ROWS),
        started_at="2026-12-03T00:00:00+00:00",
        wall_time_s=1.0,
        splits=split_summaries(ROWS, answer=["undertraining", "sparse_reward", "reward_hacking"]),
    )
    md = render_markdown(report)
    assert "## dev" in md and "## holdout" in md
    dev_part = md.split("## dev")[1].split("## holdout")[0]
    assert "most frequent cause (undertraining)" in dev_part and "fixed top-3" in dev_part
    assert "tuned defaults (RL Zoo)" in dev_part and "random search" in dev_part
    assert "Unsolvable" in dev_part and "d3" in dev_part and "by more training only" in dev_part
    assert report.as_dict()["splits"][1]["split"] == "holdout"


def test_tuned_defaults_come_from_the_zoo_table_and_random_search_is_seeded_and_fits():
    hp, normalize = zoo_hyperparameters("Acrobot-v1", {}, "PPO")
    assert normalize is True and hp == {"gae_lambda": 0.94, "gamma": 0.99, "n_epochs": 4, "ent_coef": 0.0}
    assert zoo_hyperparameters("Acrobot-v1", {}, "DQN") is None
    assert zoo_hyperparameters("LunarLander-v3", {"continuous": True}, "PPO") is not None
    (s,) = load_scenarios("acrobot_lr_too_high_0p05")
    ladder = default_candidates(s, 3)
    assert [p.kinds for p in ladder] == [
        ["hyperparameters"],
        ["hyperparameters", "normalization"],
        ["hyperparameters", "normalization"],
    ]
    a, b = random_candidates(s, 4, seed=1), random_candidates(s, 4, seed=1)
    assert a == b and len(a) == 4 and random_candidates(s, 4, seed=2) != a
    assert all("action_smoothness" not in p.kinds for p in random_candidates(s, 12, seed=3))  # discrete env


def test_declared_mirroring_examples_are_hidden_while_their_scenario_is_evaluated(kb, case_factory):
    mirror = case_factory("ex-mirror", summary="The pole falls after a few dozen steps; training stopped early.")
    other = case_factory("ex-other", summary="The pole falls after a few dozen steps; training was cut short.")
    kb.add_many([mirror, other])
    everything = {h.case.case_id for h in kb.similar("pole falls after a few dozen steps", k=5)}
    assert {"ex-mirror", "ex-other"} <= everything
    hidden = {h.case.case_id for h in kb.similar("pole falls after a few dozen steps", k=5, exclude_ids=["ex-mirror"])}
    assert "ex-mirror" not in hidden and "ex-other" in hidden  # what run_bench hands the fix loop as exclude_ids
    (lander,) = load_scenarios("lunar_hover")
    assert "ex-lunarlander-hover-timecost-01" in lander.examples_excluded  # the link is declared, not guessed


# ---- the fixing arms verify as the loop does: screen, then confirm on fresh seeds ------------------


def _scripted_verify(monkeypatch, screens: list[bool], confirm_improves: bool) -> list[tuple[str, int]]:
    """verify_patch scripted: the i-th screen clears when ``screens[i]``; a confirmation ends improved when
    ``confirm_improves``. Returns (stage, seed_base) of every call."""
    from remedy.cases.model import Case, EnvTraits, Signature, Stage, Status, Subject, Verification
    from remedy.cases.verify import verification

    calls: list[tuple[str, int]] = []
    cleared = iter(screens)

    def verify(run, patch, config, *, scenario=None, rollouts=None, stage=Stage.screen, confirms=None, **_):
        calls.append((Stage(stage).value, config.seed_base))
        if stage == Stage.confirm:
            v = Verification(status=Status.improved if confirm_improves else Status.no_effect, stage=stage,
                             env_steps=100, confirms=confirms)  # fmt: skip
        else:
            v = Verification(status=Status.inconclusive, passed_screen=next(cleared), env_steps=10)
        subject = Subject(
            env_id="CartPole-v1",
            algo="PPO",
            train_steps=1000,
            traits=EnvTraits(action_space="discrete", obs_dim=4, action_dim=2),
        )
        cid = f"c-{len(calls):016x}"
        return Case(case_id=cid, source="bench", subject=subject, signature=Signature(summary="s"), patch=patch,
                    verification=v)  # fmt: skip

    monkeypatch.setattr(verification, "verify_patch", verify)
    return calls


def _zoo_patient():
    return next(s for s in load_scenarios() if s.name == "cartpole_undertrained")


def test_a_fixing_arm_confirms_a_cleared_screen_and_can_fix(monkeypatch):
    from remedy.cases.verify.verification import VerifyConfig
    from remedy.kb.baselines import run_fix_baseline

    calls = _scripted_verify(monkeypatch, [False, True, True], confirm_improves=True)
    out = run_fix_baseline("random_search", _zoo_patient(), None, 3, VerifyConfig(seeds=2, confirm_seeds=4), seed=0)
    assert out.fixed and out.attempts == 2 and out.env_steps == 10 + 10 + 100
    assert out.statuses == ["inconclusive", "inconclusive", "confirm:improved"]
    assert calls[-1] == ("confirm", 2)  # the confirmation trains the seeds after the screen's


def test_a_fixing_arm_spends_at_most_the_loops_confirmations(monkeypatch):
    from remedy.cases.verify.verification import VerifyConfig
    from remedy.kb.baselines import run_fix_baseline

    calls = _scripted_verify(monkeypatch, [True, True, True, True], confirm_improves=False)
    out = run_fix_baseline("random_search", _zoo_patient(), None, 4, VerifyConfig(seeds=2, confirm_seeds=4), seed=0)
    assert not out.fixed and out.attempts == 4
    confirms = [c for c in calls if c[0] == "confirm"]
    assert confirms == [("confirm", 2), ("confirm", 6)]  # two disjoint fresh blocks, then none
