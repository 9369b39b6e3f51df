"""One line in a user's training script turns a run into a Remedy run directory.

    model.learn(100_000, callback=RemedyRunCallback("runs/lander", config))

writes ``run.yaml``, ``model.zip`` (at the end, and every ``save_freq`` steps),
``vecnormalize.pkl`` when the env is a ``VecNormalize``, and ``progress.csv``
with ``time/total_timesteps``, ``rollout/ep_rew_mean`` and whatever scalars
SB3's logger holds at each rollout's end (``train/entropy_loss``,
``train/approx_kl``, ...). Without a config, the env id, kwargs, algorithm and
simple hyperparameters are read off the model; success then defaults to the
env's registered ``reward_threshold``.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecNormalize, unwrap_vec_normalize

from ..algos import SAVED_HYPERPARAMS, canonical_algo, constructor_hyperparams
from ..errors import AlgorithmError, RunDirError
from ..success import ReturnThreshold, SuccessSpec
from .rundir import MODEL_ZIP, VECNORMALIZE_PKL, RunConfig, write_run_yaml

__all__ = ["RemedyRunCallback", "infer_run_config", "PROGRESS_CSV"]

PROGRESS_CSV = "progress.csv"
_OFF_POLICY_LOG_FREQ = 1000


def _plain(v: Any) -> bool:
    return isinstance(v, (bool, int, float, str)) and not (isinstance(v, float) and not math.isfinite(v))


def _simple_hyperparams(model: Any) -> dict[str, Any]:
    hp = {k: getattr(model, k) for k in SAVED_HYPERPARAMS if _plain(getattr(model, k, None))}
    try:  # policy_kwargs only when it is plain data (activation classes are not)
        pk = getattr(model, "policy_kwargs", None) or {}
        if pk:
            json.dumps(pk)
            hp["policy_kwargs"] = pk
    except (TypeError, ValueError):
        pass
    return constructor_hyperparams(type(model), hp)  # DQN carries a use_sde attribute its constructor refuses


def _env_spec(model: Any):
    venv = model.get_env()
    if venv is None:
        return None
    try:
        return venv.get_attr("spec", [0])[0]
    except (AttributeError, IndexError):
        return None


def infer_run_config(model: Any, success: SuccessSpec | None = None, **extra: Any) -> RunConfig:
    """A :class:`RunConfig` read off a model and its (vectorized) env; ``extra`` overrides fields."""
    spec = _env_spec(model)
    if spec is None and "env_id" not in extra:
        raise RunDirError("cannot tell the env id from the model's env; pass a RunConfig to RemedyRunCallback")
    if success is None and "success" not in extra:
        threshold = getattr(spec, "reward_threshold", None)
        if threshold is None:
            raise RunDirError(
                f"env '{getattr(spec, 'id', '?')}' has no reward_threshold; pass success=... "
                "(e.g. ReturnThreshold(threshold=...)) or a RunConfig"
            )
        success = ReturnThreshold(threshold=float(threshold))
    try:
        algo = canonical_algo(type(model).__name__)
    except AlgorithmError as ex:
        raise RunDirError(f"{ex}; pass a RunConfig with algo set") from None
    # render_mode is how SB3 built the env, not part of the task
    kwargs = {
        k: v
        for k, v in (getattr(spec, "kwargs", None) or {}).items()
        if (_plain(v) or v is None) and k != "render_mode"
    }
    data: dict[str, Any] = dict(
        env_id=getattr(spec, "id", None),
        env_kwargs=kwargs,
        algo=algo,
        hyperparams=_simple_hyperparams(model),
        n_envs=int(getattr(model, "n_envs", 1) or 1),
        success=success,
        seed=getattr(model, "seed", None),
    )
    data.update(extra)
    return RunConfig.model_validate(data)


class RemedyRunCallback(BaseCallback):
    """SB3 callback that writes a Remedy run directory while the agent trains."""

    def __init__(
        self,
        run_dir: str | Path,
        config: RunConfig | None = None,
        save_freq: int | None = None,
        *,
        success: SuccessSpec | None = None,
        log_freq: int | None = None,
        verbose: int = 0,
    ):
        """``save_freq``: also save every that many steps; ``log_freq``: steps between progress rows
        (default: every rollout for on-policy algorithms, every 1,000 steps for off-policy ones,
        whose rollouts end every few steps)."""
        super().__init__(verbose)
        self.run_dir = Path(run_dir)
        self.config = config
        self.success = success
        self.save_freq = int(save_freq) if save_freq else None
        self.log_freq = int(log_freq) if log_freq else None
        self.rows: list[dict[str, float]] = []
        self._last_save = 0

    def _on_training_start(self) -> None:
        if self.log_freq is None:
            self.log_freq = 1 if hasattr(self.model, "rollout_buffer") else _OFF_POLICY_LOG_FREQ
        if self.config is None:
            self.config = infer_run_config(self.model, self.success)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_run_yaml(self.run_dir, self.config)

    def _on_step(self) -> bool:
        if self.save_freq and self.num_timesteps - self._last_save >= self.save_freq:
            self._save()
        return True

    def _on_rollout_end(self) -> None:
        if self.rows and self.num_timesteps - self.rows[-1]["time/total_timesteps"] < (self.log_freq or 1):
            return
        self._record_row()

    def _record_row(self) -> None:
        row: dict[str, float] = {"time/total_timesteps": float(self.num_timesteps)}
        buf = getattr(self.model, "ep_info_buffer", None)
        if buf:
            row["rollout/ep_rew_mean"] = float(np.mean([ep["r"] for ep in buf]))
            row["rollout/ep_len_mean"] = float(np.mean([ep["l"] for ep in buf]))
        # scalars the last train() recorded and the logger has not dumped yet
        for key, value in getattr(self.logger, "name_to_value", {}).items():
            if key not in row and _plain(value) and not isinstance(value, (str, bool)):
                row[key] = float(value)
        if self.rows and self.rows[-1]["time/total_timesteps"] == row["time/total_timesteps"]:
            self.rows[-1].update(row)  # training end right after a rollout end: same point, newer scalars
        else:
            self.rows.append(row)

    def _on_training_end(self) -> None:
        self._record_row()  # the final state, with the last train() scalars
        if self.config is None:  # training ended before it started
            self.config = infer_run_config(self.model, self.success)
        update: dict[str, Any] = {"train_steps": int(self.num_timesteps)}
        env = self.model.get_env()
        if self.config.normalize is None and env is not None and unwrap_vec_normalize(env) is not None:
            update["normalize"] = True  # recorded, so a rollout without vecnormalize.pkl is refused
        self.config = self.config.model_copy(update=update)
        write_run_yaml(self.run_dir, self.config)
        self._save()

    def _save(self) -> None:
        self._last_save = self.num_timesteps
        self.model.save(str(self.run_dir / MODEL_ZIP))
        env = self.model.get_env()
        vn = unwrap_vec_normalize(env) if env is not None else None
        if isinstance(vn, VecNormalize):
            vn.save(str(self.run_dir / VECNORMALIZE_PKL))
        self._write_progress()

    def _write_progress(self) -> None:
        keys: list[str] = []
        for row in self.rows:
            keys.extend(k for k in row if k not in keys)
        with open(self.run_dir / PROGRESS_CSV, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=keys, restval="")
            writer.writeheader()
            writer.writerows(self.rows)
