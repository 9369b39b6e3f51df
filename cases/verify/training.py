"""Training a patient from scratch and fine-tuning a checkpoint with (or without) a patch.

:func:`train` builds a fault scenario's patient: the env with its setup (fault)
wrappers, a ``DummyVecEnv`` of ``n_envs``, one torch thread, written as a run
directory. :func:`finetune` is one arm of a verification: it takes only
picklable arguments (paths, JSON text, numbers) so it can run inside the
sandbox worker process, loads the checkpoint with ``Algo.load(path, env=...)``,
applies the patch plan, learns, and writes the fine-tuned agent as a run
directory whose ``run.yaml`` is the patient's own (evaluation therefore sees
the original task, never the patched reward).
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from ..algos import get_algo, is_on_policy
from ..errors import CheckpointError, PatchRejectedError, RunDirError
from ..evidence.checkpoint import read_data
from ..evidence.envs import env_traits
from ..evidence.rundir import RunConfig, RunDir, write_run_dir
from ..patches.apply import PatchPlan, make_patched_env_fn
from ..patches.spec import Patch

__all__ = [
    "FinetuneResult",
    "EpisodeLog",
    "train",
    "finetune",
    "arm_budgets",
    "arm_comparison",
    "env_step_budget",
    "default_n_envs",
    "make_vec_env",
    "RECENT_EPISODES",
]

#: how many of the last training episodes the end-of-training return means average over.
RECENT_EPISODES = 20
#: the smallest rollout per env a fine-tune shrinks ``n_steps`` to when the budget is tiny.
_MIN_N_STEPS = 16
#: warm-up transitions an off-policy fine-tune collects into its empty replay buffer before updates.
_OFF_POLICY_WARMUP = 1000

ProgressFn = Callable[[int, int], None]


@dataclass(frozen=True)
class FinetuneResult:
    """One fine-tuning arm's outcome (picklable; paths are strings)."""

    model_path: str | None
    env_steps: int
    wall_time_s: float
    shaped_return_mean: float | None
    original_return_mean_train: float | None
    diverged: bool = False
    run_dir: str | None = None
    episodes: int = 0
    reason: str = ""
    notes: tuple[str, ...] = ()


@dataclass
class EpisodeLog:
    """Training-view and original returns of finished episodes (shared by the envs of one VecEnv)."""

    shaped: deque = field(default_factory=lambda: deque(maxlen=RECENT_EPISODES))
    original: deque = field(default_factory=lambda: deque(maxlen=RECENT_EPISODES))
    count: int = 0

    def means(self) -> tuple[float | None, float | None]:
        """Mean shaped and original return over the recent episodes (None when none finished)."""
        if not self.shaped:
            return None, None
        return float(np.mean(self.shaped)), float(np.mean(self.original))


class _Recorder(gym.Wrapper):
    """Adds up the training reward and ``info['original_reward']`` per episode into an :class:`EpisodeLog`."""

    def __init__(self, env: gym.Env, log: EpisodeLog):
        super().__init__(env)
        self._log, self._shaped, self._orig = log, 0.0, 0.0

    def reset(self, **kwargs):
        self._shaped = self._orig = 0.0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._shaped += float(reward)
        self._orig += float(info.get("original_reward", reward))
        if terminated or truncated:
            self._log.shaped.append(self._shaped)
            self._log.original.append(self._orig)
            self._log.count += 1
        return obs, reward, terminated, truncated, info


def default_n_envs(algo: str) -> int:
    """8 envs for on-policy algorithms (best on 2 cores, STACK.md), 1 for replay-buffer ones."""
    return 8 if is_on_policy(algo) else 1


def make_vec_env(env_fn: Callable[[], gym.Env], n_envs: int, log: EpisodeLog, monitor_dir: Path | None = None):
    """A ``DummyVecEnv`` of ``n_envs`` copies, each with a recorder and an SB3 ``Monitor``."""
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    def one(i: int) -> Callable[[], gym.Env]:
        def build() -> gym.Env:
            filename = str(monitor_dir / str(i)) if monitor_dir is not None else None
            return Monitor(_Recorder(env_fn(), log), filename=filename)

        return build

    return DummyVecEnv([one(i) for i in range(n_envs)])


class _ProgressCallback:
    """Adapts a ``progress(done, total)`` function to an SB3 callback (built lazily)."""

    @staticmethod
    def make(progress: ProgressFn | None, total: int):
        if progress is None:
            return None
        from stable_baselines3.common.callbacks import BaseCallback

        report: ProgressFn = progress  # narrowed once, for the closures below

        class _CB(BaseCallback):
            def _on_training_start(self) -> None:
                self._start = self.num_timesteps  # a fine-tune keeps counting from the checkpoint's steps

            def _on_step(self) -> bool:
                if self.n_calls % 64 == 0:
                    report(min(self.num_timesteps - self._start, total), total)
                return True

            def _on_training_end(self) -> None:
                report(min(self.num_timesteps - self._start, total), total)

        return _CB()


