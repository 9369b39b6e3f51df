"""Statistics for verification: seed-level effects, Welch intervals, probability of improvement.

Small pure functions in the style of rliable (Agarwal et al., 2021). The array
shape used throughout is an **arm**: a sequence of runs (one per training seed),
each a 1-D array of per-episode scores (a float return, or 1.0/0.0 for success).
Runs may have different lengths.

**The training seed is the experimental unit.** A verification compares two
training interventions, so the evidence about the patch is how the fine-tuned
agents differ, seed by seed; the episodes of one run only estimate that run's
value. :func:`effect` therefore reduces each run to one value (the IQM of its
returns, or its success rate) and compares the two arms' seed values with a
**Welch t-interval** (unequal variances, Welch–Satterthwaite degrees of
freedom, ``scipy.stats.t`` quantiles):

    diff = mean(t_values) - mean(c_values)
    se   = sqrt(v_t / n_t + v_c / n_c)
    df   = (v_t/n_t + v_c/n_c)^2 / ((v_t/n_t)^2 / df_t + (v_c/n_c)^2 / df_c)
    CI   = diff ± t_{1-(1-confidence)/2, df} · se

where ``v`` is an arm's sample variance of seed values (ddof 1), ``df_arm =
n_arm - 1``. Two guards keep small discrete samples honest:

- ``v`` is never below the within-run sampling variance (the mean over the
  arm's runs of ``var(episodes, ddof=1) / n_episodes``): a seed's value is
  itself an estimate, so identical seed values (three runs that each won 1 of 20
  episodes) do not make a zero-width interval.
- An arm of ONE run (a checkpoint control, which is not trained and so has no
  seed-to-seed spread) contributes only that within-run variance, with
  ``n_episodes - 1`` degrees of freedom. A trained arm needs at least two seeds
  for a conclusion: verification reports ``inconclusive`` otherwise.

Why Welch and not a permutation test across seeds: an exact permutation test
over 2 vs 2 seeds has only C(4, 2) = 6 arrangements, so its smallest one-sided
p-value is 1/6 — it can never call anything at 2 seeds (3 vs 3: 1/20 = 0.05,
still not below 0.05). That is honest, but useless at the budgets a fix loop
can afford. The Welch interval can reach a conclusion at 2 seeds when the seed
values are far apart and tight, and with df as low as 1 it is very wide
otherwise (t_{0.975, 1} = 12.7). It assumes seed values roughly normal; the
A/A simulations in ``bench/calibration.py`` measure its false-``improved`` rate
over seeds {2, 3, 5} × episodes {5, 20} × seed-spread ratios {0, .5, 1, 2}.

A status is decided from the interval's sides: ``improved`` needs ``ci_low >
0``, a one-sided test at level ``(1 - confidence) / 2`` (2.5% at 95%).

Where it is not calibrated: all-or-nothing seeds (each seed succeeds in every
evaluation episode or in none — common when fine-tunes either learn the task or
do not). Then both arms can be constant by chance, the interval collapses to a
point, and an A/A screen says ``improved`` with probability q²(1−q)² at 2 seeds
(up to 1/16 = 6.25% at q = 0.5), q³(1−q)³ ≤ 1.6% at 3. The confirmation, an
independent repeat, bounds the pair by the product (≤ 0.4% at 2 seeds).

**An exact permutation gate.** Where both arms hold at least 2 seed values and
the number of relabellings C(n + m, n) can reach the one-sided level (4 vs 4 and
up at 2.5%; not 3 vs 3, whose smallest p is 1/20), :func:`effect` also records
the exact one-sided permutation p-value over seed values (:func:`permutation_p`),
and ``improved`` needs it at or below the level too. The Welch interval alone,
over 8 all-or-nothing seeds per arm, cleared zero in about 4% of A/A trials
(``bench/calibration.py sim --confirm-seeds 8``: up to 4.6%); the permutation
test is exact whatever the seed values' distribution.

**Screen, then confirm; the family-wise error.** A fix loop screens many
candidates with the same seeds (even the same control runs), picks what clears
the screen, and only then re-verifies it on FRESH training seeds and fresh
evaluation episodes, used by nothing before. Only that confirmation can make a
case ``improved``. Because the confirmation's data are new, its false-pass
probability is at most ``a = (1 - confidence) / 2`` conditional on everything
that happened before — however many candidates were screened, and however the
screened winner was picked. So a loop that runs at most ``M`` confirmations
reports a false fix (any null patch ``improved``) with probability at most
``M · a`` (union bound over the confirmations); the fix loop's default ``M = 2``
at 95% gives ≤ 5%, and each individual reported fix is a false positive with
probability ≤ 2.5%. The screen's own selection bias never reaches the reported
status; the reported effect size is the confirmation's, not the screen's. For the
same reason the screen may pass at a laxer level than the confirmation
(``VerifyConfig.screen_confidence``, 80% two-sided by default): that changes how
many confirmations a loop spends and how many real fixes it finds, never the bound.

**A sequential confirmation** (:class:`SequentialDesign`, :func:`sequential_look`) looks at the seeds in
groups (by default after 4 and 8 per arm) and stops at the first look whose evidence is decisive. The
one-sided level is spent over the looks by a Lan-DeMets spending function (:func:`spending_boundaries`,
Pocock-type by default: 0.0155 at 4 seeds and 0.0139 at 8 for a total of 0.025), each look is the Welch
interval and the exact permutation test at its nominal level, and a look half-way whose difference is
not above zero stops for futility (non-binding: it only lowers the false-pass rate). Pocock-type rather
than O'Brien-Fleming-type because the permutation test over 4 vs 4 seeds cannot go below 1/70 = 0.0143:
O'Brien-Fleming's first look (0.0015) could never stop, Pocock's can, when every treatment seed beats every
control seed. The boundaries come from the normal approximation of the looks' joint distribution; the A/A
tables of ``bench/calibration.py power`` measure what they give on few, discrete seeds.

:func:`bootstrap_ci` is the first, episode-level stratified bootstrap (runs,
then episodes within runs, percentile CI), kept so that the calibration bench
can show its rate beside the seed-level one: in an A/A simulation it excluded
zero in 29% of trials at 2 seeds, 17% at 3, 11% at 5, against a nominal 5%.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations, pairwise
from math import comb

import numpy as np
from scipy import stats as _st
from scipy.optimize import brentq

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
    "SeedInterval",
    "within_run_variance",
    "welch_interval",
    "effect",
    "permutation_p",
    "METHOD",
    "SPENDING",
    "Boundaries",
    "spending_boundaries",
    "SequentialDesign",
    "sequential_look",
    "IMPROVED",
    "FUTILE",
    "CONTINUE",
    "END",
]

#: How :func:`effect` computes its interval (recorded in each :class:`Effect`).
METHOD = "welch_seeds"

#: An arm: one 1-D array of per-episode scores per run (seed).
Arm = Sequence[Sequence[float] | np.ndarray]
#: A statistic of two arms (treatment, control) -> float, e.g. :func:`iqm_diff`.
Statistic = Callable[[list[np.ndarray], list[np.ndarray]], float]


def iqm(x: Sequence[float] | np.ndarray) -> float:
    """Interquartile mean: the mean of the middle 50% of ``x`` (25% cut from each end).

    ``x`` is flattened. rliable's definition, the cut of ``scipy.stats.trim_mean(x, 0.25)``: with
    ``n`` values, ``int(0.25 * n)`` are dropped from each end. Computed with a sort: trim_mean's
    argument handling took most of the time of a simulated verification (``bench/calibration.py``).
    """
    a = np.sort(np.asarray(x, dtype=float).ravel())
    if a.size == 0:
        raise ValueError("iqm of an empty array")
    cut = int(0.25 * a.size)
    return float(a[cut : a.size - cut].mean())


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
    "probability of improvement"; ``scipy.stats.mannwhitneyu``'s U, counted directly over
    the pairs, which is faster on a few seeds). Inputs are run-level scores, shape ``(n_runs,)`` each.
    """
    x = np.asarray(treatment, dtype=float).ravel()
    y = np.asarray(control, dtype=float).ravel()
    if x.size == 0 or y.size == 0:
        raise ValueError("prob_improvement needs at least one score per arm")
    u = np.sum(x[:, None] > y[None, :]) + 0.5 * np.sum(x[:, None] == y[None, :])
    return float(u) / (x.size * y.size)


