"""Statistics pinned against values computed by hand on tiny arrays."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remedy.cases.model import Effect
from remedy.cases.verify.stats import (
    bootstrap_ci,
    effect,
    iqm,
    iqm_diff,
    mean,
    mean_diff,
    permutation_p,
    prob_improvement,
    run_scores,
    welch_interval,
    within_run_variance,
)


def test_iqm_drops_a_quarter_from_each_end():
    assert iqm([1, 2, 3, 4, 5, 6, 7, 8]) == pytest.approx(4.5)  # mean(3, 4, 5, 6)
    assert iqm([100, 1, 10, 2]) == pytest.approx(6.0)  # mean(2, 10)
    assert iqm([1, 2, 3, 4, 5]) == pytest.approx(3.0)  # int(1.25) = 1 cut: mean(2, 3, 4)
    assert iqm([[1, 2], [3, 4]]) == pytest.approx(2.5)  # flattened
    with pytest.raises(ValueError):
        iqm([])


def test_pooled_differences():
    assert iqm_diff([[1, 2], [3, 4]], [[0, 0, 0, 0]]) == pytest.approx(2.5)
    assert mean_diff([[1, 0], [1, 1]], [[0, 1]]) == pytest.approx(0.25)
    assert list(run_scores([[1, 0], [1, 1]], mean)) == [0.5, 1.0]


def test_prob_improvement_counts_pairs_and_half_ties():
    # pairs won: 1 beats 0 (1); 2 beats 0 and ties 2,2 (1 + 0.5 + 0.5); 3 beats all (3) -> 6 / 9
    assert prob_improvement([1, 2, 3], [2, 2, 0]) == pytest.approx(6 / 9)
    assert prob_improvement([1.0], [1.0]) == pytest.approx(0.5)
    assert prob_improvement([2.0], [1.0]) == pytest.approx(1.0)
    assert prob_improvement([0.0, 0.0], [1.0]) == pytest.approx(0.0)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(-5, 5), min_size=1, max_size=6),
    st.lists(st.integers(-5, 5), min_size=1, max_size=6),
)
def test_prob_improvement_is_antisymmetric(x, y):
    p, q = prob_improvement(x, y), prob_improvement(y, x)
    assert 0.0 <= p <= 1.0
    assert p + q == pytest.approx(1.0)


def test_bootstrap_of_constant_arms_is_a_point():
    assert bootstrap_ci([[5.0, 5.0], [5.0]], [[3.0, 3.0, 3.0]], n_boot=200) == pytest.approx((2.0, 2.0))


def test_bootstrap_resamples_runs_within_the_arm():
    # control runs score 0 and 1; a resample of 2 runs has mean 0, .5 or 1 (p = 1/4, 1/2, 1/4)
    # so the treatment-minus-control difference is 1, .5 or 0.
    t, c = [[1.0], [1.0]], [[0.0], [1.0]]
    assert bootstrap_ci(t, c, mean_diff, n_boot=2000) == pytest.approx((0.0, 1.0))
    # the 30% and 70% quantiles both fall in the middle mass (diff .5)
    assert bootstrap_ci(t, c, mean_diff, n_boot=2000, confidence=0.4) == pytest.approx((0.5, 0.5))


def test_bootstrap_is_stratified_by_run():
    # Episodes inside a run are identical, so only run resampling moves the treatment mean:
    # it takes 0, .5 or 1, and the difference to the constant control is -.5, 0 or .5.
    # A flat episode-level bootstrap over the 8 pooled values would give a narrower interval.
    t = [[0.0] * 4, [1.0] * 4]
    c = [[0.5] * 4, [0.5] * 4]
    assert bootstrap_ci(t, c, mean_diff, n_boot=2000) == pytest.approx((-0.5, 0.5))


def test_bootstrap_is_reproducible_with_random_state():
    rng = np.random.default_rng(1)
    t = [rng.normal(1, 1, 5) for _ in range(3)]
    c = [rng.normal(0, 1, 5) for _ in range(3)]
    a = bootstrap_ci(t, c, n_boot=300, random_state=7)
    assert a == bootstrap_ci(t, c, n_boot=300, random_state=7)
    assert a[0] <= iqm_diff(t, c) <= a[1]


def test_bootstrap_refuses_missing_or_nan_scores():
    with pytest.raises(ValueError):
        bootstrap_ci([], [[1.0]])
    with pytest.raises(ValueError):
        bootstrap_ci([[1.0, float("nan")]], [[1.0]])
    with pytest.raises(ValueError):
        bootstrap_ci([[1.0]], [[1.0]], confidence=1.5)


def test_effect_on_success_rate_is_seed_level():
    e = effect("success_rate", [[1, 1], [1, 0]], [[0, 0], [1, 0]], aggregate=mean)
    assert isinstance(e, Effect) and e.method == "welch_seeds"
    assert e.metric == "success_rate"
    assert e.treatment == pytest.approx(0.75)
    assert e.control == pytest.approx(0.25)
    assert e.diff == pytest.approx(0.5)
    # seed values t (1, .5), c (0, .5): each arm's variance .125 (ddof 1), floor mean(0, .5/2) = .125,
    # so se = sqrt(.125/2 + .125/2) = sqrt(.125), df = .125^2 / (2 * .0625^2 / 1) = 2, t_.975,2 = 4.302653
    half = 4.302652729911275 * np.sqrt(0.125)
    assert (e.ci_low, e.ci_high) == pytest.approx((0.5 - half, 0.5 + half))
    # run scores: treatment (1, .5), control (0, .5): pairs won 1 + 1 + 1 + .5 = 3.5 of 4
    assert e.prob_improvement == pytest.approx(3.5 / 4)
    assert e.confidence_level == 0.95


def test_effect_on_returns_uses_iqm_of_each_seed():
    e = effect("return_iqm", [[1, 2, 3, 4, 5, 6, 7, 8], [2, 2, 2, 2]], [[0, 0, 0, 100], [1, 1, 1, 1]])
    assert e.treatment == pytest.approx((4.5 + 2.0) / 2)  # mean of the seeds' IQMs
    assert e.control == pytest.approx((0.0 + 1.0) / 2)
    assert e.diff == pytest.approx(2.75)


def test_welch_interval_by_hand():
    # t (2, 4, 6): mean 4, var 4; c (1, 2, 3): mean 2, var 1; se^2 = 4/3 + 1/3 = 5/3
    # df = (5/3)^2 / ((4/3)^2/2 + (1/3)^2/2) = (25/9) / (17/18) = 50/17; t_.975,50/17 = 3.2159...
    ci = welch_interval([2, 4, 6], [1, 2, 3])
    assert ci.diff == pytest.approx(2.0) and ci.se == pytest.approx(np.sqrt(5 / 3))
    assert ci.df == pytest.approx(50 / 17)
    assert (ci.low, ci.high) == pytest.approx((-2.1553995, 6.1553995), abs=1e-6)
    # t (1, 3), c (0, 0): se = sqrt(2/2) = 1, df = 1 (the control adds nothing), t_.975,1 = 12.7062
    ci = welch_interval([1, 3], [0, 0])
    assert (ci.low, ci.high, ci.df) == pytest.approx((2 - 12.7062047, 2 + 12.7062047, 1.0))


def test_identical_seed_values_are_not_certainty():
    # three seeds that each won 1 of 20 episodes against three that won none: no seed spread on either
    # side, but each seed value is an estimate. Floor: var(1 of 20, ddof 1) / 20 = .05*.95*20/19/20 = .0025,
    # so se = sqrt(.0025/3) and df = 2 (the control has no spread at all): CI includes zero.
    t = [[1.0] + [0.0] * 19] * 3
    c = [[0.0] * 20] * 3
    e = effect("success_rate", t, c, aggregate=mean)
    half = 4.302652729911275 * np.sqrt(0.0025 / 3)
    assert (e.ci_low, e.ci_high) == pytest.approx((0.05 - half, 0.05 + half))
    assert e.ci_low < 0 < e.ci_high
    assert within_run_variance(t) == pytest.approx(0.0025)
    # every episode of every seed succeeds against none: nothing varies and the interval is the point
    assert effect("success_rate", [[1.0] * 5] * 2, [[0.0] * 5] * 2, aggregate=mean).ci_low == 1.0


def test_a_single_run_control_uses_its_episodes():
    # the checkpoint control: one run of 4 episodes (0, 0, 1, 1): floor var .3333/4, df 3
    ci = welch_interval([1.0, 1.0], [0.5], floor_control=(1 / 3) / 4, episodes=(4, 4))
    assert ci.se == pytest.approx(np.sqrt(1 / 12)) and ci.df == pytest.approx(3.0)
    assert ci.low == pytest.approx(0.5 - 3.182446305 * np.sqrt(1 / 12))


def test_welch_refuses_empty_arms_and_bad_confidence():
    with pytest.raises(ValueError):
        welch_interval([], [1.0])
    with pytest.raises(ValueError):
        welch_interval([1.0, 2.0], [1.0, 2.0], confidence=1.0)


def test_simulated_a_a_rarely_clears_zero():
    """Identical arms, seed spread equal to episode spread, 3 seeds x 20 episodes: the seed-level interval
    excludes zero upward in about 2.5% of trials; the episode bootstrap far more often (it ignores seeds)."""
    rng = np.random.default_rng(0)
    up = 0
    trials = 400
    for _ in range(trials):
        arms = [[rng.normal(rng.normal(0, 1), 1, 20) for _ in range(3)] for _ in range(2)]
        up += effect("r", arms[0], arms[1], aggregate=mean).ci_low > 0
    assert up / trials < 0.06  # nominal 0.025; binomial sd at 400 trials is 0.008


def test_permutation_p_is_exact_and_only_where_it_can_reach_the_level():
    assert permutation_p([1, 1, 1], [0, 0, 0]) == pytest.approx(1 / 20)  # the most extreme of C(6, 3)
    assert permutation_p([1, 1, 1], [0, 0, 0], level=0.025) is None  # 1/20 can never be below 2.5%
    assert permutation_p([1] * 8, [0] * 8, level=0.025) == pytest.approx(1 / 12870)
    assert permutation_p([0.5], [0.1, 0.2]) is None  # a one-run arm (a checkpoint control): no relabelling
    assert permutation_p([1, 0, 1, 0], [1, 0, 1, 0]) > 0.5  # identical arms: most relabellings are as extreme


def test_all_or_nothing_seeds_need_the_permutation_test_too():
    """8 vs 8 all-or-nothing seeds, 6 of 8 against 2 of 8: the Welch interval clears zero, the exact
    permutation test does not reach 2.5% (p = 0.066), so the status is not improved."""
    from remedy.cases.model import Status
    from remedy.cases.verify.verification import decide_status

    t = [[1.0] * 20] * 6 + [[0.0] * 20] * 2
    c = [[1.0] * 20] * 2 + [[0.0] * 20] * 6
    e = effect("success_rate", t, c, aggregate=mean)
    assert e.ci_low > 0 and e.p_value is not None and e.p_value > 0.025
    assert decide_status(e) is Status.no_effect
    strong = effect("success_rate", [[1.0] * 20] * 8, [[0.0] * 20] * 7 + [[1.0] * 20], aggregate=mean)
    assert strong.p_value is not None and strong.p_value < 0.025 and decide_status(strong) is Status.improved


def test_simulated_a_a_of_all_or_nothing_seeds_at_8_seeds_stays_below_the_level():
    """The case the Welch interval alone misses: 8 seeds per arm, each seed all-or-nothing with q = 0.5."""
    from remedy.cases.model import Status
    from remedy.cases.verify.verification import decide_status

    rng = np.random.default_rng(1)
    trials, up = 1000, 0
    for _ in range(trials):
        arms = [[[float(rng.random() < 0.5)] * 20 for _ in range(8)] for _ in range(2)]
        up += decide_status(effect("success_rate", arms[0], arms[1], aggregate=mean)) is Status.improved
    assert up / trials <= 0.025 + 0.01  # exact test: at most 2.5%; binomial sd at 1000 trials is 0.005