def _set_threads() -> None:
    import torch

    torch.set_num_threads(1)


def train(config: RunConfig, out_dir: str | Path, *, seed: int, progress: ProgressFn | None = None) -> RunDir:
    """Train ``config``'s agent from scratch for ``config.train_steps`` and write it as a run directory.

    The training env is the registered env with the config's setup (fault)
    wrappers and time limit; Monitor logs land under ``out_dir/logs``.
    """
    _set_threads()
    if not config.train_steps:
        raise RunDirError("train needs train_steps > 0 in the config; set it in the scenario or run.yaml")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    log = EpisodeLog()
    env_fn = make_patched_env_fn(
        config.env_id, config.env_kwargs, config.wrappers, None, seed, max_episode_steps=config.max_episode_steps
    )
    venv = make_vec_env(env_fn, config.n_envs, log, monitor_dir=out / "logs")
    # A deep copy: SB3 writes into the dicts it is handed (A2C adds optimizer_class to policy_kwargs),
    # which would change the frozen config and break writing run.yaml.
    hyper = copy.deepcopy(dict(config.hyperparams))
    policy = hyper.pop("policy", "MlpPolicy")
    model = get_algo(config.algo)(policy, venv, seed=seed, device="cpu", verbose=0, **hyper)
    # progress.csv carries entropy/KL/loss scalars, which the signature's learning-curve features read.
    from stable_baselines3.common.logger import configure

    model.set_logger(configure(str(out), ["csv"]))
    model.learn(int(config.train_steps), callback=_ProgressCallback.make(progress, int(config.train_steps)))
    stored = config.model_copy(update={"seed": seed})
    run = write_run_dir(out, model, stored)
    venv.close()
    return run


# --------------------------------------------------------------------------- fine-tuning


def arm_budgets(patch: Patch | None, budget_steps: int) -> tuple[int, int]:
    """``(treatment, control)`` values of ``budget_steps`` to pass to :func:`finetune` for the two arms.

    :func:`finetune` adds the patch's ``extra_steps`` to the treatment itself, so:

    - a patch that only adds training steps is measured against the unpatched
      checkpoint (docs/verification.md, "more training vs none"): both arms get 0 here, the
      treatment then learns the patch's ``extra_steps`` and the control stays
      the checkpoint;
    - a ``training_budget`` part combined with other parts gives its extra steps
      to BOTH arms (the control gets ``budget + extra`` here): the comparison
      then measures the other parts at the larger budget, against a control
      with the same env steps. Refusing the combination instead would throw
      away a sensible patch ("lower the learning rate and train longer");
      crediting the treatment alone with the extra steps was the old bias;
    - every other patch: both arms get the same budget.

    Both arms are then held to the same number of ENV steps by :func:`finetune`
    (action repeat included).
    """
    if patch is not None and patch.budget_only:
        return 0, 0
    extra = sum(int(getattr(p, "extra_steps", 0)) for p in (patch.parts if patch is not None else ()))
    return budget_steps, budget_steps + extra


def arm_comparison(patch: Patch | None) -> str:
    """What a verification of ``patch`` compares: ``budget_vs_none`` for a pure budget patch, else ``same_budget_control``."""
    if patch is not None and patch.budget_only:
        return "budget_vs_none"
    return "same_budget_control"


def env_step_budget(total: int, rollout: int | None) -> int:
    """The env steps one arm of ``total`` steps takes: ``total`` rounded up to whole rollouts of ``rollout`` env steps.

    ``rollout`` is the control's on-policy rollout size (``n_steps * n_envs``,
    after the small-budget shrink); None for off-policy algorithms, which step
    one env at a time.
    """
    if not rollout or total <= 0:
        return max(0, int(total))
    return int(math.ceil(total / rollout) * rollout)


class _EnvBudget:
    """Stops an arm once its counted env steps reach the common budget (built lazily as an SB3 callback).

    An on-policy rollout that ends exactly at the budget is still trained on (it
    is the natural end of a same-sized control); one cut short by the budget is
    not, which is what "the budget ran out" means for a treatment whose action
    repeat or rollout size differs from the control's.
    """

    @staticmethod
    def make(counter: list[int], budget: int, on_policy: bool):
        from stable_baselines3.common.callbacks import BaseCallback

        class _CB(BaseCallback):
            def _on_rollout_start(self) -> None:
                self._in_rollout = 0

            def _on_step(self) -> bool:
                self._in_rollout = getattr(self, "_in_rollout", 0) + 1
                if counter[0] < budget:
                    return True
                # a rollout completed at the budget is trained; for a same-sized control learn() then ends itself
                return on_policy and self._in_rollout >= int(getattr(self.model, "n_steps", 0) or 0)

        return _CB()


