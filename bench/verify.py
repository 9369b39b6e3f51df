"""Speed of the fine-tuning harness (prints figures; asserts nothing).

(a) wall time of ``remedy.cases.verify.training.finetune`` against a plain SB3
    ``Algo.load(...) + learn() + save()`` on the same checkpoint, env and budget
    (target ratio <= 1.05);
(b) env steps per second with 1 vs 8 ``DummyVecEnv`` envs: raw stepping with
    random actions, and a whole fine-tune with the same rollout size.

Usage: ``python bench/verify.py [--scenario cartpole_undertrained] [--budget 20000] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch


def plain_sb3(run, budget: int, seed: int, n_envs: int, out: Path) -> float:
    """Load + learn + save with nothing of Remedy's in the loop; returns wall seconds."""
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    from remedy.cases.algos import get_algo

    start = time.perf_counter()
    c = run.config
    venv = DummyVecEnv([lambda: Monitor(gym.make(c.env_id, **c.env_kwargs))] * n_envs)
    model = get_algo(c.algo).load(str(run.model_path), env=venv, device="cpu")
    model.set_random_seed(seed)
    model.learn(budget, reset_num_timesteps=False)
    model.save(str(out / "plain.zip"))
    venv.close()
    return time.perf_counter() - start


def harness(run, budget: int, seed: int, n_envs: int, out: Path, patch_json: str | None = None) -> tuple[float, int]:
    """One ``finetune`` call; returns (wall seconds measured outside, env steps)."""
    from remedy.cases.verify.training import finetune

    start = time.perf_counter()
    res = finetune(str(run.path), patch_json, budget_steps=budget, seed=seed, n_envs=n_envs, out_dir=str(out))
    return time.perf_counter() - start, res.env_steps


def raw_steps_per_s(run, n_envs: int, steps: int) -> float:
    """Random-action stepping through the harness's vec env (recorder + Monitor + setup wrappers)."""
    from remedy.cases.patches.apply import make_patched_env_fn
    from remedy.cases.verify.training import EpisodeLog, make_vec_env

    c = run.config
    venv = make_vec_env(make_patched_env_fn(c.env_id, c.env_kwargs, c.wrappers, None, 0), n_envs, EpisodeLog())
    venv.seed(0)
    venv.reset()
    actions = [np.array([venv.action_space.sample() for _ in range(n_envs)]) for _ in range(16)]
    start = time.perf_counter()
    for i in range(steps // n_envs):
        venv.step(actions[i % 16])
    elapsed = time.perf_counter() - start
    venv.close()
    return (steps // n_envs) * n_envs / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="cartpole_undertrained")
    ap.add_argument("--budget", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)

    from remedy.cases.verify.scenarios import build, load_scenarios

    scenario = load_scenarios(args.scenario)[0]
    run = build(scenario)
    print(f"scenario {scenario.name}: {run.config.env_id} {run.config.algo}, budget {args.budget:,} steps, 8 envs")
    tmp = Path(tempfile.mkdtemp(prefix="remedy-bench-"))
    plain_t, harness_t = [], []
    for r in range(args.repeats):  # interleaved, first runner alternating, so load drift hits both alike
        first_plain = r % 2 == 0
        if first_plain:
            plain_t.append(plain_sb3(run, args.budget, r, 8, tmp))
        harness_t.append(harness(run, args.budget, r, 8, tmp / f"h{r}")[0])
        if not first_plain:
            plain_t.append(plain_sb3(run, args.budget, r, 8, tmp))
    p, h = statistics.median(plain_t), statistics.median(harness_t)
    print(
        f"(a) plain SB3 load+learn+save  median {p:6.2f} s  min {min(plain_t):6.2f} s  runs {', '.join(f'{x:.2f}' for x in plain_t)}"
    )
    print(
        f"    remedy finetune()          median {h:6.2f} s  min {min(harness_t):6.2f} s  runs {', '.join(f'{x:.2f}' for x in harness_t)}"
    )
    print(
        f"    ratio harness/plain        median {h / p:6.3f}  min {min(harness_t) / min(plain_t):6.3f}   (target <= 1.05)"
    )

    raw1, raw8 = raw_steps_per_s(run, 1, 20000), raw_steps_per_s(run, 8, 20000)
    print(f"(b) raw env steps/s            1 env {raw1:8.0f}   8 envs {raw8:8.0f}   x{raw8 / raw1:.2f}")
    n_steps = int(run.config.hyperparams.get("n_steps", 32))
    same_rollout = json.dumps({"kind": "hyperparameters", "changes": {"n_steps": n_steps * 8}})
    t1, s1 = harness(run, args.budget, 0, 1, tmp / "n1", same_rollout)
    t8, s8 = harness(run, args.budget, 0, 8, tmp / "n8")
    print(
        f"    fine-tune env steps/s      1 env {s1 / t1:8.0f}   8 envs {s8 / t8:8.0f}   x{(s8 / t8) / (s1 / t1):.2f}"
        f"   (same rollout of {n_steps * 8} steps per update)"
    )


if __name__ == "__main__":
    main()