@dataclass(frozen=True)
class SeedInterval:
    """A Welch t-interval for the difference of two arms' mean seed values."""

    diff: float
    low: float
    high: float
    se: float
    df: float  # Welch–Satterthwaite degrees of freedom (inf when the interval is a point)


def within_run_variance(arm: Arm) -> float:
    """Sampling variance of one run's value, averaged over the arm's runs: mean of ``var(x, ddof=1) / len(x)``.

    Runs of one episode contribute 0 (nothing is known about their spread).
    """
    runs = _checked(arm, "an")
    return float(np.mean([r.var(ddof=1) / r.size if r.size > 1 else 0.0 for r in runs]))


def _arm_term(values: np.ndarray, floor: float, episodes: int) -> tuple[float, float]:
    """(variance of the arm's mean, its degrees of freedom) for the Welch interval."""
    n = values.size
    if n == 1:  # an untrained reference: only its episodes' sampling error
        return floor, float(max(episodes - 1, 1))
    return max(float(values.var(ddof=1)), floor) / n, float(n - 1)


def welch_interval(
    treatment: Sequence[float] | np.ndarray,
    control: Sequence[float] | np.ndarray,
    confidence: float = 0.95,
    *,
    floor_treatment: float = 0.0,
    floor_control: float = 0.0,
    episodes: tuple[int, int] = (1, 1),
) -> SeedInterval:
    """Welch t-interval of ``mean(treatment) - mean(control)`` over seed values, shape ``(n_seeds,)`` each.

    ``floor_*`` is the least variance of one seed value (see :func:`within_run_variance`);
    an arm of one value uses its floor with ``episodes - 1`` degrees of freedom.
    """
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    t, c = np.asarray(treatment, dtype=float).ravel(), np.asarray(control, dtype=float).ravel()
    if t.size == 0 or c.size == 0:
        raise ValueError("welch_interval needs at least one seed value per arm")
    (a, df_a), (b, df_b) = _arm_term(t, floor_treatment, episodes[0]), _arm_term(c, floor_control, episodes[1])
    diff = float(t.mean() - c.mean())
    se = float(np.sqrt(a + b))
    if se == 0.0:
        return SeedInterval(diff, diff, diff, 0.0, float("inf"))
    df = (a + b) ** 2 / sum(v * v / d for v, d in ((a, df_a), (b, df_b)) if v > 0)
    half = float(_st.t.ppf(0.5 + confidence / 2, df)) * se
    return SeedInterval(diff, diff - half, diff + half, se, float(df))


