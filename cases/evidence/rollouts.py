"""Evidence: what the agent does (seeded rollouts) and how it learned (training logs).

Rollouts run the agent in its TRAINING view of the env (setup wrappers on) and
record both returns: ``ret`` under the env's original reward (read from
``info["original_reward"]`` that reward wrappers leave) and ``train_ret`` under
the reward the agent was trained on. Success is judged on the original reward
only. Episodes run in a small batch of envs with one batched ``predict`` per
step, each env reset with its own seed, so results do not depend on batching
for deterministic policies.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from ..model import EnvTraits, EpisodeSummary, Evidence
from ..success import EpisodeOutcome, SuccessSpec, is_success, success_margin
from .constraints import Constraint
from .envs import env_traits, time_limit_of, traits_of_spaces
from .episodes import EpisodeRecord
from .progress import progress_measure
from .rollcache import RolloutCache, rollout_key
from .tfevents import read_scalars
from .wrappers import ORIGINAL_REWARD_KEY, REWARD_COMPONENTS_KEY

__all__ = [
    "EpisodeRecord",
    "rollout",
    "TrainingLog",
    "read_training_logs",
    "EvidenceBundle",
    "collect_evidence",
    "to_evidence",
    "MAX_BATCH",
]

#: most envs stepped together in one rollout batch.
MAX_BATCH = 16


# ---------------------------------------------------------------- per-episode measures


def _action_stats(actions: np.ndarray, space: gym.Space) -> tuple[dict[str, float], np.ndarray | None]:
    """Per-episode action measures (jerk, saturation, spread) and discrete action counts."""
    if isinstance(space, gym.spaces.Discrete):
        counts = np.bincount(actions.astype(int).reshape(-1) - int(space.start), minlength=int(space.n))
        switches = float(np.mean(actions[1:] != actions[:-1])) if len(actions) > 1 else math.nan
        return {"action_switch_rate": switches}, counts
    if not isinstance(space, gym.spaces.Box) or actions.size == 0:
        return {}, None
    a = actions.reshape(len(actions), -1).astype(float)
    low, high = space.low.reshape(-1).astype(float), space.high.reshape(-1).astype(float)
    rng = np.where(np.isfinite(high - low) & (high > low), high - low, np.nan)
    a_clip = np.clip(a, low, high)
    stats = {
        "action_jerk": float(np.nanmean(np.abs(np.diff(a_clip, axis=0)) / rng)) if len(a) > 1 else math.nan,
        "action_saturation": float(np.nanmean(np.minimum(a_clip - low, high - a_clip) <= 0.02 * rng)),
        "action_std": float(np.nanmean(np.std(a_clip, axis=0) / rng)),
    }
    return stats, None


def _components(infos: list[dict]) -> dict[str, np.ndarray]:
    """Per-step reward terms from ``info["reward_components"]`` and MuJoCo-style ``info["reward_*"]`` scalars."""
    keys: dict[str, None] = {}
    for info in infos:
        for k in info.get(REWARD_COMPONENTS_KEY, {}):
            keys.setdefault(k)
        for k, v in info.items():
            if k.startswith("reward_") and k != REWARD_COMPONENTS_KEY and np.isscalar(v):
                keys.setdefault(k)
    out = {}
    for k in keys:
        vals = [info.get(REWARD_COMPONENTS_KEY, {}).get(k, info.get(k, 0.0)) for info in infos]
        out[k] = np.asarray(vals, dtype=float)
    return out


def _informative_frac(rewards: np.ndarray) -> float:
    """Fraction of steps whose reward differs from the most common per-step value (0 = constant or silent)."""
    if not len(rewards):
        return math.nan
    _vals, counts = np.unique(np.round(rewards, 8), return_counts=True)
    return float(1.0 - counts.max() / len(rewards))


def _finite(x: Any) -> bool:
    try:
        return bool(np.all(np.isfinite(np.asarray(x, dtype=float))))
    except (TypeError, ValueError):
        return True


# ---------------------------------------------------------------- rollouts


class _Episode:
    """Mutable per-episode accumulator (internal)."""

    def __init__(self, seed: int, obs: Any):
        self.seed, self.obs = seed, [np.asarray(obs)]
        self.actions: list[np.ndarray] = []
        self.orig: list[float] = []
        self.train: list[float] = []
        self.infos: list[dict] = []
        self.violations, self.nan = 0, not _finite(obs)
        self.terminated = self.truncated = False
        self.progress: list[float] = []  # the env's own progress measure after each step, if it has one

    def add(self, action, obs, reward, terminated, truncated, info, violated: bool) -> None:
        self.actions.append(np.asarray(action))
        self.obs.append(np.asarray(obs))
        self.train.append(float(reward))
        self.orig.append(float(info.get(ORIGINAL_REWARD_KEY, reward)))
        self.infos.append(info)
        self.violations += int(violated)
        self.nan = self.nan or not (_finite(obs) and _finite(reward) and _finite(action))
        self.terminated, self.truncated = bool(terminated), bool(truncated)

    def record(self, success_spec: SuccessSpec, env: gym.Env, keep: bool, deterministic: bool) -> EpisodeRecord:
        acts = np.asarray(self.actions)
        obs = np.asarray(self.obs, dtype=float).reshape(len(self.obs), -1)
        orig = np.asarray(self.orig, dtype=float)
        ret, final_reward = float(orig.sum()), float(orig[-1]) if len(orig) else 0.0
        outcome = EpisodeOutcome(
            ret=ret if math.isfinite(ret) else 0.0,
            length=len(orig),
            terminated=self.terminated,
            truncated=self.truncated,
            final_reward=final_reward if math.isfinite(final_reward) else 0.0,
            final_obs=[float(x) for x in obs[-1]],
            final_info=self.infos[-1] if self.infos else {},
        )
        stats, counts = _action_stats(acts, env.action_space)
        stats["obs_abs_max"] = float(np.nanmax(np.abs(obs[np.isfinite(obs)]))) if np.isfinite(obs).any() else math.nan
        stats["reward_informative_frac"] = _informative_frac(orig)
        stats.update(self._progress_stats(success_spec, outcome))
        return EpisodeRecord(
            seed=self.seed,
            ret=ret,
            train_ret=float(np.sum(self.train)),
            length=len(orig),
            terminated=self.terminated,
            truncated=self.truncated,
            success=(not self.nan) and is_success(success_spec, outcome),
            final_reward=final_reward,
            violations=self.violations,
            nan=self.nan,
            actions=acts if keep else None,
            observations=obs if keep else None,
            rewards=orig if keep else None,
            reward_components=_components(self.infos),
            stats=stats,
            action_counts=counts,
            states2d=obs[:, :2].astype(np.float32) if obs.shape[1] >= 1 else None,
            deterministic=deterministic,
            obs_dim_std=np.nanstd(np.where(np.isfinite(obs), obs, np.nan), axis=0) if len(obs) > 1 else None,
        )

    def _progress_stats(self, spec: SuccessSpec, outcome: EpisodeOutcome) -> dict[str, float]:
        """Progress at the end and at best (NaN where the env defines none), and the success definition's margin."""
        prog = np.asarray(self.progress, dtype=float)
        ok = prog[np.isfinite(prog)]
        return {
            "progress_final": float(prog[-1]) if len(prog) and math.isfinite(prog[-1]) else math.nan,
            "progress_max": float(ok.max()) if len(ok) else math.nan,
            "success_margin": success_margin(spec, outcome),
        }


