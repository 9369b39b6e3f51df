"""Statistics for verification: IQM, stratified bootstrap CIs, probability of improvement.

Small pure functions in the style of rliable (Agarwal et al., 2021). The array
shape used throughout is an **arm**: a sequence of runs (one per training seed),
each a 1-D array of per-episode scores (a float return, or 1.0/0.0 for success).
Runs may have different lengths. Every random path takes an explicit
``random_state`` so the same inputs always give the same interval.

Where scipy fits it is used (``scipy.stats.trim_mean`` for the IQM,
``scipy.stats.mannwhitneyu`` for the probability of improvement). The bootstrap
is hand-written: ``scipy.stats.bootstrap`` resamples flat samples only, while
verification needs a two-level (stratified) resample — runs within an arm, then
episodes within each chosen run — so seed-to-seed variance is not mistaken for
episode noise.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from scipy import stats as _st

from ..model import Effect

__all__ = [
    "Arm",
    "Statistic",
    "iqm",
    "mean",
    "pooled",
    "iqm_diff",
    "mean_diff",
    "run_scores",
    "bootstrap_ci",
    "prob_improvement",
    "effect",
]

#: An arm: one 1-D array of per-episode scores per run (seed).
Arm = Sequence[Sequence[float] | np.ndarray]
#: A statistic of two arms (treatment, control) -> float, e.g. :func:`iqm_diff`.
Statistic = Callable[[list[np.ndarray], list[np.ndarray]], float]


def iqm(x: Sequence[float] | np.ndarray) -> float:
    """Interquartile mean: the mean of the middle 50% of ``x`` (25% cut from each end).

    ``x`` is flattened. Uses ``scipy.stats.trim_mean`` (rliable's definition): with
    ``n`` values, ``int(0.25 * n)`` are dropped from each end.
    """
    a = np.asarray(x, dtype=float).ravel()
    if a.size == 0:
        raise ValueError("iqm of an empty array")
    return float(_st.trim_mean(a, 0.25))


def mean(x: Sequence[float] | np.ndarray) -> float:
    """Arithmetic mean of ``x`` (flattened); the aggregate for rates such as success."""
    a = np.asarray(x, dtype=float).ravel()
    if a.size == 0:
        raise ValueError("mean of an empty array")
    return float(a.mean())


def pooled(arm: Arm) -> np.ndarray:
    """All episodes of all runs of an arm as one 1-D array."""
    return np.concatenate([np.asarray(r, dtype=float).ravel() for r in arm])


def iqm_diff(treatment: Arm, control: Arm) -> float:
    """IQM of the treatment's pooled episodes minus the control's."""
    return iqm(pooled(treatment)) - iqm(pooled(control))


def mean_diff(treatment: Arm, control: Arm) -> float:
    """Mean of the treatment's pooled episodes minus the control's (success-rate difference)."""
    return mean(pooled(treatment)) - mean(pooled(control))


def run_scores(arm: Arm, aggregate: Callable[[np.ndarray], float] = iqm) -> np.ndarray:
    """One score per run: ``aggregate`` over that run's episodes; shape ``(n_runs,)``."""
    return np.array([aggregate(np.asarray(r, dtype=float)) for r in arm], dtype=float)


def _checked(arm: Arm, name: str) -> list[np.ndarray]:
    runs = [np.asarray(r, dtype=float).ravel() for r in arm]
    if not runs or any(r.size == 0 for r in runs):
        raise ValueError(f"{name} arm needs at least one run with at least one episode")
    if not all(np.isfinite(r).all() for r in runs):
        raise ValueError(f"{name} arm holds NaN or inf scores; a failed evaluation is not a score")
    return runs


def _resample_arm(runs: list[np.ndarray], rng: np.random.Generator) -> list[np.ndarray]:
    """Stratified resample: runs with replacement, then episodes with replacement within each run."""
    picked = rng.integers(0, len(runs), size=len(runs))
    return [runs[i][rng.integers(0, runs[i].size, size=runs[i].size)] for i in picked]


def bootstrap_ci(
    treatment_runs: Arm,
    control_runs: Arm,
    statistic: Statistic = iqm_diff,
    n_boot: int = 2000,
    confidence: float = 0.95,
    random_state: int | np.random.Generator = 0,
) -> tuple[float, float]:
    """Percentile CI of ``statistic(treatment, control)`` under a stratified bootstrap.

    Each of ``n_boot`` replicates resamples, independently per arm, the runs of
    the arm with replacement and then the episodes within each chosen run with
    replacement. Returns ``(low, high)`` at the two-sided ``confidence`` level.
    """
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    if n_boot < 1:
        raise ValueError("n_boot must be positive")
    t, c = _checked(treatment_runs, "treatment"), _checked(control_runs, "control")
    rng = np.random.default_rng(random_state)
    reps = np.array([statistic(_resample_arm(t, rng), _resample_arm(c, rng)) for _ in range(n_boot)])
    alpha = 1.0 - confidence
    low, high = np.quantile(reps, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


def prob_improvement(treatment: Sequence[float] | np.ndarray, control: Sequence[float] | np.ndarray) -> float:
    """P(X > Y) + 0.5 P(X = Y) for X a treatment run score and Y a control run score.

    The Mann–Whitney U statistic of the treatment over ``n * m`` (rliable's
    "probability of improvement"), from ``scipy.stats.mannwhitneyu``. Inputs are
    run-level scores, shape ``(n_runs,)`` each.
    """
    x = np.asarray(treatment, dtype=float).ravel()
    y = np.asarray(control, dtype=float).ravel()
    if x.size == 0 or y.size == 0:
        raise ValueError("prob_improvement needs at least one score per arm")
    u = _st.mannwhitneyu(x, y, alternative="two-sided", method="asymptotic").statistic
    return float(u) / (x.size * y.size)


def effect(
    metric: str,
    treatment_runs: Arm,
    control_runs: Arm,
    *,
    aggregate: Callable[[np.ndarray], float] = iqm,
    n_boot: int = 2000,
    confidence: float = 0.95,
    random_state: int = 0,
) -> Effect:
    """Treatment minus control on one metric, with a stratified bootstrap CI.

    ``aggregate`` (``iqm`` for returns, ``mean`` for rates) is applied to each
    arm's pooled episodes for the point values, to each replicate for the CI,
    and to each run for the probability of improvement.
    """
    t, c = _checked(treatment_runs, "treatment"), _checked(control_runs, "control")

    def stat(a: list[np.ndarray], b: list[np.ndarray]) -> float:
        return aggregate(pooled(a)) - aggregate(pooled(b))

    tv, cv = aggregate(pooled(t)), aggregate(pooled(c))
    low, high = bootstrap_ci(t, c, stat, n_boot=n_boot, confidence=confidence, random_state=random_state)
    pi = prob_improvement(run_scores(t, aggregate), run_scores(c, aggregate))
    return Effect(
        metric=metric,
        treatment=tv,
        control=cv,
        diff=tv - cv,
        ci_low=low,
        ci_high=high,
        prob_improvement=pi,
        confidence_level=confidence,
    )