#: the most arrangements :func:`permutation_p` enumerates (10 vs 10 seeds: 184,756)
MAX_ARRANGEMENTS = 200_000


@lru_cache(maxsize=16)
def _arrangements(n: int, m: int) -> np.ndarray:
    """Every choice of ``n`` of ``n + m`` positions, one row each (the treatment's seats in a relabelling)."""
    return np.array(list(combinations(range(n + m), n)), dtype=np.int32)


def permutation_p(
    treatment: Sequence[float] | np.ndarray, control: Sequence[float] | np.ndarray, level: float | None = None
) -> float | None:
    """Exact one-sided permutation p-value of ``mean(treatment) - mean(control)`` over seed values.

    Under "the patch changes nothing" the seed values of both arms are exchangeable, so every relabelling
    of the ``n + m`` values into ``n`` and ``m`` is equally likely; p is the share of relabellings whose
    treatment mean is at least the observed one (ties count). Exact for any distribution of seed values,
    all-or-nothing seeds included. None when an arm has fewer than 2 values, when there are more than
    :data:`MAX_ARRANGEMENTS` relabellings, or, given ``level``, when even the most extreme relabelling
    cannot reach it (3 vs 3 seeds: 20 relabellings, so p is never below 1/20).
    """
    t, c = np.asarray(treatment, dtype=float).ravel(), np.asarray(control, dtype=float).ravel()
    n, m = t.size, c.size
    total = comb(n + m, n)
    if n < 2 or m < 2 or total > MAX_ARRANGEMENTS or (level is not None and 1 / total > level):
        return None
    values = np.concatenate([t, c])
    sums = values[_arrangements(n, m)].sum(axis=1)  # the treatment mean is monotone in the treatment's sum
    tol = 1e-9 * max(1.0, float(np.abs(values).max()))
    return float(np.mean(sums >= t.sum() - tol))


