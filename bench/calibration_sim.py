"""Calibration (a) ``sim``: A/A by simulation through the project's own statistics, on a grid of seeds,
episodes and seed-to-episode sd ratios (``bench/calibration.py sim``; the method is in its docstring)."""

from __future__ import annotations

import argparse
import itertools
import time
from dataclasses import dataclass

import numpy as np
from calibration_common import fmt, rate

SEEDS, EPISODES, RATIOS = (2, 3, 5), (5, 20), (0.0, 0.5, 1.0, 2.0)


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
