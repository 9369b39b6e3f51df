"""The shared vocabulary of failure signatures: feature names and symptom tags.

Each name is defined once here with what it measures; ``cases.signature``
computes them, the example cases use them, rules and diagnosers match on them.
Add names freely; never rename one (stored cases and mined rules refer to them).
"""

from __future__ import annotations

__all__ = [
    "FEATURES",
    "SYMPTOMS",
    "COMPONENT_PREFIX",
    "TIMEOUT_RATE",
    "HOVER_TRUNCATION_RATE",
    "LOW_PROGRESS",
    "LOW_FINAL_HEIGHT",
    "REWARD_EXCESS_T",
    "REWARD_EXCESS_MIN_GAP",
    "TRAIN_TASK_GAP_HACKING",
]

#: per-reward-component features are named ``component.<name>.<mean|std|success_corr>``.
COMPONENT_PREFIX = "component."

#: feature name -> what it measures. Values are floats; NaN where not measurable.
FEATURES: dict[str, str] = {
    "return_mean": "mean original (unpatched) episode return over evaluation episodes",
    "return_iqm": "interquartile mean of the original episode return",
    "return_std": "standard deviation of the original episode return",
    "success_rate": "fraction of evaluation episodes that met the task success definition",
    "truncation_rate": "fraction of episodes truncated by the time limit",
    "early_termination_rate": "fraction of episodes that terminated without success",
    "ep_len_mean": "mean episode length in steps",
    "ep_len_frac": "mean episode length divided by the time limit (1.0 = always runs out the clock)",
    "action_saturation": "fraction of continuous action components within 2% of their bounds",
    "action_jerk": "mean |a_t - a_{t-1}| per component, divided by the action range (0 = smooth, 1 = bang-bang)",
    "action_std": "mean per-component standard deviation of actions within an episode, divided by the range",
    "action_entropy": "normalized entropy of discrete action frequencies (0 = one action, 1 = uniform)",
    "state_coverage": "fraction of occupied cells on a coarse grid over the first two observation dims",
    "obs_abs_max": "largest absolute observation value seen (unnormalized scale)",
    "obs_scale_ratio": "ratio of the largest to the smallest per-dimension observation std (log10)",
    "reward_success_corr": "correlation between episode return (training reward) and task success",
    "reward_per_step": "mean training reward per step",
    "det_stoch_gap": "deterministic minus stochastic policy mean return, over the return spread",
    "return_spread": "IQR of returns over |median| + 1 (relative spread)",
    "curve_plateau": "1 if the learning curve flattened over its last third (relative slope < 5%), else 0",
    "curve_collapse": "drop from the best to the final smoothed training return, over max(|best|, |final|, 1)",
    "curve_oscillation": "std of the detrended smoothed learning curve over its mean magnitude",
    "entropy_final": "final policy entropy from training logs (NaN without logs)",
    "entropy_drop": "fraction of the initial policy entropy lost by the end of training",
    "approx_kl_max": "largest approx_kl in the training log (PPO), a sign of too-large updates",
    "constraint_violation_rate": "fraction of steps that broke a declared safety constraint",
    "nan_detected": "1 if any observation, action or reward was NaN/inf during rollouts",
    "shifted_gap": "return on shifted-env variants minus the nominal return, over the nominal magnitude",
    "train_return_mean": "mean episode return under the reward the agent was trained on (setup wrappers applied)",
    "reward_gap": "training-reward return minus original return, over |original return| + 1 (the setup pays for something else)",
    "reward_informative_frac": "fraction of steps whose original reward differs from its most common per-step value",
    "curve_final_slope": "rise of the smoothed learning curve over its last third, over the curve's range (still rising > 0)",
    "train_steps": "training steps of the agent (from run.yaml), NaN when unknown",
    "time_limit_ratio": "the episode time limit used over the env's registered limit (below 1 = shortened)",
    "progress_max": "mean best progress toward the goal on the env's own measure (MountainCar position, Acrobot tip height, LunarLander altitude, Pendulum pole height): 0 = start level, 1 = goal level",
    "progress_final": "mean progress toward the goal at the episode's last step, on the env's own measure (a low final height)",
    "reward_excess_t": "t-statistic of (training-reward return minus task return) over evaluation episodes: large = the training reward consistently pays more than the task",
    "train_task_gap": "final smoothed training-log return minus the evaluated task return, over |task return| + 1 (needs only the user's training logs)",
}

#: symptom tag -> what it means. Tags are derived from features by named thresholds.
SYMPTOMS: dict[str, str] = {
    "hovering": "episodes run out the clock without reaching a terminal goal (lander hovers)",
    "timeouts": "most episodes are truncated by the time limit",
    "never_succeeds": "no evaluation episode met the task success definition",
    "low_success": "the task success rate is below one half",
    "jerky_actions": "actions change abruptly from step to step (bang-bang control)",
    "saturated_actions": "continuous actions sit at their bounds much of the time",
    "collapsed_entropy": "the policy became nearly deterministic early (entropy collapse)",
    "premature_convergence": "learning plateaued early at a poor return",
    "unstable_learning": "the learning curve oscillates or collapses",
    "reward_hacking_suspected": "training reward is high while task success is low or uncorrelated",
    "constraint_violations": "the agent breaks declared safety constraints",
    "early_termination": "episodes end early by failure (falls, crashes)",
    "low_coverage": "the agent visits a small part of the state space",
    "unscaled_observations": "observations are orders of magnitude off unit scale",
    "high_variance": "returns vary widely between episodes",
    "short_episodes": "episodes are much shorter than the time limit without success",
    "sparse_signal": "reward is zero or constant on most steps",
    "poor_generalization": "performance drops on shifted-env variants",
    "undertrained": "few training steps for the task and returns still rising",
    "numerical_instability": "NaN or inf appeared in observations, actions or rewards",
    "short_time_limit": "the episode time limit is well below the env's registered one and episodes hit it",
    "low_progress": "the agent never gets far toward the goal on the env's own progress measure",
    "low_final_height": "episodes end far from the goal level on the env's own progress measure (low final height)",
}

# ---------------------------------------------------------------- thresholds of the tags above
# (older thresholds live next to their rules in cases.evidence.signature; new ones are defined here)

#: truncation rate at or above which episodes "time out": most episodes end at the time limit.
TIMEOUT_RATE = 0.5
#: truncation rate at or above which a dense-reward agent without success "hovers" (nearly every episode).
HOVER_TRUNCATION_RATE = 0.8
#: best progress below this (under halfway from the start level to the goal level) is low progress.
LOW_PROGRESS = 0.5
#: final progress below this (the episode ends under halfway to the goal level) is a low final height.
LOW_FINAL_HEIGHT = 0.5
#: a t-statistic of the training-minus-task return excess at or above this is consistent, not noise.
REWARD_EXCESS_T = 3.0
#: ... and the excess must still be at least this fraction of |task return| + 1 to count (not a rounding).
REWARD_EXCESS_MIN_GAP = 0.05
#: the training logs' final return this far above the evaluated task return (over |task return| + 1)
#: says the training reward pays for something the task does not.
TRAIN_TASK_GAP_HACKING = 0.5