def effect(
    metric: str,
    treatment_runs: Arm,
    control_runs: Arm,
    *,
    aggregate: Callable[[np.ndarray], float] = iqm,
    confidence: float = 0.95,
) -> Effect:
    """Treatment minus control on one metric, from seed-level values with a Welch t-interval.

    ``aggregate`` (``iqm`` for returns, ``mean`` for rates) reduces each run to its
    seed value; the point values are the arms' means of seed values, the interval is
    :func:`welch_interval` with :func:`within_run_variance` floors, and the probability
    of improvement is over seed values. Deterministic: no resampling.
    """
    t, c = _checked(treatment_runs, "treatment"), _checked(control_runs, "control")
    tv, cv = run_scores(t, aggregate), run_scores(c, aggregate)
    ci = welch_interval(
        tv,
        cv,
        confidence,
        floor_treatment=within_run_variance(t),
        floor_control=within_run_variance(c),
        episodes=(min(r.size for r in t), min(r.size for r in c)),
    )
    return Effect(
        metric=metric,
        treatment=float(tv.mean()),
        control=float(cv.mean()),
        diff=ci.diff,
        ci_low=ci.low,
        ci_high=ci.high,
        prob_improvement=prob_improvement(tv, cv),
        p_value=permutation_p(tv, cv, level=(1 - confidence) / 2),
        confidence_level=confidence,
        method=METHOD,
    )


# --------------------------------------------------------------------------- sequential confirmation

#: Lan-DeMets spending functions: the share of the one-sided ``alpha`` spent by information fraction ``t``
SPENDING: dict[str, Callable[[float, float], float]] = {
    # Pocock-type (Lan & DeMets 1983): nearly equal nominal levels at every look
    "pocock": lambda alpha, t: alpha * float(np.log1p((np.e - 1.0) * t)),
    # O'Brien-Fleming-type: almost nothing early, nearly the whole alpha at the last look
    "obrien_fleming": lambda alpha, t: 2.0 * float(_st.norm.sf(_st.norm.isf(alpha / 2.0) / np.sqrt(t))),
}


@dataclass(frozen=True)
class Boundaries:
    """One-sided efficacy boundaries of a group-sequential test, one entry per look.

    ``z``: the boundary on the standardized statistic; ``levels``: the nominal one-sided p-value
    each look must reach (``1 - Phi(z)``); ``spent``: the cumulative alpha spent by that look.
    """

    fractions: tuple[float, ...]
    z: tuple[float, ...]
    levels: tuple[float, ...]
    spent: tuple[float, ...]


def _no_cross(z: Sequence[float], fractions: Sequence[float]) -> float:
    """P(Z_1 < z_1, ..., Z_k < z_k) under the null, for the canonical joint distribution of the looks'
    statistics (corr(Z_i, Z_j) = sqrt(t_i / t_j), i <= j)."""
    t = np.asarray(fractions, dtype=float)
    if t.size == 1:
        return float(_st.norm.cdf(z[0]))
    cov = np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))
    # Genz's quasi-Monte Carlo integration: a fixed generator and a tight tolerance keep it deterministic
    return float(
        _st.multivariate_normal.cdf(
            np.asarray(z), mean=np.zeros(t.size), cov=cov, abseps=1e-8, releps=1e-8, rng=np.random.default_rng(0)
        )
    )


def _boundary(earlier: list[float], fractions: tuple[float, ...], spend: float) -> float:
    """The boundary of the last of ``fractions`` that spends ``spend`` given the ``earlier`` looks' boundaries."""
    if not earlier:
        return float(_st.norm.isf(spend))
    before = _no_cross(earlier, fractions[:-1])
    return float(brentq(lambda c: before - _no_cross([*earlier, c], fractions) - spend, -10.0, 10.0, xtol=1e-6))


