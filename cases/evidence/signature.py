"""Failure signatures: numeric features, symptom tags and a retrieval summary from evidence.

Features are computed in :mod:`remedy.cases.evidence.features` (one function per
vocabulary name); a feature that cannot be measured is NaN there and left out
of the stored :class:`Signature` (its JSON cannot hold NaN). Symptom tags come
from features through the named threshold constants below, one rule per
vocabulary tag; the summary sentence is written for embedding-based retrieval.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ValidationError
from ..model import RewardDensity, Signature, Subject
from ..vocab import (
    COMPONENT_PREFIX,
    HOVER_TRUNCATION_RATE,
    LOW_FINAL_HEIGHT,
    LOW_PROGRESS,
    REWARD_EXCESS_MIN_GAP,
    REWARD_EXCESS_T,
    SYMPTOMS,
    TIMEOUT_RATE,
    TRAIN_TASK_GAP_HACKING,
)
from .envs import is_continuing
from .features import FEATURE_FUNCS, PLATEAU_SLOPE, Features, compute_features, iqm, smooth_curve
from .rollouts import EvidenceBundle, collect_evidence
from .rundir import RunDir

__all__ = [
    "compute_signature",
    "signature_from_features",
    "signature_of_run",
    "RunSignature",
    "compute_features",
    "derive_symptoms",
    "summarize",
    "FEATURE_FUNCS",
    "SYMPTOM_RULES",
    "iqm",
    "smooth_curve",
    "Features",
    # thresholds
    "TIMEOUT_RATE",
    "HOVER_TRUNCATION_RATE",
    "LOW_PROGRESS",
    "LOW_FINAL_HEIGHT",
    "REWARD_EXCESS_T",
    "REWARD_EXCESS_MIN_GAP",
    "TRAIN_TASK_GAP_HACKING",
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
    "SHORT_LIMIT_RATIO",
]

# ---------------------------------------------------------------- thresholds (named, so rules can cite them)
HOVER_MAX_SUCCESS = 0.1  #: timeouts with success at most this, in a dense-reward env, is hovering
LOW_SUCCESS_RATE = 0.5  #: success below this is low
JERK_THRESHOLD = 0.25  #: action jerk at or above this is jerky (uniform random actions give ~0.33)
SATURATION_THRESHOLD = 0.5  #: half the action components at their bounds
ENTROPY_COLLAPSE_DROP = 0.8  #: fraction of initial policy entropy lost
COLLAPSE_DROP = 0.5  #: drop from best to final of at least half the best's magnitude
OSCILLATION_LEVEL = 0.3  #: detrended std over mean magnitude
KL_UNSTABLE = 0.2  #: PPO approx_kl above this means too-large updates
REWARD_GAP_HACKING = 0.25  #: training-reward return exceeds the original by a quarter of its magnitude
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
SHORT_LIMIT_RATIO = 0.5  #: time limit at most half the registered one

_NAN = math.nan


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


def _reward_diverges(f: Features) -> bool:
    """The reward the agent trained on pays for something the task does not (no access to the reward's code needed).

    Any of: the training-reward return is far above the task return
    (``reward_gap``); it is above it consistently across episodes
    (``reward_excess_t``, with a small floor on the size); the training logs end
    far above the evaluated task return (``train_task_gap``); training reward
    anti-correlates with success.
    """
    return (
        _ge(f, "reward_gap", REWARD_GAP_HACKING)
        or (_ge(f, "reward_excess_t", REWARD_EXCESS_T) and _ge(f, "reward_gap", REWARD_EXCESS_MIN_GAP))
        or _ge(f, "train_task_gap", TRAIN_TASK_GAP_HACKING)
        or _le(f, "reward_success_corr", REWARD_CORR_HACKING)
    )


SYMPTOM_RULES: dict[str, Callable[[Features, Subject], bool]] = {
    # a continuing env (Pendulum) always runs to the limit: that is its nature, not a symptom
    "timeouts": lambda f, s: _ge(f, "truncation_rate", TIMEOUT_RATE) and not is_continuing(s.env_id),
    "hovering": lambda f, s: (
        _ge(f, "truncation_rate", HOVER_TRUNCATION_RATE)
        and _le(f, "success_rate", HOVER_MAX_SUCCESS)
        and s.traits.reward_density == RewardDensity.dense
        and not is_continuing(s.env_id)
    ),
    "never_succeeds": lambda f, s: _le(f, "success_rate", 0.0),
    "low_success": lambda f, s: _lt(f, "success_rate", LOW_SUCCESS_RATE),
    "jerky_actions": lambda f, s: _ge(f, "action_jerk", JERK_THRESHOLD),
    "saturated_actions": lambda f, s: _ge(f, "action_saturation", SATURATION_THRESHOLD),
    "collapsed_entropy": lambda f, s: _ge(f, "entropy_drop", ENTROPY_COLLAPSE_DROP),
    "premature_convergence": lambda f, s: _ge(f, "curve_plateau", 1.0) and _lt(f, "success_rate", LOW_SUCCESS_RATE),
    "unstable_learning": lambda f, s: (
        _ge(f, "curve_collapse", COLLAPSE_DROP)
        or _ge(f, "curve_oscillation", OSCILLATION_LEVEL)
        or _ge(f, "approx_kl_max", KL_UNSTABLE)
    ),
    "reward_hacking_suspected": lambda f, s: _lt(f, "success_rate", LOW_SUCCESS_RATE) and _reward_diverges(f),
    "constraint_violations": lambda f, s: _ge(f, "constraint_violation_rate", VIOLATION_RATE),
    "early_termination": lambda f, s: _ge(f, "early_termination_rate", EARLY_TERMINATION_RATE),
    "low_coverage": lambda f, s: _lt(f, "state_coverage", LOW_COVERAGE),
    "unscaled_observations": lambda f, s: _ge(f, "obs_abs_max", UNSCALED_OBS_ABS),
    "high_variance": lambda f, s: _ge(f, "return_spread", HIGH_SPREAD),
    "short_episodes": lambda f, s: (
        _lt(f, "ep_len_frac", SHORT_EPISODE_FRAC) and _lt(f, "success_rate", LOW_SUCCESS_RATE)
    ),
    "sparse_signal": lambda f, s: (
        _lt(f, "reward_informative_frac", SPARSE_INFORMATIVE_FRAC)
        and (s.traits.reward_density == RewardDensity.sparse or _le(f, "reward_per_step", 0.0))
    ),
    "poor_generalization": lambda f, s: _le(f, "shifted_gap", SHIFT_GAP),
    "undertrained": lambda f, s: _ge(f, "curve_final_slope", UNDERTRAINED_SLOPE) and _lt(f, "success_rate", 0.8),
    "numerical_instability": lambda f, s: _ge(f, "nan_detected", 1.0),
    "short_time_limit": lambda f, s: _le(f, "time_limit_ratio", SHORT_LIMIT_RATIO) and _ge(f, "truncation_rate", 0.5),
    "low_progress": lambda f, s: _lt(f, "progress_max", LOW_PROGRESS) and _lt(f, "success_rate", LOW_SUCCESS_RATE),
    "low_final_height": lambda f, s: (
        _lt(f, "progress_final", LOW_FINAL_HEIGHT) and _lt(f, "success_rate", LOW_SUCCESS_RATE)
    ),
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
    "reward_hacking_suspected": "the training reward pays more than the task reward while success is low: reward hacking suspected",
    "constraint_violations": "breaks safety constraints on {constraint_violation_rate:.1%} of steps",
    "early_termination": "episodes end early by failure ({early_termination_rate:.0%})",
    "low_coverage": "visits little of the state space (coverage {state_coverage:.2f})",
    "unscaled_observations": "observations unscaled (max |obs| {obs_abs_max:.3g})",
    "high_variance": "returns vary widely (spread {return_spread:.2f})",
    "sparse_signal": "reward is constant on most steps (sparse signal)",
    "undertrained": "returns still rising at the end of training",
    "numerical_instability": "NaN or inf appeared in the rollouts",
    "short_time_limit": "the time limit is cut to {time_limit_ratio:.0%} of the registered one",
    "low_progress": "never gets far toward the goal (best progress {progress_max:.0%})",
    "low_final_height": "ends far below the goal level (final progress {progress_final:.0%})",
}


def _steps_text(n: int | None) -> str:
    if n is None:
        return "unknown steps"
    return f"{n / 1e6:.3g}M steps" if n >= 1_000_000 else f"{n / 1e3:.3g}k steps" if n >= 1000 else f"{n} steps"


def _unstable_phrase(f: Features) -> str:
    bits = []
    if _ge(f, "curve_collapse", COLLAPSE_DROP):
        bits.append(f"fell {f['curve_collapse']:.0%} from its best")
    if _ge(f, "curve_oscillation", OSCILLATION_LEVEL):
        bits.append(f"oscillation {f['curve_oscillation']:.2f}")
    if _ge(f, "approx_kl_max", KL_UNSTABLE):
        bits.append(f"approx_kl up to {f['approx_kl_max']:.2g}")
    return "learning curve unstable (" + ", ".join(bits) + ")"


def _fmt(template: str, f: Features) -> str:
    try:
        return template.format(**f)
    except (KeyError, ValueError, IndexError):
        return template.split(" (")[0]


def summarize(
    features: Features, symptoms: list[str], subject: Subject, n_episodes: int, time_limit: int | None
) -> str:
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
    words = [
        _unstable_phrase(f) if t == "unstable_learning" else _fmt(_PHRASES[t], f)
        for t in symptoms
        if t in _PHRASES or t == "unstable_learning"
    ]
    text = parts[0] + ": " + ", ".join(nums)
    if words:
        text += "; " + "; ".join(words)
    comps = [
        k[len(COMPONENT_PREFIX) : -len(".mean")] for k in f if k.startswith(COMPONENT_PREFIX) and k.endswith(".mean")
    ]
    if comps:
        text += "; reward components: " + ", ".join(f"{c} {f[COMPONENT_PREFIX + c + '.mean']:.3g}" for c in comps[:5])
    return text + "."


def compute_signature(bundle: EvidenceBundle, subject: Subject) -> Signature:
    """Features (finite ones only; NaN = not measurable = absent), symptom tags and summary of one agent."""
    return signature_from_features(compute_features(bundle, subject), bundle, subject)


def signature_from_features(feats: Features, bundle: EvidenceBundle, subject: Subject) -> Signature:
    """Symptoms and summary for already computed features; NaN features are left out."""
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


def signature_of_run(
    path: str | Path, *, n_episodes: int = 20, seed: int = 0, stochastic: bool = True, trust: bool = False
) -> RunSignature:
    """Load a run directory, collect evidence and compute its failure signature.

    ``trust``: the user's own files (``--trust-checkpoint``), loaded as SB3 does; see :meth:`RunDir.load`.
    """
    if n_episodes < 1:
        raise ValidationError(f"need at least 1 episode, got {n_episodes}")
    run = RunDir.load(path, trust=trust)
    subject = run.subject()
    bundle = collect_evidence(run, n_episodes=n_episodes, seed=seed, stochastic=stochastic)
    feats = compute_features(bundle, subject)
    return RunSignature(run, subject, bundle, feats, signature_from_features(feats, bundle, subject))
