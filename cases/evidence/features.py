"""Signature features: each feature of the vocabulary, defined once as a small function.

A feature function takes the evidence bundle and the subject and returns a
float; its docstring says what it measures (the same words as
:data:`remedy.cases.vocab.FEATURES`). NaN means "not measurable here" (no
training logs, a continuous-action measure on discrete actions). Per-reward-
component statistics (Eureka-style reward reflection) are named
``component.<name>.mean|std|success_corr``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import gymnasium as gym
import numpy as np

from ..model import ActionSpaceType, Subject
from ..verify.stats import iqm as _stats_iqm
from ..vocab import COMPONENT_PREFIX, FEATURES
from .envs import registered_time_limit
from .rollouts import EpisodeRecord, EvidenceBundle, TrainingLog

__all__ = [
    "Features",
    "FEATURE_FUNCS",
    "compute_features",
    "component_features",
    "iqm",
    "smooth_curve",
    "PLATEAU_SLOPE",
    "COVERAGE_BINS",
    "CURVE_POINTS",
]

PLATEAU_SLOPE = 0.05  #: |relative slope| of the last third below this is a plateau
COVERAGE_BINS = 20  #: cells per axis of the state-coverage grid
CURVE_POINTS = 50  #: learning curves are resampled onto this many evenly spaced timesteps
_MIN_CURVE_POINTS = 10  # fewer logged points are noise, not a curve

Features = dict[str, float]
_NAN = math.nan


# ---------------------------------------------------------------- helpers


def iqm(x: np.ndarray) -> float:
    """Interquartile mean of the finite values of ``x`` (:func:`remedy.cases.verify.stats.iqm`); NaN when none."""
    a = np.asarray(x, dtype=float).ravel()
    a = a[np.isfinite(a)]
    return _stats_iqm(a) if a.size else _NAN


def smooth_curve(values: np.ndarray, window: int | None = None) -> np.ndarray:
    """Moving average with a window of ~1/10 of the curve (at least 1)."""
    v = np.asarray(values, dtype=float)
    w = window or max(1, len(v) // 10)
    if w <= 1 or len(v) < w:
        return v
    return np.convolve(v, np.ones(w) / w, mode="valid")


def _rets(eps: list[EpisodeRecord]) -> np.ndarray:
    return np.asarray([e.ret for e in eps], dtype=float)


def _mean(xs) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return float(np.mean(xs)) if xs else _NAN


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) < 3 or np.std(a) < 1e-12 or np.std(b) < 1e-12 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return _NAN
    return float(np.corrcoef(a, b)[0, 1])


def _curve(log: TrainingLog | None) -> np.ndarray | None:
    """The learning curve smoothed and resampled onto CURVE_POINTS evenly spaced timesteps.

    Monitor logs give one point per episode (late episodes are often longer, so
    fewer points); resampling by timesteps makes "the last third" mean the last
    third of training whatever the log's source.
    """
    if log is None or log.ep_return.size < _MIN_CURVE_POINTS:
        return None
    order = np.argsort(log.timesteps, kind="stable")
    ts, ret = np.asarray(log.timesteps, float)[order], np.asarray(log.ep_return, float)[order]
    ok = np.isfinite(ts) & np.isfinite(ret)
    ts, ret = ts[ok], ret[ok]
    if len(ret) < _MIN_CURVE_POINTS:
        return None
    smooth = smooth_curve(ret)
    ts = ts[len(ts) - len(smooth) :]  # trailing window: each mean sits at its last point
    if ts[-1] <= ts[0]:
        return smooth
    return np.interp(np.linspace(ts[0], ts[-1], CURVE_POINTS), ts, smooth)


def _trend(c: np.ndarray, window: int = 9) -> np.ndarray:
    """Centered moving average with edge padding (the slow part of a curve)."""
    w = min(window, len(c) - (1 - len(c) % 2))
    if w < 3:
        return c.copy()
    pad = w // 2
    padded = np.pad(c, pad, mode="edge")
    return np.convolve(padded, np.ones(w) / w, mode="valid")


# ---------------------------------------------------------------- features: returns and episodes


def return_mean(b: EvidenceBundle, s: Subject) -> float:
    """Mean original (unpatched) episode return over deterministic evaluation episodes."""
    return _mean(_rets(b.deterministic))


def return_iqm(b: EvidenceBundle, s: Subject) -> float:
    """Interquartile mean of the original episode return (deterministic episodes)."""
    return iqm(_rets(b.deterministic))


def return_std(b: EvidenceBundle, s: Subject) -> float:
    """Standard deviation of the original episode return."""
    r = _rets(b.deterministic)
    return float(np.std(r)) if len(r) else _NAN


def return_spread(b: EvidenceBundle, s: Subject) -> float:
    """IQR of returns over |median| + 1 (relative spread)."""
    r = _rets(b.deterministic)
    r = r[np.isfinite(r)]
    if not len(r):
        return _NAN
    q1, med, q3 = np.percentile(r, [25, 50, 75])
    return float((q3 - q1) / (abs(med) + 1.0))


def success_rate(b: EvidenceBundle, s: Subject) -> float:
    """Fraction of deterministic episodes that met the task success definition."""
    return _mean([float(e.success) for e in b.deterministic])


def truncation_rate(b: EvidenceBundle, s: Subject) -> float:
    """Fraction of episodes truncated by the time limit (and not terminated)."""
    return _mean([float(e.truncated and not e.terminated) for e in b.deterministic])


def early_termination_rate(b: EvidenceBundle, s: Subject) -> float:
    """Fraction of episodes that terminated without success (falls, crashes)."""
    return _mean([float(e.terminated and not e.success) for e in b.deterministic])


def ep_len_mean(b: EvidenceBundle, s: Subject) -> float:
    """Mean episode length in steps."""
    return _mean([float(e.length) for e in b.deterministic])


def ep_len_frac(b: EvidenceBundle, s: Subject) -> float:
    """Mean episode length over the time limit (1.0 = always runs out the clock); NaN without a limit."""
    return ep_len_mean(b, s) / b.time_limit if b.time_limit else _NAN


# ---------------------------------------------------------------- features: actions and states


def _continuous(b: EvidenceBundle) -> bool:
    return b.traits.action_space == ActionSpaceType.continuous


def action_saturation(b: EvidenceBundle, s: Subject) -> float:
    """Fraction of continuous action components within 2% of their bounds (NaN for discrete actions)."""
    return _mean([e.stats.get("action_saturation") for e in b.deterministic]) if _continuous(b) else _NAN


def action_jerk(b: EvidenceBundle, s: Subject) -> float:
    """Mean |a_t - a_{t-1}| per component over the action range (0 smooth, 1 bang-bang; NaN for discrete)."""
    return _mean([e.stats.get("action_jerk") for e in b.deterministic]) if _continuous(b) else _NAN


def action_std(b: EvidenceBundle, s: Subject) -> float:
    """Mean within-episode per-component action std over the range (NaN for discrete)."""
    return _mean([e.stats.get("action_std") for e in b.deterministic]) if _continuous(b) else _NAN


def action_entropy(b: EvidenceBundle, s: Subject) -> float:
    """Normalized entropy of discrete action frequencies (0 = one action, 1 = uniform; NaN for continuous)."""
    counts = [e.action_counts for e in b.deterministic if e.action_counts is not None]
    if not counts:
        return _NAN
    total = np.sum(counts, axis=0).astype(float)
    if total.sum() <= 0 or len(total) < 2:
        return _NAN
    p = total[total > 0] / total.sum()
    return float(-(p * np.log(p)).sum() / math.log(len(total)))


def _bounds(b: EvidenceBundle, pts: np.ndarray, dim: int) -> tuple[float, float]:
    space = b.observation_space
    if isinstance(space, gym.spaces.Box) and space.shape and int(np.prod(space.shape)) > dim:
        lo, hi = float(space.low.reshape(-1)[dim]), float(space.high.reshape(-1)[dim])
        if math.isfinite(lo) and math.isfinite(hi) and hi > lo:
            return lo, hi
    return float(np.min(pts[:, dim])), float(np.max(pts[:, dim]))


def state_coverage(b: EvidenceBundle, s: Subject) -> float:
    """Fraction of occupied cells of a 20x20 grid over the first two observation dims.

    The grid spans the observation-space bounds where finite, else the observed range.
    """
    pts = [e.states2d for e in b.deterministic + b.stochastic if e.states2d is not None and len(e.states2d)]
    if not pts:
        return _NAN
    p = np.concatenate(pts).astype(float)
    p = p[np.isfinite(p).all(axis=1)]
    if not len(p):
        return _NAN
    idx = []
    for d in range(p.shape[1]):
        lo, hi = _bounds(b, p, d)
        scaled = (p[:, d] - lo) / (hi - lo) if hi > lo else np.zeros(len(p))
        idx.append(np.clip((scaled * COVERAGE_BINS).astype(int), 0, COVERAGE_BINS - 1))
    cells = set(zip(*idx))
    return len(cells) / float(COVERAGE_BINS ** p.shape[1])


def obs_abs_max(b: EvidenceBundle, s: Subject) -> float:
    """Largest absolute observation value seen (unnormalized scale)."""
    raw = [e.stats.get("obs_abs_max") for e in b.deterministic + b.stochastic]
    vals = [v for v in raw if v is not None and math.isfinite(v)]
    return float(max(vals)) if vals else _NAN


def obs_scale_ratio(b: EvidenceBundle, s: Subject) -> float:
    """log10 of the ratio of the largest to the smallest per-dimension observation std (dims that vary)."""
    stds = [e.obs_dim_std for e in b.deterministic if e.obs_dim_std is not None]
    if not stds:
        return _NAN
    sd = np.nanmean(np.asarray(stds, dtype=float), axis=0)
    sd = sd[np.isfinite(sd) & (sd > 1e-8)]
    return float(np.log10(sd.max() / sd.min())) if len(sd) >= 2 else _NAN


# ---------------------------------------------------------------- features: reward


def train_return_mean(b: EvidenceBundle, s: Subject) -> float:
    """Mean episode return under the reward the agent was trained on (setup wrappers applied)."""
    return _mean([e.train_ret for e in b.deterministic])


def reward_gap(b: EvidenceBundle, s: Subject) -> float:
    """Training-reward return minus original return, over |original return| + 1."""
    tr, orig = train_return_mean(b, s), return_mean(b, s)
    return (tr - orig) / (abs(orig) + 1.0) if math.isfinite(tr) and math.isfinite(orig) else _NAN


def reward_success_corr(b: EvidenceBundle, s: Subject) -> float:
    """Correlation between episode training-reward return and task success (all episodes; NaN if either is constant)."""
    eps = b.deterministic + b.stochastic
    return _corr(np.asarray([e.train_ret for e in eps]), np.asarray([float(e.success) for e in eps]))


def reward_excess_t(b: EvidenceBundle, s: Subject) -> float:
    """t-statistic of the per-episode excess of training-reward return over task return (det and stochastic episodes).

    0 when the training reward is the task reward; large and positive when the
    training reward consistently pays more (a farmable bonus); near 0 for zero-mean noise.
    """
    eps = b.deterministic + b.stochastic
    x = np.asarray([e.train_ret - e.ret for e in eps], dtype=float)
    x = x[np.isfinite(x)]
    if len(x) < 3:
        return _NAN
    sd = float(np.std(x, ddof=1))
    mean = float(np.mean(x))
    if sd < 1e-9 * (1.0 + abs(mean)):  # the same excess in every episode: as consistent as it gets
        return 0.0 if abs(mean) < 1e-9 else math.copysign(1e6, mean)
    return mean / (sd / math.sqrt(len(x)))


def train_task_gap(b: EvidenceBundle, s: Subject) -> float:
    """Final smoothed training-log return minus the evaluated task return (stochastic policy), over |task| + 1.

    Reads only the training logs a user hands over and Remedy's own
    evaluation, so it sees a reward that pays for something the task does not
    even when that reward lives in the user's code.
    """
    c = _curve(b.log)
    task = _mean(_rets(b.stochastic or b.deterministic))
    if c is None or not math.isfinite(task):
        return _NAN
    return float((c[-1] - task) / (abs(task) + 1.0))


def reward_per_step(b: EvidenceBundle, s: Subject) -> float:
    """Mean training reward per step."""
    steps = sum(e.length for e in b.deterministic)
    return float(sum(e.train_ret for e in b.deterministic) / steps) if steps else _NAN


def reward_informative_frac(b: EvidenceBundle, s: Subject) -> float:
    """Fraction of steps whose original reward differs from its most common per-step value."""
    return _mean([e.stats.get("reward_informative_frac") for e in b.deterministic])


def det_stoch_gap(b: EvidenceBundle, s: Subject) -> float:
    """Deterministic minus stochastic mean return, over the pooled return std (+1); NaN without stochastic runs."""
    if not b.stochastic:
        return _NAN
    d, st = _rets(b.deterministic), _rets(b.stochastic)
    return float((d.mean() - st.mean()) / (np.std(np.concatenate([d, st])) + 1.0))


# ---------------------------------------------------------------- features: learning curve and logs


def curve_plateau(b: EvidenceBundle, s: Subject) -> float:
    """1 if the smoothed learning curve flattened over its last third (relative slope < 5%), else 0."""
    slope = curve_final_slope(b, s)
    return _NAN if not math.isfinite(slope) else float(abs(slope) < PLATEAU_SLOPE)


def curve_final_slope(b: EvidenceBundle, s: Subject) -> float:
    """Rise of the smoothed learning curve over its last third, over the curve's range."""
    c = _curve(b.log)
    if c is None or len(c) < 3:
        return _NAN
    tail = c[-max(2, len(c) // 3) :]
    span = float(np.max(c) - np.min(c))
    return float((tail[-1] - tail[0]) / span) if span > 1e-12 else 0.0


def curve_collapse(b: EvidenceBundle, s: Subject) -> float:
    """Drop from the best to the final smoothed training return, over max(|best|, |final|, 1)."""
    c = _curve(b.log)
    if c is None:
        return _NAN
    best, final = float(np.max(c)), float(c[-1])
    # |final| in the scale keeps a best near zero (e.g. a lucky early goal) from blowing the ratio up
    return float(max(0.0, best - final) / max(abs(best), abs(final), 1.0))


def curve_oscillation(b: EvidenceBundle, s: Subject) -> float:
    """Std of the smoothed learning curve around its slow trend, over max(mean |curve|, 1)."""
    c = _curve(b.log)
    if c is None or len(c) < 5:
        return _NAN
    return float(np.std(c - _trend(c)) / max(float(np.mean(np.abs(c))), 1.0))


def _scalar(b: EvidenceBundle, name: str) -> np.ndarray | None:
    if b.log is None:
        return None
    v = b.log.scalars.get(name)
    return v if v is not None and len(v) else None


def entropy_final(b: EvidenceBundle, s: Subject) -> float:
    """Final policy entropy from training logs (SB3 logs entropy_loss = -entropy); NaN without logs."""
    v = _scalar(b, "entropy_loss")
    return float(-v[-1]) if v is not None else _NAN


def entropy_drop(b: EvidenceBundle, s: Subject) -> float:
    """Fraction of the initial policy entropy lost by the end of training (from entropy_loss)."""
    v = _scalar(b, "entropy_loss")
    if v is None or len(v) < 2 or abs(v[0]) < 1e-8:
        return _NAN
    h0, hf = -float(v[0]), -float(v[-1])
    return float((h0 - hf) / abs(h0))


def approx_kl_max(b: EvidenceBundle, s: Subject) -> float:
    """Largest approx_kl in the training log (PPO), a sign of too-large updates."""
    v = _scalar(b, "approx_kl")
    return float(np.max(v)) if v is not None else _NAN


# ---------------------------------------------------------------- features: safety, numerics, meta


def constraint_violation_rate(b: EvidenceBundle, s: Subject) -> float:
    """Fraction of steps that broke a declared safety constraint; NaN when none is declared."""
    if not b.constraint_names:
        return _NAN
    steps = sum(e.length for e in b.deterministic)
    return float(sum(e.violations for e in b.deterministic) / steps) if steps else _NAN


def nan_detected(b: EvidenceBundle, s: Subject) -> float:
    """1 if any observation, action or reward was NaN/inf during rollouts (or the weights are), else 0."""
    return float(b.nonfinite_weights or any(e.nan for e in b.deterministic + b.stochastic))


def shifted_gap(b: EvidenceBundle, s: Subject) -> float:
    """Shifted-env return minus nominal, over the nominal magnitude; NaN here (verification measures it)."""
    return _NAN


def time_limit_ratio(b: EvidenceBundle, s: Subject) -> float:
    """The episode time limit used over the env's registered limit (below 1 = shortened); NaN if either is unknown."""
    registered = registered_time_limit(s.env_id)
    return float(b.time_limit / registered) if b.time_limit and registered else _NAN


def progress_max(b: EvidenceBundle, s: Subject) -> float:
    """Mean best progress toward the goal on the env's own measure (0 = start level, 1 = goal); NaN where the env has none."""
    return _mean([e.stats.get("progress_max") for e in b.deterministic])


def progress_final(b: EvidenceBundle, s: Subject) -> float:
    """Mean progress toward the goal at the last step, on the env's own measure; NaN where the env has none."""
    return _mean([e.stats.get("progress_final") for e in b.deterministic])


def train_steps(b: EvidenceBundle, s: Subject) -> float:
    """Training steps of the agent (from run.yaml), NaN when unknown."""
    return float(s.train_steps) if s.train_steps is not None else _NAN


FEATURE_FUNCS: dict[str, Callable[[EvidenceBundle, Subject], float]] = {
    f.__name__: f
    for f in (
        return_mean,
        return_iqm,
        return_std,
        success_rate,
        truncation_rate,
        early_termination_rate,
        ep_len_mean,
        ep_len_frac,
        action_saturation,
        action_jerk,
        action_std,
        action_entropy,
        state_coverage,
        obs_abs_max,
        obs_scale_ratio,
        reward_success_corr,
        reward_per_step,
        det_stoch_gap,
        return_spread,
        curve_plateau,
        curve_collapse,
        curve_oscillation,
        entropy_final,
        entropy_drop,
        approx_kl_max,
        constraint_violation_rate,
        nan_detected,
        shifted_gap,
        train_return_mean,
        reward_gap,
        reward_informative_frac,
        curve_final_slope,
        train_steps,
        time_limit_ratio,
        progress_max,
        progress_final,
        reward_excess_t,
        train_task_gap,
    )
}


def component_features(b: EvidenceBundle) -> Features:
    """Per-reward-component statistics: per-episode sum's mean, std, and correlation with success."""
    eps = b.deterministic + b.stochastic
    names = sorted({k for e in eps for k in e.reward_components})
    out: Features = {}
    success = np.asarray([float(e.success) for e in eps])
    for name in names:
        sums = np.asarray([float(np.sum(e.reward_components.get(name, 0.0))) for e in eps])
        key = f"{COMPONENT_PREFIX}{name}"
        out[f"{key}.mean"] = float(np.mean(sums))
        out[f"{key}.std"] = float(np.std(sums))
        out[f"{key}.success_corr"] = _corr(sums, success)
    return out


def compute_features(bundle: EvidenceBundle, subject: Subject) -> Features:
    """Every vocab feature (NaN where not measurable) plus per-component statistics."""
    # a vocab name another module added without a function here is simply not measured (NaN)
    feats = {name: float(FEATURE_FUNCS[name](bundle, subject)) if name in FEATURE_FUNCS else _NAN for name in FEATURES}
    feats.update(component_features(bundle))
    return feats