def _plan_for(run: RunDir, patch_json: str | None) -> PatchPlan:
    if patch_json is None:
        return PatchPlan()
    try:
        patch = Patch.from_data(json.loads(patch_json))
    except (ValueError, TypeError) as ex:
        raise PatchRejectedError(
            f"patch JSON does not parse: {str(ex).splitlines()[0]}; check the patch file", rule="patch_parse"
        ) from ex
    c = run.config
    plan = PatchPlan.from_patch(patch, env_traits(c.env_id, c.env_kwargs), c.algo)
    if plan.needs_fresh_policy:
        raise PatchRejectedError(
            "frame stack changes the observation space, so it cannot fine-tune the saved policy; "
            "retrain from scratch with frame stacking instead",
            rule="frame_stack_needs_fresh_policy",
        )
    return plan


def _wrap_normalization(run: RunDir, venv, plan: PatchPlan, gamma: float):
    """Keep the patient's VecNormalize statistics (training on); add normalization the patch asks for."""
    from stable_baselines3.common.vec_env import VecNormalize

    want = plan.normalization
    if run.vecnormalize_path is not None:
        vn = run.load_vecnormalize(venv, evaluation=False)  # allow-list unpickling unless the run is trusted
        vn.training = True
        if want is not None and want.reward:
            vn.norm_reward = True
        return vn
    if want is None or not (want.obs or want.reward):
        return venv
    return VecNormalize(venv, norm_obs=want.obs, norm_reward=want.reward, gamma=gamma)


