"""How much does the block of evaluation episodes decide a seed's value? (why every seed has its own block)

For one scenario, fine-tunes the patient with its oracle patch (treatment) and without (control) on a few
training seeds, at the scenario's budget, and evaluates every fine-tuned agent, and the checkpoint, on
``--blocks`` blocks of ``--episodes`` episodes (block k: episodes seeded from 10,000 + 1,000 k, the
verification's first eval seed and its per-seed stride), plus the block a first confirmation used to
evaluate on (110,000). Prints success per agent and block: if the same block is high for every agent,
the block's luck is shared by every seed evaluated on it, and a seed-level interval over one shared
block leaves it out.

    .venv/bin/python bench/eval_blocks.py --scenario cartpole_lr_too_high --seeds 0,3,5
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np

from remedy.cases.verify.arms import ArmSpec, evaluate_trained
from remedy.cases.verify.scenarios import build, load_scenarios
from remedy.cases.verify.training import finetune
from remedy.cases.verify.verification import CONFIRM_EVAL_STRIDE, EVAL_BLOCK_STRIDE, VerifyConfig
from remedy.kb.fixloop import one_torch_thread


def _success(run_dir: str, spec_args: dict, eval_seed: int) -> float:
    spec = ArmSpec(eval_seed=eval_seed, out_dir="", **spec_args)
    return float(np.mean(evaluate_trained(spec, run_dir).nominal.successes))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="cartpole_lr_too_high")
    ap.add_argument("--seeds", default="0,3,5", help="comma-separated training seeds")
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument("--episodes", type=int, default=20)
    args = ap.parse_args()
    one_torch_thread()
    s = load_scenarios(args.scenario)[0]
    if s.oracle is None:
        raise SystemExit(f"{s.name} declares no oracle patch")
    run = build(s)
    first = VerifyConfig().eval_seed  # the verification's first evaluation episode
    blocks = [first + EVAL_BLOCK_STRIDE * k for k in range(args.blocks)] + [first + CONFIRM_EVAL_STRIDE]
    print(f"{s.name}: oracle {s.oracle.summary()}, budget {s.budget:,} env steps per arm")
    print("| agent | seed | " + " | ".join(f"block {b:,}" for b in blocks) + " | mean |")
    print("| --- | --- | " + " | ".join("---" for _ in blocks) + " | --- |")
    base = dict(run_dir=str(run.path), budget_steps=s.budget, n_envs=8, learning_rate=None)
    for arm in ("treatment", "control"):
        patch_json = s.oracle.model_dump_json() if arm == "treatment" else None
        for seed in (int(x) for x in args.seeds.split(",")):
            ft = finetune(str(run.path), patch_json, budget_steps=s.budget, seed=seed, out_dir=tempfile.mkdtemp())
            if ft.run_dir is None:
                print(f"| {arm} | {seed} | diverged: {ft.reason} |")
                continue
            spec = dict(base, arm=arm, seed=seed, patch_json=patch_json, eval_episodes=args.episodes)
            vals = [_success(ft.run_dir, spec, b) for b in blocks]
            print(f"| {arm} | {seed} | " + " | ".join(f"{v:.2f}" for v in vals) + f" | {np.mean(vals):.2f} |")
    spec = dict(base, arm="control", seed=0, patch_json=None, eval_episodes=args.episodes, budget_steps=0)
    vals = [_success(str(run.path), spec, b) for b in blocks]
    print("| checkpoint | - | " + " | ".join(f"{v:.2f}" for v in vals) + f" | {np.mean(vals):.2f} |")


if __name__ == "__main__":
    main()