def _normalize(obs: np.ndarray, vecnormalize: Any) -> np.ndarray:
    return vecnormalize.normalize_obs(obs) if vecnormalize is not None else obs


def rollout(
    model: Any,
    env_factory: Callable[[], gym.Env],
    *,
    n_episodes: int,
    seed: int,
    deterministic: bool = True,
    success: SuccessSpec,
    constraints: Sequence[Constraint] = (),
    keep_trajectories: int = 3,
    vecnormalize: Any = None,
) -> list[EpisodeRecord]:
    """Run ``n_episodes`` seeded episodes (seeds ``seed, seed+1, ...``) and record each.

    ``env_factory`` gives an env with the run's setup wrappers (the training view);
    ``vecnormalize`` (a VecNormalize) normalizes observations the way training did.
    """
    from stable_baselines3.common.utils import set_random_seed

    set_random_seed(seed)  # stochastic actions come from torch's RNG
    tests = [c.compile() for c in constraints]
    n_envs = max(1, min(MAX_BATCH, n_episodes))
    envs = [env_factory() for _ in range(n_envs)]
    try:
        return _run_batch(model, envs, n_episodes, seed, deterministic, success, tests, keep_trajectories, vecnormalize)
    finally:
        for e in envs:
            e.close()


def _run_batch(model, envs, n_episodes, seed, deterministic, success, tests, keep, vecnormalize) -> list[EpisodeRecord]:
    done: dict[int, EpisodeRecord] = {}
    next_ep = 0
    slots: list[tuple[int, _Episode] | None] = [None] * len(envs)
    state, starts = None, np.ones(len(envs), dtype=bool)

    def start(i: int) -> None:
        nonlocal next_ep
        if next_ep >= n_episodes:
            slots[i] = None
            return
        obs, _ = envs[i].reset(seed=seed + next_ep)
        slots[i] = (next_ep, _Episode(seed + next_ep, obs))
        starts[i] = True
        next_ep += 1

    for i in range(len(envs)):
        start(i)
    while any(s is not None for s in slots):
        obs = np.stack([s[1].obs[-1] if s is not None else np.zeros_like(_any_obs(slots)) for s in slots])
        try:
            actions, state = model.predict(
                _normalize(obs, vecnormalize), state=state, episode_start=starts.copy(), deterministic=deterministic
            )
        except (ValueError, RuntimeError):
            # a diverged policy (NaN weights) cannot even sample; its episodes end as numerical failures
            for i, slot in enumerate(slots):
                if slot is not None:
                    slot[1].nan = slot[1].truncated = True
                    done[slot[0]] = slot[1].record(success, envs[i], keep=slot[0] < keep, deterministic=deterministic)
                    start(i)
            state = None
            continue
        starts[:] = False
        for i, slot in enumerate(slots):
            if slot is not None:
                _step_one(envs[i], slot, actions[i], tests, done, success, keep, deterministic, start, i)
    return [done[k] for k in sorted(done)]


