"""Calibration of verification: how often does a patch that does nothing come out ``improved``?

(a) ``sim``: A/A by simulation through the project's own statistics
    (:func:`remedy.cases.verify.stats.effect` and
    :func:`remedy.cases.verify.verification.decide_status`). Both arms are drawn
    from the same two-level model: each training seed has its own value (seed
    sd = ratio x episode sd), each episode scatters around it. Grid: seeds
    {2, 3, 5} x episodes {5, 20} x ratio {0, 0.5, 1, 2}, for returns (normal
    episodes, IQM per seed) and for success (per-seed success probability from
    a Beta around 0.5; at ratio >= 1 the seeds are all-or-nothing, the worst case
    for a t-interval). Printed per cell: the false-``improved`` rate of the screen
    alone, of screen + confirmation on fresh data (as many seeds as the screen, and
    with ``--confirm-seeds`` N: a confirmation on N seeds, as the fix loop runs it,
    plus that confirmation's own rate, which bounds each confirmation the loop
    runs; ``--screen-confidence`` sets the screen's pass level, 0.95 by default
    as before, 0.8 in the fix loop), and of the first, episode-level bootstrap (``stats.bootstrap_ci``, fewer trials: it is slow), each with a
    Wilson 95% interval.
(b) ``real``: a real A/A on a shipped quick scenario checkpoint: a
    ``hyperparameters`` patch that sets the learning rate to the value the
    checkpoint already has, verified K times through the real ``verify_and_confirm``
    (real SB3 fine-tunes in worker processes) with distinct seed bases. Resumable:
    each trial is appended to a JSONL and skipped when it is there.

Usage::

    python bench/calibration.py sim [--trials 2000] [--boot-trials 200] [--n-boot 250]
    python bench/calibration.py real [--trials 20] [--scenario cartpole_undertrained] [--budget 2000]
    python bench/calibration.py report          # print both from bench/out without running anything

Figures go to stdout and to ``bench/out/calibration.json`` (one section per part).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import binomtest

OUT = Path(__file__).resolve().parent / "out"
JSON_PATH = OUT / "calibration.json"
REAL_JSONL = OUT / "calibration_real.jsonl"
SEEDS, EPISODES, RATIOS = (2, 3, 5), (5, 20), (0.0, 0.5, 1.0, 2.0)
#: real A/A: the control's seeds are the treatment's plus this (far from any trial's seed range)
CONTROL_SEED_OFFSET = 1_000_000


def wilson(k: int, n: int) -> tuple[float, float]:
    """Wilson 95% interval of a rate k/n (scipy's binomtest)."""
    if n == 0:
        return float("nan"), float("nan")
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    return float(ci.low), float(ci.high)


def rate(k: int, n: int) -> dict:
    """A rate with its Wilson interval, JSON-ready."""
    low, high = wilson(k, n)
    return {"k": k, "n": n, "rate": k / n if n else float("nan"), "low": low, "high": high}


def fmt(r: dict) -> str:
    return f"{r['rate']:6.2%} [{r['low']:5.1%}, {r['high']:5.1%}]"


# --------------------------------------------------------------------------- (a) simulation


@dataclass(frozen=True)
class Cell:
    """One grid point of the A/A simulation."""

    metric: str  # "returns" or "success"
    seeds: int
    episodes: int
    ratio: float


def draw_arm(cell: Cell, rng: np.random.Generator) -> list[np.ndarray]:
    """One arm of ``cell.seeds`` runs of ``cell.episodes`` episodes under the null (both arms alike)."""
    if cell.metric == "returns":
        means = rng.normal(0.0, cell.ratio, cell.seeds)
        return [rng.normal(m, 1.0, cell.episodes) for m in means]
    p0 = 0.5
    if cell.ratio == 0:
        probs = np.full(cell.seeds, p0)
    elif cell.ratio >= 1:  # seed variance cannot exceed p(1-p): the limit is all-or-nothing seeds
        probs = rng.binomial(1, p0, cell.seeds).astype(float)
    else:
        kappa = 1.0 / cell.ratio**2 - 1.0  # Var(p_i) = p0(1-p0)/(kappa+1) = ratio^2 * p0(1-p0)
        probs = rng.beta(p0 * kappa, (1 - p0) * kappa, cell.seeds)
    return [rng.binomial(1, p, cell.episodes).astype(float) for p in probs]


def improved(cell: Cell, rng: np.random.Generator, confidence: float = 0.95) -> bool:
    """One A/A verification through the project's statistics: is it called improved (at ``confidence``; a
    screen's pass test at its own level)?"""
    from remedy.cases.model import Status
    from remedy.cases.verify import stats
    from remedy.cases.verify.verification import decide_status

    agg = stats.iqm if cell.metric == "returns" else stats.mean
    e = stats.effect(cell.metric, draw_arm(cell, rng), draw_arm(cell, rng), aggregate=agg, confidence=confidence)
    return decide_status(e) is Status.improved


def old_bootstrap_improved(cell: Cell, rng: np.random.Generator, n_boot: int) -> tuple[bool, bool]:
    """The first method (episode-level stratified bootstrap of pooled arms): (improved, CI excludes zero)."""
    from remedy.cases.verify import stats

    agg = stats.iqm if cell.metric == "returns" else stats.mean
    t, c = draw_arm(cell, rng), draw_arm(cell, rng)
    low, high = stats.bootstrap_ci(
        t, c, lambda a, b: agg(stats.pooled(a)) - agg(stats.pooled(b)), n_boot=n_boot, random_state=rng
    )
    return low > 0, low > 0 or high < 0


def simulate_cell(
    cell: Cell,
    trials: int,
    boot_trials: int,
    n_boot: int,
    seed: int,
    confirm_seeds: int | None = None,
    screen_confidence: float = 0.95,
) -> dict:
    """Screen (passing at ``screen_confidence``), screen + confirmation (fresh data, only after a pass, at
    95%), and the old bootstrap, for one cell; with ``confirm_seeds``, also screen + a confirmation on that
    many seeds and such a confirmation alone."""
    rng = np.random.default_rng(seed)
    screen = confirmed = confirmed_n = alone_n = 0
    wide = None if confirm_seeds is None else Cell(cell.metric, confirm_seeds, cell.episodes, cell.ratio)
    for _ in range(trials):
        if wide is not None:
            alone_n += improved(wide, rng)  # a confirmation's own false pass, whatever screened it
        if improved(cell, rng, screen_confidence):
            screen += 1
            confirmed += improved(cell, rng)  # a confirmation: new seeds, new episodes
            if wide is not None:
                confirmed_n += improved(wide, rng)
    old = [old_bootstrap_improved(cell, rng, n_boot) for _ in range(boot_trials)]
    extra = (
        {}
        if wide is None
        else {
            "confirm_seeds": confirm_seeds,
            "screen_confirm_n": rate(confirmed_n, trials),
            "confirm_n_alone": rate(alone_n, trials),
        }
    )
    return {
        **extra,
        "screen_confidence": screen_confidence,
        "metric": cell.metric,
        "seeds": cell.seeds,
        "episodes": cell.episodes,
        "ratio": cell.ratio,
        "screen": rate(screen, trials),
        "screen_confirm": rate(confirmed, trials),
        "old_bootstrap_improved": rate(sum(o[0] for o in old), boot_trials),
        "old_bootstrap_excludes_zero": rate(sum(o[1] for o in old), boot_trials),
    }


def run_sim(args: argparse.Namespace) -> dict:
    metrics = args.metrics.split(",")
    cells = [Cell(m, s, e, r) for m, s, e, r in itertools.product(metrics, SEEDS, EPISODES, RATIOS)]
    rows, start = [], time.perf_counter()
    print(
        f"A/A simulation: {args.trials} trials per cell (old bootstrap: {args.boot_trials} trials, "
        f"{args.n_boot} resamples); false improved = CI low > 0 (one-sided 2.5% nominal); the screen passes at "
        f"{args.screen_confidence:.0%} two-sided (one-sided {(1 - args.screen_confidence) / 2:.3g})"
    )
    print(
        f"{'metric':8} {'seeds':>5} {'eps':>4} {'ratio':>5} | {'screen':24} | {'screen+confirm':24} | "
        f"{'old bootstrap improved':24} | old excl. 0"
    )
    for i, cell in enumerate(cells):
        row = simulate_cell(
            cell, args.trials, args.boot_trials, args.n_boot, args.seed + i, args.confirm_seeds, args.screen_confidence
        )
        rows.append(row)
        wide = (
            f" | screen+confirm@{args.confirm_seeds}: {fmt(row['screen_confirm_n'])}"
            f" | confirm@{args.confirm_seeds} alone: {fmt(row['confirm_n_alone'])}"
            if args.confirm_seeds
            else ""
        )
        print(
            f"{cell.metric:8} {cell.seeds:5} {cell.episodes:4} {cell.ratio:5.1f} | {fmt(row['screen']):24} | "
            f"{fmt(row['screen_confirm']):24} | {fmt(row['old_bootstrap_improved']):24} | "
            f"{row['old_bootstrap_excludes_zero']['rate']:.1%}{wide}",
            flush=True,
        )
    if args.confirm_seeds:
        for key, what in (("screen_confirm_n", "screen+confirm"), ("confirm_n_alone", "confirmation alone")):
            w = max(rows, key=lambda r, k=key: r[k]["rate"])
            print(
                f"worst {what} at {args.confirm_seeds} confirmation seeds: {fmt(w[key])} ({w['metric']}, "
                f"{w['seeds']} screen seeds, {w['episodes']} eps, ratio {w['ratio']})"
            )
    worst = max(rows, key=lambda r: r["screen_confirm"]["rate"])
    worst_screen = max(rows, key=lambda r: r["screen"]["rate"])
    print(
        f"worst screen+confirm: {fmt(worst['screen_confirm'])} ({worst['metric']}, {worst['seeds']} seeds, "
        f"{worst['episodes']} eps, ratio {worst['ratio']}); target <= 5%"
    )
    print(
        f"worst screen alone:   {fmt(worst_screen['screen'])} ({worst_screen['metric']}, {worst_screen['seeds']} "
        f"seeds, {worst_screen['episodes']} eps, ratio {worst_screen['ratio']})"
    )
    return {
        "trials": args.trials,
        "boot_trials": args.boot_trials,
        "n_boot": args.n_boot,
        "seed": args.seed,
        "confirm_seeds": args.confirm_seeds,
        "screen_confidence": args.screen_confidence,
        "wall_s": round(time.perf_counter() - start, 1),
        "cells": rows,
    }


# --------------------------------------------------------------------------- (b) real A/A


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


# --------------------------------------------------------------------------- entry point


def save(section: str, data: dict) -> None:
    """Merge one part's figures into bench/out/calibration.json."""
    OUT.mkdir(parents=True, exist_ok=True)
    whole = json.loads(JSON_PATH.read_text()) if JSON_PATH.is_file() else {}
    whole[section] = data
    JSON_PATH.write_text(json.dumps(whole, indent=2))


def report() -> None:
    whole = json.loads(JSON_PATH.read_text()) if JSON_PATH.is_file() else {}
    for row in [r for key in sorted(whole) if key.startswith("sim") for r in whole[key].get("cells", [])]:
        print(
            f"{row['metric']:8} {row['seeds']:5} {row['episodes']:4} {row['ratio']:5.1f} | {fmt(row['screen'])} | "
            f"{fmt(row['screen_confirm'])} | {fmt(row['old_bootstrap_improved'])}"
        )
    if "real" in whole:
        print_real(whole["real"], whole["real"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=("sim", "real", "report"))
    parser.add_argument("--trials", type=int, default=None, help="sim: trials per cell (2000); real: A/A runs (20)")
    parser.add_argument("--boot-trials", type=int, default=200, help="sim: trials per cell for the old bootstrap")
    parser.add_argument("--n-boot", type=int, default=250, help="sim: resamples of the old bootstrap")
    parser.add_argument("--seed", type=int, default=0, help="sim: random state")
    parser.add_argument("--metrics", default="returns,success", help="sim: which metrics' grids to run")
    parser.add_argument("--section", default=None, help="sim: JSON section to write (default 'sim')")
    parser.add_argument("--scenario", default="cartpole_undertrained", help="real: a shipped quick checkpoint")
    parser.add_argument("--budget", type=int, default=2000, help="real: fine-tuning steps per arm")
    parser.add_argument("--seeds", type=int, default=3, help="real: training seeds per arm")
    parser.add_argument("--episodes", type=int, default=20, help="real: evaluation episodes per agent")
    parser.add_argument(
        "--confirm-seeds",
        type=int,
        default=None,
        help="seeds per arm of a confirmation (sim: adds screen + confirmation on this many seeds; "
        "real: the confirmations' seeds; default: as many as the screen)",
    )
    parser.add_argument(
        "--screen-confidence",
        type=float,
        default=0.95,
        help="sim: two-sided level at which a screen passes (the fix loop's default is 0.8; confirmations stay at 0.95)",
    )
    parser.add_argument("--seed-base", type=int, default=5000, help="real: first training seed of trial 0")
    parser.add_argument("--jsonl", default=str(REAL_JSONL), help="real: where trials are appended (resumable)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.part == "report":
        report()
        return
    if args.part == "sim":
        args.trials = args.trials or 2000
        save(args.section or "sim", run_sim(args))
    else:
        args.trials = args.trials or 20
        save("real", run_real(args))


if __name__ == "__main__":
    main()