@lru_cache(maxsize=64)
def spending_boundaries(fractions: tuple[float, ...], alpha: float = 0.025, kind: str = "pocock") -> Boundaries:
    """Lan-DeMets alpha-spending boundaries (one-sided ``alpha``) at information ``fractions`` (increasing, last 1).

    Look k spends ``alpha(t_k) - alpha(t_{k-1})`` of the spending function ``kind`` (:data:`SPENDING`):
    its boundary ``z_k`` solves ``P(no crossing before k, Z_k >= z_k) = alpha(t_k) - alpha(t_{k-1})``
    under the multivariate normal of the looks' statistics (scipy's ``multivariate_normal.cdf`` and
    ``scipy.optimize.brentq``). Two looks at half and all of the seeds, alpha 0.025: Pocock-type z = (2.157, 2.201),
    O'Brien-Fleming-type (2.963, 1.969), as tabulated by gsDesign's ``sfLDPocock`` and ``sfLDOF``.
    """
    t = tuple(float(f) for f in fractions)
    if not t or any(b <= a for a, b in pairwise(t)) or t[0] <= 0 or abs(t[-1] - 1.0) > 1e-9:
        raise ValueError("fractions must increase from above 0 to 1")
    if not 0 < alpha < 0.5:
        raise ValueError("alpha must be in (0, 0.5)")
    if kind not in SPENDING:
        raise ValueError(f"unknown spending function {kind!r}; one of {sorted(SPENDING)}")
    spent = [SPENDING[kind](alpha, f) for f in t]
    spent[-1] = alpha  # the whole alpha by the last look, whatever rounding the spending function does
    z: list[float] = []
    for k in range(len(t)):
        z.append(_boundary(z, t[: k + 1], spent[k] - (spent[k - 1] if k else 0.0)))
    return Boundaries(t, tuple(z), tuple(float(_st.norm.sf(c)) for c in z), tuple(spent))


@dataclass(frozen=True)
class SequentialDesign:
    """A group-sequential confirmation: looks after ``looks[k]`` training seeds per arm (increasing), a one-sided
    ``alpha`` spent over them by the ``spending`` function (:func:`spending_boundaries`), and, with ``futility``,
    a stop at an interim look whose difference is not above zero (non-binding: it can only lower the false-pass
    rate, so the efficacy boundaries ignore it)."""

    looks: tuple[int, ...] = (4, 8)
    alpha: float = 0.025
    spending: str = "pocock"
    futility: bool = True

    @property
    def boundaries(self) -> Boundaries:
        """The efficacy boundaries at the looks' information fractions (seeds so far over the last look's)."""
        return spending_boundaries(tuple(n / self.looks[-1] for n in self.looks), self.alpha, self.spending)

    def level(self, k: int) -> float:
        """The nominal one-sided level look ``k`` (0-based) must reach."""
        return self.boundaries.levels[k]

    def check(self) -> None:
        """Refuse looks that cannot be a design: at least 2 seeds at the first look, strictly increasing."""
        if not self.looks or self.looks[0] < 2 or any(b <= a for a, b in pairwise(self.looks)):
            raise ValueError(f"looks must increase from at least 2 seeds per arm (got {self.looks})")


#: what a look decides: a confirmed gain, a futility stop, go on to the next look, or the last look without a gain
LookVerdict = str
IMPROVED, FUTILE, CONTINUE, END = "improved", "futile", "continue", "end"


def sequential_look(
    metric: str,
    treatment_runs: Arm,
    control_runs: Arm,
    design: SequentialDesign,
    k: int,
    *,
    aggregate: Callable[[np.ndarray], float] = iqm,
) -> tuple[Effect, LookVerdict]:
    """Look ``k`` (0-based) of ``design`` over the runs so far: the effect at the look's level and what it decides.

    The effect is :func:`effect` at two-sided confidence ``1 - 2 * level_k``, so its interval and permutation
    p-value are those the look tests. ``improved`` when the interval clears zero and the exact permutation
    p-value reaches ``level_k``; at an interim look where the permutation test applies (2+ seeds per arm) but
    cannot reach the level (too few relabellings) there is no efficacy stop, since the Welch interval alone
    is not calibrated on all-or-nothing seeds; an arm of one run (a checkpoint control) has no permutation
    test, and the interval decides alone, as in :func:`effect`. ``futile`` (interim, with ``design.futility``)
    when the difference is not above zero; ``end`` at the last look without a gain; else ``continue``.
    """
    level = design.level(k)
    e = effect(metric, treatment_runs, control_runs, aggregate=aggregate, confidence=1.0 - 2.0 * level)
    last = k == len(design.looks) - 1
    if len(treatment_runs) < 2 or len(control_runs) < 2:
        gate = True  # no relabelling of a one-run arm: the interval decides alone
    elif e.p_value is not None:
        gate = e.p_value <= level
    else:
        gate = last  # the level is out of the permutation test's reach: only the last look falls back, as before
    if e.ci_low > 0 and gate:
        return e, IMPROVED
    if last:
        return e, END
    return e, (FUTILE if design.futility and e.diff <= 0 else CONTINUE)