def _any_obs(slots) -> np.ndarray:
    return next(s[1].obs[-1] for s in slots if s is not None)


def _step_one(env, slot, action, tests, done, success, keep, deterministic, start, i) -> None:
    idx, ep = slot
    try:
        obs, reward, terminated, truncated, info = env.step(action)
    except (AssertionError, ValueError, RuntimeError, FloatingPointError):
        # physics engines assert on NaN actions; the episode ends as a numerical failure
        ep.nan, ep.truncated = True, True
        obs, reward, terminated, truncated, info = ep.obs[-1], 0.0, False, True, {}
    else:
        violated = any(t(obs, action, info) for t in tests)
        ep.add(action, obs, reward, terminated, truncated, info, violated)
        measure = progress_measure(env)
        if measure is not None:
            ep.progress.append(measure.progress(env))
    if terminated or truncated or ep.nan:
        done[idx] = ep.record(success, env, keep=idx < keep, deterministic=deterministic)
        start(i)


# ---------------------------------------------------------------- training logs


@dataclass
class TrainingLog:
    """Learning curve and logged scalars of the agent's training run.

    ``timesteps``/``ep_return``: the learning curve (episode return against env
    steps), from Monitor CSVs when present else ``rollout/ep_rew_mean``.
    ``scalars``: other logged series by short name (``entropy_loss``, ``approx_kl``,
    ``std``, ...), with their steps in ``scalar_steps``.
    """

    timesteps: np.ndarray
    ep_return: np.ndarray
    scalars: dict[str, np.ndarray] = field(default_factory=dict)
    scalar_steps: dict[str, np.ndarray] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _read_monitor(files: list[Path]) -> tuple[np.ndarray, np.ndarray] | None:
    rows: list[tuple[float, float, float]] = []  # (t, r, l)
    for f in files:
        with open(f, newline="") as fh:
            first = fh.readline()
            if not first.startswith("#"):
                fh.seek(0)
            for row in csv.DictReader(fh):
                try:
                    rows.append((float(row["t"]), float(row["r"]), float(row["l"])))
                except (KeyError, ValueError):
                    continue
    if not rows:
        return None
    rows.sort()
    arr = np.asarray(rows)
    return np.cumsum(arr[:, 2]), arr[:, 1]


