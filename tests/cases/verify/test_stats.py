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
    prob_improvement,
    run_scores,
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


def test_effect_on_success_rate():
    e = effect("success_rate", [[1, 1], [1, 0]], [[0, 0], [1, 0]], aggregate=mean, n_boot=500)
    assert isinstance(e, Effect)
    assert e.metric == "success_rate"
    assert e.treatment == pytest.approx(0.75)
    assert e.control == pytest.approx(0.25)
    assert e.diff == pytest.approx(0.5)
    assert e.ci_low <= e.diff <= e.ci_high
    # run scores: treatment (1, .5), control (0, .5): pairs won 1 + 1 + 1 + .5 = 3.5 of 4
    assert e.prob_improvement == pytest.approx(3.5 / 4)
    assert e.confidence_level == 0.95


def test_effect_on_returns_uses_iqm():
    e = effect("return_iqm", [[1, 2, 3, 4, 5, 6, 7, 8]], [[0, 0, 0, 100]], n_boot=100)
    assert e.treatment == pytest.approx(4.5)
    assert e.control == pytest.approx(0.0)
    assert e.diff == pytest.approx(4.5)