def _small_budget_overrides(
    saved: dict[str, Any], overrides: dict[str, Any], n_envs: int, total: int, notes: list[str]
) -> None:
    """Shrink an on-policy rollout that is longer than the whole budget (both arms alike)."""
    n_steps = int(overrides.get("n_steps", saved.get("n_steps", 0)) or 0)
    if "n_steps" in overrides or n_steps <= 0 or n_steps * n_envs <= total:
        return
    new = max(_MIN_N_STEPS, total // n_envs)
    overrides["n_steps"] = new
    batch = int(overrides.get("batch_size", saved.get("batch_size", 64)) or 64)
    if batch > new * n_envs:
        overrides["batch_size"] = new * n_envs
    notes.append(f"n_steps {n_steps} -> {new}: the rollout was longer than the {total}-step budget")


def _saved_params(run: RunDir) -> dict[str, Any]:
    """Plain constructor values stored in the checkpoint's ``data`` JSON (no torch load, no unpickling)."""
    keys = ("n_steps", "batch_size", "gamma", "num_timesteps", "learning_starts")
    try:
        data = read_data(run.model_path)  # bounded read: a data entry that inflates past the cap is refused
    except CheckpointError:
        return {}
    return {k: data.get(k) for k in keys if isinstance(data.get(k), (int, float))}


def _load_for_training(run: RunDir, venv, overrides: dict[str, Any]):
    """One ``Algo.load(path, env=venv, **overrides)`` through the run dir's loader (no unpickling from the
    zip unless the run is trusted; a mismatch is spelled out as a CheckpointError)."""
    return run.load_model(env=venv, **copy.deepcopy(overrides))


def _params_finite(model) -> bool:
    import torch

    return all(bool(torch.isfinite(p).all()) for p in model.policy.parameters())


def _learn(model, total: int, callback) -> str:
    """Learn ``total`` more steps; return '' or why training diverged (NaN loss/params)."""
    try:
        model.learn(total, reset_num_timesteps=False, callback=callback)
    except (ValueError, RuntimeError, FloatingPointError) as ex:
        text = str(ex).splitlines()[0] if str(ex) else type(ex).__name__
        return f"training diverged: {text}"
    if not _params_finite(model):
        return "training diverged: non-finite policy parameters"
    return ""


def finetune(
    run_dir_path: str,
    patch_json: str | None,
    *,
    budget_steps: int,
    seed: int,
    n_envs: int = 8,
    out_dir: str | None = None,
    learning_rate: float | None = None,
    progress: ProgressFn | None = None,
    start_dir: str | None = None,
    done_steps: int = 0,
) -> FinetuneResult:
    """Fine-tune the run's checkpoint with a patch (treatment) or without one (control, ``patch_json=None``).

    Learns ``budget_steps`` plus the patch's extra steps (see :func:`arm_budgets`),
    counted in ENV steps (an action repeat's inner steps included) and rounded
    up to whole rollouts of the control's size (:func:`env_step_budget`), on ``n_envs`` envs (1 for off-policy algorithms, whose replay buffer starts
    empty), and writes the result as a run directory at ``out_dir`` (a fresh
    temporary directory when None). ``learning_rate`` applies to both arms; a
    patch's hyperparameters win over it. NaN in the loss or parameters gives
    ``diverged=True`` and a reason, not an exception.

    ``start_dir`` (a run directory an earlier fine-tune of the same arm wrote, e.g. a race's stage 1)
    makes the arm go on from there: ``done_steps`` of its steps count as trained, so it learns the
    rest, ``budget_steps + extra - done_steps``. The budget arithmetic (rollout size, small-budget
    shrink) still reads the patient's checkpoint ``run_dir_path``, so two arms that go on stay held
    to equal env steps; the model, its normalization statistics and its step count come from
    ``start_dir``.
    """
    _set_threads()
    start = time.perf_counter()
    run = RunDir.load(run_dir_path)
    begin = RunDir.load(start_dir) if start_dir else run
    plan = _plan_for(run, patch_json)
    c = run.config
    total = int(budget_steps) + plan.extra_steps - int(done_steps)
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="remedy-ft-"))
    if total <= 0:  # nothing (more) to train: the arm is the checkpoint (budget-patch control) or its start
        return _copy_checkpoint(begin, out, start)
    notes: list[str] = []
    if start_dir:
        notes.append(f"went on from a run that had trained {int(done_steps):,} of its steps")
    saved = _saved_params(run)
    on_policy = is_on_policy(c.algo)
    n = int(n_envs) if on_policy else 1
    overrides: dict[str, Any] = {}
    if learning_rate is not None:
        overrides["learning_rate"] = float(learning_rate)
    # the env-step budget is what the CONTROL (no patch overrides) takes, so both arms get the same
    control_overrides = dict(overrides)
    overrides.update(plan.overrides)
    if on_policy:
        _small_budget_overrides(saved, control_overrides, n, total, [])
        _small_budget_overrides(saved, overrides, n, total, notes)
    else:
        began = _saved_params(begin) if start_dir else saved  # learning starts after the start's own steps
        overrides.setdefault(
            "learning_starts", int(began.get("num_timesteps") or 0) + min(_OFF_POLICY_WARMUP, total // 10)
        )
        notes.append("off-policy: the replay buffer starts empty (it is not stored in the checkpoint)")
    budget = env_step_budget(total, _rollout_size(saved, control_overrides, n) if on_policy else None)
    log, counter = EpisodeLog(), [0]
    schedule = plan.curriculum_schedule(budget)
    env_fn = make_patched_env_fn(
        c.env_id,
        c.env_kwargs,
        c.wrappers,
        plan,
        None,
        max_episode_steps=c.max_episode_steps,
        schedule=schedule,
        step_counter=counter,
    )
    venv = _wrap_normalization(begin, make_vec_env(env_fn, n, log), plan, float(saved.get("gamma") or 0.99))
    model = _load_for_training(begin, venv, overrides)
    model.set_random_seed(int(seed))
    callbacks = [
        cb for cb in (_EnvBudget.make(counter, budget, on_policy), _ProgressCallback.make(progress, budget)) if cb
    ]
    reason = _learn(model, budget, callbacks)
    if counter[0] < budget and not reason:
        notes.append(f"took {counter[0]} of {budget} env steps")
    vn = venv if hasattr(venv, "obs_rms") else None
    written = write_run_dir(out, model, c, vecnormalize=vn)
    venv.close()
    shaped, original = log.means()
    return FinetuneResult(
        model_path=str(written.model_path),
        env_steps=counter[0],
        wall_time_s=time.perf_counter() - start,
        shaped_return_mean=_finite_or_none(shaped),
        original_return_mean_train=_finite_or_none(original),
        diverged=bool(reason),
        run_dir=str(out),
        episodes=log.count,
        reason=reason,
        notes=tuple(notes),
    )


def _rollout_size(saved: dict[str, Any], overrides: dict[str, Any], n_envs: int) -> int | None:
    """Env steps of one on-policy rollout (``n_steps * n_envs``), None when the checkpoint does not say."""
    n_steps = int(overrides.get("n_steps", saved.get("n_steps", 0)) or 0)
    return n_steps * n_envs if n_steps > 0 else None


def _finite_or_none(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _copy_checkpoint(run: RunDir, out: Path, start: float) -> FinetuneResult:
    out.mkdir(parents=True, exist_ok=True)
    for name in ("run.yaml", "model.zip", "vecnormalize.pkl"):
        src = run.path / name
        if src.is_file():
            shutil.copyfile(src, out / name)
    return FinetuneResult(
        model_path=str(out / "model.zip"),
        env_steps=0,
        wall_time_s=time.perf_counter() - start,
        shaped_return_mean=None,
        original_return_mean_train=None,
        run_dir=str(out),
        notes=("no training: the arm is the unpatched checkpoint",),
    )