def _read_progress(files: list[Path]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Series by full column name -> (timesteps, values), NaN rows dropped."""
    series: dict[str, tuple[list[float], list[float]]] = {}
    for f in files:
        with open(f, newline="") as fh:
            for row in csv.DictReader(fh):
                step = _num(row.get("time/total_timesteps") or row.get("timesteps"))
                if step is None:
                    continue
                for k, v in row.items():
                    val = _num(v)
                    if k and val is not None and k not in ("time/total_timesteps", "timesteps"):
                        s = series.setdefault(k, ([], []))
                        s[0].append(step)
                        s[1].append(val)
    return {k: (np.asarray(s), np.asarray(v)) for k, (s, v) in series.items()}


def _num(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _read_events(files: list[Path], notes: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Scalar series from TensorBoard event files, by tag, sorted by step."""
    merged: dict[str, list[tuple[int, float]]] = {}
    for f in files:
        try:
            for tag, pts in read_scalars(f).items():
                merged.setdefault(tag, []).extend(pts)
        except OSError as ex:
            notes.append(f"cannot read {f.name}: {ex}")
    if not merged:
        notes.append(f"{len(files)} TensorBoard event file(s) held no scalars")
    out = {}
    for tag, pts in merged.items():
        pts = sorted(p for p in pts if math.isfinite(p[1]))
        if pts:
            out[tag] = (np.asarray([p[0] for p in pts], float), np.asarray([p[1] for p in pts], float))
    return out


def read_training_logs(run_dir_path: str | Path) -> TrainingLog | None:
    """Read Monitor CSVs, progress.csv files and TensorBoard scalars under a run dir (None when there are none)."""
    root = Path(run_dir_path)
    monitors = sorted(p for p in root.rglob("*monitor.csv") if p.is_file())
    progress = sorted(p for p in root.rglob("progress.csv") if p.is_file())
    events = sorted(p for p in root.rglob("events.out.tfevents.*") if p.is_file())
    notes: list[str] = []
    sources: list[str] = []
    curve = _read_monitor(monitors) if monitors else None
    if curve is not None:
        sources.append("monitor")
    series = _read_progress(progress) if progress else {}
    if series:
        sources.append("progress.csv")
    if events:
        tb = _read_events(events, notes)
        if tb:
            sources.append("tensorboard")
        for k, v in tb.items():
            series.setdefault(k, v)  # progress.csv wins where both logged the same tag
    if curve is None:
        key = (
            "rollout/ep_rew_mean"
            if "rollout/ep_rew_mean" in series
            else "ep_return_mean"
            if "ep_return_mean" in series
            else None
        )
        if key:
            curve = series[key]
    if curve is None and not series:
        return None if not notes else TrainingLog(np.zeros(0), np.zeros(0), notes=notes)
    scalars = {k.split("/")[-1]: v for k, (s, v) in series.items()}
    steps = {k.split("/")[-1]: s for k, (s, v) in series.items()}
    ts, ret = curve if curve is not None else (np.zeros(0), np.zeros(0))
    return TrainingLog(np.asarray(ts, float), np.asarray(ret, float), scalars, steps, sources, notes)


# ---------------------------------------------------------------- bundle


@dataclass
class EvidenceBundle:
    """Everything observed of one agent: both rollout modes, its training log, and env facts."""

    deterministic: list[EpisodeRecord]
    stochastic: list[EpisodeRecord]
    log: TrainingLog | None
    time_limit: int | None
    traits: EnvTraits
    action_space: gym.Space | None = None
    observation_space: gym.Space | None = None
    notes: list[str] = field(default_factory=list)
    constraint_names: list[str] = field(default_factory=list)
    nonfinite_weights: bool = False


def collect_evidence(
    run: Any,
    *,
    n_episodes: int = 20,
    seed: int = 0,
    stochastic: bool = True,
    keep_trajectories: int = 3,
    cache: RolloutCache | None = None,
) -> EvidenceBundle:
    """Roll out a :class:`~remedy.cases.evidence.rundir.RunDir`'s agent and read its logs.

    ``cache`` (a :class:`~remedy.cases.evidence.rollcache.RolloutCache`) reuses rollouts a session
    already computed at the same seeds, bit for bit.
    """
    model = run.load_model()
    vecnorm = _load_obs_normalizer(run)
    probe = run.make_env()
    try:
        limit, a_space, o_space = time_limit_of(probe), probe.action_space, probe.observation_space
    finally:
        probe.close()
    cfg = run.config
    kw = dict(
        n_episodes=n_episodes,
        seed=seed,
        success=cfg.success,
        constraints=cfg.constraints,
        keep_trajectories=keep_trajectories,
        vecnormalize=vecnorm,
    )
    det = _rollout_once(cache, run, model, True, kw)
    sto = _rollout_once(cache, run, model, False, kw) if stochastic else []
    log = read_training_logs(run.path)
    try:
        traits = env_traits(cfg.env_id, cfg.env_kwargs)
    except Exception:  # traits of an env that was made above cannot fail differently; keep the spaces' view
        traits = traits_of_spaces(cfg.env_id, o_space, a_space)
    notes = list(log.notes) if log else []
    bad_weights = not _weights_finite(model)
    if bad_weights:
        notes.append("the checkpoint holds NaN/inf weights (training diverged)")
    names = [c.name for c in cfg.constraints]
    return EvidenceBundle(det, sto, log, limit, traits, a_space, o_space, notes, names, bad_weights)


def _rollout_once(
    cache: RolloutCache | None, run: Any, model: Any, deterministic: bool, kw: dict[str, Any]
) -> list[EpisodeRecord]:
    """The run's rollouts in its training view, from ``cache`` when it holds the same computation."""
    if cache is None:
        return rollout(model, run.make_env, deterministic=deterministic, **kw)
    key = rollout_key(run, n_episodes=kw["n_episodes"], seed=kw["seed"], deterministic=deterministic)
    rest = {k: v for k, v in kw.items() if k != "keep_trajectories"}
    return cache.get_or_compute(
        key,
        lambda keep: rollout(model, run.make_env, deterministic=deterministic, keep_trajectories=keep, **rest),
        kw["keep_trajectories"],
    )


def _weights_finite(model: Any) -> bool:
    """False when any policy parameter is NaN or inf."""
    policy = getattr(model, "policy", None)
    if policy is None or not hasattr(policy, "parameters"):
        return True
    import torch

    with torch.no_grad():
        return all(bool(torch.isfinite(p).all()) for p in policy.parameters())


def _load_obs_normalizer(run: Any):
    """The saved VecNormalize (observation statistics only), or None."""
    if getattr(run, "vecnormalize_path", None) is None:
        return None
    from stable_baselines3.common.vec_env import DummyVecEnv

    return run.load_vecnormalize(DummyVecEnv([run.make_env]))


def to_evidence(bundle: EvidenceBundle) -> Evidence:
    """The case model's summary of the evidence: deterministic episodes, log presence, notes."""
    episodes = [
        EpisodeSummary(
            seed=r.seed,
            ret=r.ret if math.isfinite(r.ret) else 0.0,
            length=r.length,
            termination=r.termination,
            success=r.success,
        )
        for r in bundle.deterministic
    ]
    notes = list(bundle.notes)
    if any(not math.isfinite(r.ret) for r in bundle.deterministic):
        notes.append("some returns were not finite and are shown as 0")
    has_logs = bundle.log is not None and (bundle.log.ep_return.size > 0 or bool(bundle.log.scalars))
    return Evidence(n_episodes=len(episodes), episodes=episodes, has_training_logs=has_logs, notes="; ".join(notes))
