"""Examples from cases: attempt groups, verdicts counted once, labels, grouped deterministic splits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remedy.cases.errors import OptimizeError
from remedy.cases.model import RemedyFamily, RootCause
from remedy.optimizer import build_examples, split_examples
from remedy.optimizer.dataset import dev_answer_keys

from .conftest import fix_loop, make_case


def test_one_example_per_fix_loop_with_confirmed_labels() -> None:
    cases = fix_loop(
        "hover",
        fixed="time_limit",
        failed=("hyperparameters",),
        causes=("unstable_optimization", "time_limit_misconfiguration"),
    )
    (ex,) = build_examples(cases)
    assert ex.key == "hover-hyperparameters"
    assert ex.group == "scenario:hover"
    assert ex.families == (RemedyFamily.time_limit,)
    # the time-limit patch stands for the cause it addresses, not the diagnosis's top cause
    assert ex.causes == (RootCause.time_limit_misconfiguration,)
    # the screen and its confirmation are one attempt, at the confirmation's verdict
    assert [(t.family.value, t.status) for t in ex.tried] == [
        ("hyperparameters", "no_effect"),
        ("time_limit", "improved"),
    ]
    assert ex.tried[1].case_id == "hover-time_limit-confirm" and ex.tried[1].effect == 4.0
    assert set(ex.case_ids) == {c.case_id for c in cases}


def test_improved_only_from_a_confirmation() -> None:
    legacy = make_case(
        "old", family="normalization", status="improved", stage="screen", scenario=None, checkpoint="ab" * 32
    )
    (ex,) = build_examples([legacy])
    assert ex.tried[0].status == "inconclusive"
    assert ex.causes == () and ex.families == () and not ex.solved
    assert ex.group == "run:" + "ab" * 8


def test_unverified_and_example_cases_are_skipped() -> None:
    cases = fix_loop("a", failed=("hyperparameters",))
    lit = make_case("lit", source="example", scenario=None)
    assert [e.key for e in build_examples([*cases, lit])] == ["a-hyperparameters"]


def test_user_runs_group_by_config_when_no_checkpoint() -> None:
    a = make_case("u1", scenario=None, env_id="CartPole-v1")
    b = make_case("u2", scenario=None, env_id="CartPole-v1", minute=5)
    c = make_case("u3", scenario=None, env_id="Acrobot-v1")
    groups = {e.key: e.group for e in build_examples([a, b, c])}
    assert groups["u1"] == groups["u2"] != groups["u3"]


def _corpus(n_scenarios: int, loops: int) -> list:
    """``n_scenarios`` groups (every third solved), each with ``loops`` fix loops."""
    return [
        case
        for s in range(n_scenarios)
        for r in range(loops)
        for case in fix_loop(
            f"s{s}",
            fixed="time_limit" if s % 3 == 0 else None,
            failed=("hyperparameters", "normalization"),
            run=f"-r{r}",
        )
    ]


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 12), st.integers(1, 3), st.floats(0.05, 0.95), st.integers(0, 10_000))
def test_split_never_puts_a_group_on_both_sides(n: int, loops: int, frac: float, seed: int) -> None:
    examples = build_examples(_corpus(n, loops))
    train, val = split_examples(examples, val_fraction=frac, seed=seed)
    assert train and val
    assert not {e.group for e in train} & {e.group for e in val}
    assert sorted(e.key for e in train + val) == sorted(e.key for e in examples)
    assert split_examples(examples, val_fraction=frac, seed=seed) == (train, val)  # deterministic


def test_split_keeps_solved_groups_on_both_sides_when_it_can() -> None:
    examples = build_examples(_corpus(9, 1))  # s0, s3, s6 solved
    train, val = split_examples(examples, val_fraction=0.34, seed=3)
    assert any(e.solved for e in train) and any(e.solved for e in val)


def test_split_refuses_too_few_groups_and_bad_fractions() -> None:
    one = build_examples(fix_loop("only"))
    with pytest.raises(OptimizeError, match="at least 2"):
        split_examples(one)
    two = build_examples(fix_loop("a") + fix_loop("b"))
    with pytest.raises(OptimizeError, match="val-fraction"):
        split_examples(two, val_fraction=1.0)


def test_real_dev_cases_make_grouped_examples(dev_cases) -> None:
    examples = build_examples(dev_cases)
    assert examples
    for ex in examples:
        assert all(t.status != "improved" or t.case_id for t in ex.tried)
        assert set(ex.families) <= {t.family for t in ex.tried if t.status == "improved"}
        confirmed = {c.case_id for c in dev_cases if c.verification and c.verification.stage.value == "confirm"}
        assert all(t.case_id in confirmed for t in ex.tried if t.status == "improved")


def test_answer_keys_come_from_dev_scenarios_only() -> None:
    keys = dev_answer_keys({"lunar_hover", "acrobot_lr_too_high_0p05", "not_a_scenario"})
    assert keys == {"lunar_hover": (RootCause.reward_misspecification,)}  # the holdout one is never a label
    cases = [*fix_loop("lunar_hover"), *fix_loop("acrobot_lr_too_high_0p05"), make_case("u", scenario=None)]
    truths = {e.group: e.truth for e in build_examples(cases, answer_keys=keys)}
    assert truths["scenario:lunar_hover"] == (RootCause.reward_misspecification,)
    assert truths["scenario:acrobot_lr_too_high_0p05"] == ()
    assert all(t == () for g, t in truths.items() if g.startswith("run:"))


def test_an_example_counts_its_improved_attempts_and_those_that_made_the_agent_work() -> None:
    from remedy.optimizer.metric import score_prediction

    cases = fix_loop("hover", fixed="time_limit", failed=("hyperparameters",))
    (plain,) = build_examples(cases)
    assert (plain.n_improved, plain.n_fixed) == (1, 0)  # never judged: not fixed
    works = []
    for c in cases:
        if c.case_id == "hover-time_limit-confirm":
            c = c.model_copy(update={"verification": c.verification.model_copy(update={"fixed": True})})
        works.append(c)
    (ex,) = build_examples(works)
    assert (ex.n_improved, ex.n_fixed) == (1, 1) and ex.tried[1].fixed and not ex.tried[0].fixed
    assert "improved, fixed" in ex.tried[1].text()
    feedback = score_prediction(ex, [RootCause.time_limit_misconfiguration], [RemedyFamily.time_limit]).feedback
    assert "1 of 1 improved attempts made the agent work" in feedback
