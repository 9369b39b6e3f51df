"""Calibration (b) ``real``: a real A/A on a shipped quick scenario checkpoint, through ``verify_and_confirm``,
resumable from its JSONL (``bench/calibration.py real``)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from calibration_common import OUT, fmt, rate

#: real A/A: the control's seeds are the treatment's plus this (far from any trial's seed range)
CONTROL_SEED_OFFSET = 1_000_000


def done_trials(path: Path, confirm_seeds: int | None = None) -> dict[int, dict]:
    """Trials already in the JSONL run with ``confirm_seeds``, by index (a half-written last line is ignored)."""
    out = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if row.get("confirm_seeds") == confirm_seeds:
                out[int(row["trial"])] = row
    return out


def real_trial(run, patch, trial: int, args: argparse.Namespace) -> dict:
    """One A/A verification (screen, and a confirmation if the screen clears) on seeds no other trial uses."""
    from remedy.cases.verify.verification import VerifyConfig, verify_and_confirm

    # each trial owns a block of screen seeds and one of confirmation seeds, and its own evaluation episodes
    # the control trains on other seeds than the treatment, so the arms are independent draws (with paired
    # seeds a patch that changes nothing gives bit-identical arms, diff exactly 0: no test of calibration)
    cfg = VerifyConfig(
        seeds=args.seeds,
        budget_steps=args.budget,
        eval_episodes=args.episodes,
        confirm_seeds=args.confirm_seeds,
        seed_base=args.seed_base + trial * (args.seeds + (args.confirm_seeds or args.seeds)),
        eval_seed=10_000 + 1_000 * trial,
        control_seed_offset=CONTROL_SEED_OFFSET,
    )
    start = time.perf_counter()
    screen, confirmation = verify_and_confirm(run, patch, cfg)
    final = confirmation or screen
    v, sv = final.verification, screen.verification
    e = sv.effect
    return {
        "trial": trial,
        "confirm_seeds": args.confirm_seeds,
        "seed_base": sv.seed_base,
        "screen_status": sv.status.value,
        "passed_screen": sv.passed_screen,
        "final_status": v.status.value,
        "stage": v.stage.value,
        "metric": None if e is None else e.metric,
        "diff": None if e is None else e.diff,
        "ci": None if e is None else [e.ci_low, e.ci_high],
        "per_seed": sv.per_seed,
        "confirm_status": None if confirmation is None else v.status.value,
        "env_steps": sv.env_steps + (v.env_steps if confirmation else 0),
        "wall_s": round(time.perf_counter() - start, 1),
        "reason": sv.reason[:300],
    }


def summarize_real(rows: list[dict]) -> dict:
    n = len(rows)
    screens = sum(r["passed_screen"] for r in rows)
    final = sum(r["final_status"] == "improved" for r in rows)
    failed = sum(r["screen_status"] == "failed" for r in rows)
    return {
        "trials": n,
        "screen_cleared": rate(screens, n),
        "false_improved": rate(final, n),
        "failed": failed,
        "statuses": {s: sum(r["final_status"] == s for r in rows) for s in sorted({r["final_status"] for r in rows})},
        "wall_s": round(sum(r["wall_s"] for r in rows), 1),
        "env_steps": sum(r["env_steps"] for r in rows),
    }


def print_real(summary: dict, meta: dict) -> None:
    print(
        f"real A/A on {meta['scenario']} ({meta['patch']}), {meta['seeds']} seeds/arm, budget {meta['budget']:,} "
        f"steps/arm, {meta['episodes']} eval episodes: {summary['trials']} trials, {summary['wall_s']:.0f} s of "
        f"verification, {summary['env_steps']:,} env steps"
    )
    print(f"  screen cleared: {fmt(summary['screen_cleared'])}")
    print(f"  false improved (after confirmation): {fmt(summary['false_improved'])}; statuses {summary['statuses']}")


def run_real(args: argparse.Namespace) -> dict:
    from remedy.cases.evidence.rundir import RunDir
    from remedy.cases.patches.spec import Patch
    from remedy.cases.verify.scenarios import SCENARIO_DIR
    from remedy.kb.fixloop import one_torch_thread

    one_torch_thread()
    run = RunDir.load(SCENARIO_DIR / "checkpoints" / args.scenario)
    lr = run.config.hyperparams["learning_rate"]
    patch = Patch.from_data(
        {
            "kind": "hyperparameters",
            "description": "A/A: the learning rate it already has",
            "changes": {"learning_rate": lr},
        }
    )
    meta = {
        "scenario": args.scenario,
        "patch": f"learning_rate = {lr} (unchanged)",
        "seeds": args.seeds,
        "confirm_seeds": args.confirm_seeds,
        "budget": args.budget,
        "episodes": args.episodes,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    jsonl = Path(args.jsonl)
    done = done_trials(jsonl, args.confirm_seeds)
    for trial in range(args.trials):
        if trial in done:
            continue
        row = real_trial(run, patch, trial, args)
        with jsonl.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(
            f"trial {trial}: screen {row['screen_status']}{' (cleared)' if row['passed_screen'] else ''}, "
            f"final {row['final_status']}, {row['metric']} diff {row['diff']}, CI {row['ci']}, {row['wall_s']} s",
            flush=True,
        )
        done[trial] = row
    rows = [done[t] for t in sorted(done) if t < args.trials]
    summary = summarize_real(rows)
    print_real(summary, meta)
    return {**meta, **summary}
