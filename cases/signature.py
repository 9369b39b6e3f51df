"""Failure signatures: numeric features, symptom tags and a retrieval summary from evidence.

Each feature of :data:`remedy.cases.vocab.FEATURES` is computed by one small
function below, whose docstring says what it measures; a feature that cannot be
measured (no logs, discrete actions for a continuous measure) is NaN in
:func:`compute_features` and left out of the stored :class:`Signature` (its JSON
cannot hold NaN). Symptom tags come from features through the named threshold
constants; the summary sentence is written for embedding-based retrieval.
Per-reward-component statistics (Eureka-style reward reflection) appear as
``component.<name>.mean|std|success_corr`` when the env exposes components.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from .errors import ValidationError
from .evidence import EpisodeRecord, EvidenceBundle, TrainingLog, collect_evidence
from .model import ActionSpaceType, RewardDensity, Signature, Subject
from .vocab import COMPONENT_PREFIX, FEATURES, SYMPTOMS

__all__ = [
    "compute_signature",
    "signature_of_run",
    "RunSignature",
    "compute_features",
    "derive_symptoms",
    "summarize",
    "FEATURE_FUNCS",
    "SYMPTOMSYMPTOM_RULES",
    "iqm",
    "smooth_curve",
    # thresholds
    "TIMEOUT_RATE",
    "HOVER_MAX_SUCCESS",
    "LOW_SUCCESS_RATE",
    "JERK_THRESHOLD",
    "SATURATION_THRESHOLD",
    "ENTROPY_COLLAPSE_DROP",
    "PLATEAU_SLOPE",
    "COLLAPSE_DROP",
    "OSCILLATION_LEVEL",
    "KL_UNSTABLE",
    "REWARD_GAP_HACKING",
    "REWARD_CORR_HACKING",
    "VIOLATION_RATE",
    "EARLY_TERMINATION_RATE",
    "LOW_COVERAGE",
    "UNSCALED_OBS_ABS",
    "HIGH_SPREAD",
    "SHORT_EPISODE_FRAC",
    "SPARSE_INFORMATIVE_FRAC",
    "SHIFT_GAP",
    "UNDERTRAINED_SLOPE",
]

# ---------------------------------------------------------------- thresholds (named, so rules can cite them)
TIMEOUT_RATE = 0.8  #: truncation rate at or above which episodes "time out"
HOVER_MAX_SUCCESS = 0.1  #: timeouts with success at most this, in a dense-reward env, is hovering
LOW_SUCCESS_RATE = 0.5  #: success below this is low
JERK_THRESHOLD = 0.25  #: action jerk at or above this is jerky (uniform random actions give ~0.33)
SATURATION_THRESHOLD = 0.5  #: half the action components at their bounds
ENTROPY_COLLAPSE_DROP = 0.8  #: fraction of initial policy entropy lost
PLATEAU_SLOPE = 0.05  #: |relative slope| of the last third below this is a plateau
COLLAPSE_DROP = 0.5  #: drop from best to final of at least half the best's magnitude
OSCILLATION_LEVEL = 0.3  #: detrended std over mean magnitude
KL_UNSTABLE = 0.2  #: PPO approx_kl above this means too-large updates
REWARD_GAP_HACKING = 0.5  #: training-reward return exceeds the original by half its magnitude
REWARD_CORR_HACKING = -0.2  #: training return anti-correlated with success
VIOLATION_RATE = 0.01  #: more than 1% of steps break a constraint
EARLY_TERMINATION_RATE = 0.5  #: half the episodes end early without success
LOW_COVERAGE = 0.05  #: under 5% of the coarse state grid visited
UNSCALED_OBS_ABS = 100.0  #: an observation this large is far off unit scale
HIGH_SPREAD = 1.0  #: IQR of returns at least |median| + 1
SHORT_EPISODE_FRAC = 0.2  #: episodes under a fifth of the time limit
SPARSE_INFORMATIVE_FRAC = 0.1  #: reward informative on under 10% of steps
SHIFT_GAP = -0.3  #: shifted-env return 30% below nominal
UNDERTRAINED_SLOPE = 0.15  #: learning curve still rising by 15% of its range over the last third

COVERAGE_BINS = 20
_MIN_CURVE_POINTS = 10  # fewer logged points are noise, not a curve

Features = dict[str, float]
_NAN = math.nan


# ---------------------------------------------------------------- helpers


def iqm(x: np.ndarray) -> float:
    """Interquartile mean: mean of the middle 50% (rliable's IQM); NaN for empty input."""
    x = np.sort(np.asarray(x, dtype=float)[np.isfinite(np.asarray(x, dtype=float))])
    if not len(x):
        return _NAN
    lo, hi = int(math.floor(0.25 * len(x))), int(math.ceil(0.75 * len(x)))
    mid = x[lo:hi] if hi > lo else x
    return float(mid.mean())


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
    if log is None or log.ep_return.size < _MIN_CURVE_POINTS:
        return None
    return smooth_curve(log.ep_return)


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
    vals = [e.stats.get("obs_abs_max") for e in b.deterministic + b.stochastic]
    vals = [v for v in vals if v is not None and math.isfinite(v)]
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
    tail = c[-max(2, len(c) // 3):]
    span = float(np.max(c) - np.min(c))
    return float((tail[-1] - tail[0]) / span) if span > 1e-12 else 0.0


def curve_collapse(b: EvidenceBundle, s: Subject) -> float:
    """Drop from the best to the final smoothed training return, over max(|best|, 1)."""
    c = _curve(b.log)
    if c is None:
        return _NAN
    best = float(np.max(c))
    return float(max(0.0, best - c[-1]) / max(abs(best), 1.0))


def curve_oscillation(b: EvidenceBundle, s: Subject) -> float:
    """Std of the linearly detrended smoothed learning curve over max(mean |curve|, 1)."""
    c = _curve(b.log)
    if c is None or len(c) < 3:
        return _NAN
    x = np.arange(len(c))
    resid = c - np.polyval(np.polyfit(x, c, 1), x)
    return float(np.std(resid) / max(float(np.mean(np.abs(c))), 1.0))


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
    """1 if any observation, action or reward was NaN/inf during rollouts, else 0."""
    return float(any(e.nan for e in b.deterministic + b.stochastic))


def shifted_gap(b: EvidenceBundle, s: Subject) -> float:
    """Shifted-env return minus nominal, over the nominal magnitude; NaN here (verification measures it)."""
    return _NAN


def train_steps(b: EvidenceBundle, s: Subject) -> float:
    """Training steps of the agent (from run.yaml), NaN when unknown."""
    return float(s.train_steps) if s.train_steps is not None else _NAN


FEATURE_FUNCS: dict[str, Callable[[EvidenceBundle, Subject], float]] = {
    f.__name__: f
    for f in (
        return_mean, return_iqm, return_std, success_rate, truncation_rate, early_termination_rate, ep_len_mean,
        ep_len_frac, action_saturation, action_jerk, action_std, action_entropy, state_coverage, obs_abs_max,
        obs_scale_ratio, reward_success_corr, reward_per_step, det_stoch_gap, return_spread, curve_plateau,
        curve_collapse, curve_oscillation, entropy_final, entropy_drop, approx_kl_max, constraint_violation_rate,
        nan_detected, shifted_gap, train_return_mean, reward_gap, reward_informative_frac, curve_final_slope,
        train_steps,
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


# ---------------------------------------------------------------- symptoms


def _ge(f: Features, k: str, t: float) -> bool:
    v = f.get(k, _NAN)
    return math.isfinite(v) and v >= t


def _le(f: Features, k: str, t: float) -> bool:
    v = f.get(k, _NAN)
    return math.isfinite(v) and v <= t


def _lt(f: Features, k: str, t: float) -> bool:
    v = f.get(k, _NAN)
    return math.isfinite(v) and v < t


SYMPTOM_RULES: dict[str, Callable[[Features, Subject], bool]] = {
    "timeouts": lambda f, s: _ge(f, "truncation_rate", TIMEOUT_RATE),
    "hovering": lambda f, s: _ge(f, "truncation_rate", TIMEOUT_RATE) and _le(f, "success_rate", HOVER_MAX_SUCCESS)
    and s.traits.reward_density == RewardDensity.dense,
    "never_succeeds": lambda f, s: _le(f, "success_rate", 0.0),
    "low_success": lambda f, s: _lt(f, "success_rate", LOW_SUCCESS_RATE),
    "jerky_actions": lambda f, s: _ge(f, "action_jerk", JERK_THRESHOLD),
    "saturated_actions": lambda f, s: _ge(f, "action_saturation", SATURATION_THRESHOLD),
    "collapsed_entropy": lambda f, s: _ge(f, "entropy_drop", ENTROPY_COLLAPSE_DROP),
    "premature_convergence": lambda f, s: _ge(f, "curve_plateau", 1.0) and _lt(f, "success_rate", LOW_SUCCESS_RATE),
    "unstable_learning": lambda f, s: _ge(f, "curve_collapse", COLLAPSE_DROP) or _ge(f, "curve_oscillation", OSCILLATION_LEVEL)
    or _ge(f, "approx_kl_max", KL_UNSTABLE),
    "reward_hacking_suspected": lambda f, s: _lt(f, "success_rate", LOW_SUCCESS_RATE)
    and (_ge(f, "reward_gap", REWARD_GAP_HACKING) or _le(f, "reward_success_corr", REWARD_CORR_HACKING)),
    "constraint_violations": lambda f, s: _ge(f, "constraint_violation_rate", VIOLATION_RATE),
    "early_termination": lambda f, s: _ge(f, "early_termination_rate", EARLY_TERMINATION_RATE),
    "low_coverage": lambda f, s: _lt(f, "state_coverage", LOW_COVERAGE),
    "unscaled_observations": lambda f, s: _ge(f, "obs_abs_max", UNSCALED_OBS_ABS),
    "high_variance": lambda f, s: _ge(f, "return_spread", HIGH_SPREAD),
    "short_episodes": lambda f, s: _lt(f, "ep_len_frac", SHORT_EPISODE_FRAC) and _lt(f, "success_rate", LOW_SUCCESS_RATE),
    "sparse_signal": lambda f, s: _lt(f, "reward_informative_frac", SPARSE_INFORMATIVE_FRAC)
    and (s.traits.reward_density == RewardDensity.sparse or _le(f, "reward_per_step", 0.0)),
    "poor_generalization": lambda f, s: _le(f, "shifted_gap", SHIFT_GAP),
    "undertrained": lambda f, s: _ge(f, "curve_final_slope", UNDERTRAINED_SLOPE) and _lt(f, "success_rate", 0.8),
    "numerical_instability": lambda f, s: _ge(f, "nan_detected", 1.0),
}


def derive_symptoms(features: Features, subject: Subject) -> list[str]:
    """Symptom tags whose threshold rule holds, in vocabulary order."""
    return [tag for tag in SYMPTOMS if tag in SYMPTOM_RULES and SYMPTOM_RULES[tag](features, subject)]


# ---------------------------------------------------------------- summary


_PHRASES = {
    "hovering": "it hovers: episodes run out the clock without reaching the goal",
    "jerky_actions": "actions jerky (jerk {action_jerk:.2f})",
    "saturated_actions": "actions saturated at their bounds ({action_saturation:.0%})",
    "collapsed_entropy": "policy entropy collapsed ({entropy_drop:.0%} lost)",
    "premature_convergence": "learning plateaued early at a poor return",
    "unstable_learning": "learning curve unstable (collapse {curve_collapse:.2f}, oscillation {curve_oscillation:.2f})",
    "reward_hacking_suspected": "training reward far above the task reward (gap {reward_gap:.2f}) while success is low: reward hacking suspected",
    "constraint_violations": "breaks safety constraints on {constraint_violation_rate:.1%} of steps",
    "early_termination": "episodes end early by failure ({early_termination_rate:.0%})",
    "low_coverage": "visits little of the state space (coverage {state_coverage:.2f})",
    "unscaled_observations": "observations unscaled (max |obs| {obs_abs_max:.3g})",
    "high_variance": "returns vary widely (spread {return_spread:.2f})",
    "sparse_signal": "reward is constant on most steps (sparse signal)",
    "undertrained": "returns still rising at the end of training",
    "numerical_instability": "NaN or inf appeared in the rollouts",
}


def _steps_text(n: int | None) -> str:
    if n is None:
        return "unknown steps"
    return f"{n / 1e6:.3g}M steps" if n >= 1_000_000 else f"{n / 1e3:.3g}k steps" if n >= 1000 else f"{n} steps"


def _fmt(template: str, f: Features) -> str:
    try:
        return template.format(**f)
    except (KeyError, ValueError, IndexError):
        return template.split(" (")[0]


def summarize(features: Features, symptoms: list[str], subject: Subject, n_episodes: int, time_limit: int | None) -> str:
    """One retrieval-friendly paragraph: env and action type, algorithm, key numbers, symptoms in words."""
    f = features
    kind = subject.traits.action_space.value.capitalize()
    parts = [f"{kind} {subject.env_id} agent ({subject.algo}, {_steps_text(subject.train_steps)})"]
    nums = []
    if math.isfinite(f.get("truncation_rate", _NAN)) and f["truncation_rate"] > 0 and time_limit:
        nums.append(f"{f['truncation_rate']:.0%} of {n_episodes} episodes truncated at the {time_limit}-step limit")
    elif math.isfinite(f.get("ep_len_mean", _NAN)):
        nums.append(f"{n_episodes} episodes of mean length {f['ep_len_mean']:.0f}")
    nums.append(f"{f.get('success_rate', 0.0):.0%} success ({subject.success or 'success undefined'})")
    nums.append(f"return IQM {f.get('return_iqm', _NAN):.4g}")
    if abs(f.get("reward_gap", 0.0) or 0.0) > 0.05 and math.isfinite(f.get("train_return_mean", _NAN)):
        nums.append(f"training-reward return {f['train_return_mean']:.4g}")
    words = [_fmt(_PHRASES[t], f) for t in symptoms if t in _PHRASES]
    text = parts[0] + ": " + ", ".join(nums)
    if words:
        text += "; " + "; ".join(words)
    comps = [k[len(COMPONENT_PREFIX):-len(".mean")] for k in f if k.startswith(COMPONENT_PREFIX) and k.endswith(".mean")]
    if comps:
        text += "; reward components: " + ", ".join(f"{c} {f[COMPONENT_PREFIX + c + '.mean']:.3g}" for c in comps[:5])
    return text + "."


def compute_signature(bundle: EvidenceBundle, subject: Subject) -> Signature:
    """Features (finite ones only; NaN = not measurable = absent), symptom tags and summary of one agent."""
    feats = compute_features(bundle, subject)
    symptoms = derive_symptoms(feats, subject)
    summary = summarize(feats, symptoms, subject, len(bundle.deterministic), bundle.time_limit)
    return Signature(features={k: v for k, v in feats.items() if math.isfinite(v)}, symptoms=symptoms, summary=summary)


@dataclass(frozen=True)
class RunSignature:
    """A run's subject, evidence and signature together (what ``remedy signature`` shows)."""

    run: Any
    subject: Subject
    bundle: EvidenceBundle
    features: Features  # every feature, NaN where not measurable
    signature: Signature


def signature_of_run(path: str | Path, *, n_episodes: int = 20, seed: int = 0, stochastic: bool = True) -> RunSignature:
    """Load a run directory, collect evidence and compute its failure signature."""
    from .rundir import RunDir

    if n_episodes < 1:
        raise ValidationError(f"need at least 1 episode, got {n_episodes}")
    run = RunDir.load(path)
    subject = run.subject()
    bundle = collect_evidence(run, n_episodes=n_episodes, seed=seed, stochastic=stochastic)
    feats = compute_features(bundle, subject)
    symptoms = derive_symptoms(feats, subject)
    summary = summarize(feats, symptoms, subject, len(bundle.deterministic), bundle.time_limit)
    sig = Signature(features={k: v for k, v in feats.items() if math.isfinite(v)}, symptoms=symptoms, summary=summary)
    return RunSignature(run, subject, bundle, feats, sig)
