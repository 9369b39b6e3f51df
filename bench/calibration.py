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

(c) ``power``: whole designs side by side (issue 27), simulated through ``stats.effect``,
    ``decide_status`` and ``stats.sequential_look`` (:func:`designs`: the shipped screen + 8-seed
    confirmation, the new lenient screen + sequential 4/8 confirmation, each change alone, and a
    sequential 6/12). Per design: the false-``improved`` rate per patient (``--candidates`` null
    candidates through the fix loop's order, at most ``--confirmations`` confirmations) and of one
    confirmation by itself, under A/A noise models (:data:`NULLS`: normal seeds, noisy episodes,
    heavy tails, bimodal "a seed learns or not" on returns and success, all-or-nothing success);
    and for fix-sized effects (:data:`EFFECTS`) the power of a real fix screened then confirmed, the
    same per patient (the fix at a random place among the candidates), the seeds per arm spent per
    confirmed fix, and how often a confirmation stopped at its first look.
(d) ``racing``: how often stage 1 of a race (2 seeds per arm, a third of the budget) drops a
    slow-acting fix (false drops) or a candidate that does nothing or harms, under the futility rule
    (racing rules 2-3) and the harm rule (rule 4), raced alone and beside a candidate that does nothing.

Usage::

    python bench/calibration.py sim [--trials 2000] [--boot-trials 200] [--n-boot 250]
    python bench/calibration.py real [--trials 20] [--scenario cartpole_undertrained] [--budget 2000]
    nice python bench/calibration.py power [--trials 2000]     # simulation only
    nice python bench/calibration.py racing [--trials 2000]    # simulation only
    python bench/calibration.py report          # print both from bench/out without running anything

Figures go to stdout and to ``bench/out/calibration.json`` (one section per part); ``report`` also
prints the power and racing tables saved there.
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

from remedy.cases.verify.stats import SequentialDesign

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


# --------------------------------------------------------------------------- (c) power of whole designs


@dataclass(frozen=True)
class NoiseModel:
    """How one arm's runs are drawn: ``kind`` of seed value, the arm's parameter ``theta``, 20 episodes a seed.

    ``normal``: seed mean ~ N(theta, 1) (returns), episodes N(mean, ``eps_sd``); ``heavy``: seed mean theta + t(3);
    ``bimodal``: a seed learns with probability theta (mean 3 vs 0, +-0.3), episodes N(mean, 1);
    ``bimodal_success``: a seed learns with probability theta (success 0.9 per episode vs 0.05);
    ``all_or_nothing``: a seed succeeds in every episode with probability theta, else in none.
    """

    kind: str
    theta: float
    eps_sd: float = 1.0

    @property
    def metric(self) -> str:
        return "returns" if self.kind in ("normal", "heavy", "bimodal") else "success"

    def draw(self, n: int, rng: np.random.Generator, episodes: int = 20) -> list[np.ndarray]:
        """``n`` runs of ``episodes`` episodes."""
        if self.kind == "normal":
            return [rng.normal(m, self.eps_sd, episodes) for m in rng.normal(self.theta, 1.0, n)]
        if self.kind == "heavy":
            return [rng.normal(m, self.eps_sd, episodes) for m in self.theta + rng.standard_t(3, n)]
        learned = rng.random(n) < self.theta
        if self.kind == "bimodal":
            means = np.where(learned, 3.0, 0.0) + rng.normal(0.0, 0.3, n)
            return [rng.normal(m, 1.0, episodes) for m in means]
        p = np.where(learned, 0.9, 0.05) if self.kind == "bimodal_success" else learned.astype(float)
        return [rng.binomial(1, q, episodes).astype(float) for q in p]


#: A/A noise models (both arms alike) and fix-sized effects (control, treatment), by name
NULLS: dict[str, NoiseModel] = {
    "normal, seed sd = episode sd": NoiseModel("normal", 0.0),
    "normal, seed sd = episode sd / 4": NoiseModel("normal", 0.0, eps_sd=4.0),
    "heavy tails (t3 seeds)": NoiseModel("heavy", 0.0),
    "bimodal: 20% of seeds learn": NoiseModel("bimodal", 0.2),
    "bimodal: 50% of seeds learn": NoiseModel("bimodal", 0.5),
    "bimodal success: 50% learn": NoiseModel("bimodal_success", 0.5),
    "all-or-nothing success, q = 0.5": NoiseModel("all_or_nothing", 0.5),
    "all-or-nothing success, q = 0.2": NoiseModel("all_or_nothing", 0.2),
}
EFFECTS: dict[str, tuple[NoiseModel, NoiseModel]] = {
    "seeds that learn 20% -> 80% (returns)": (NoiseModel("bimodal", 0.2), NoiseModel("bimodal", 0.8)),
    "seeds that learn 20% -> 80% (success)": (NoiseModel("bimodal_success", 0.2), NoiseModel("bimodal_success", 0.8)),
    "return +1 seed-SD": (NoiseModel("normal", 0.0), NoiseModel("normal", 1.0)),
    "return +2 seed-SDs": (NoiseModel("normal", 0.0), NoiseModel("normal", 2.0)),
    "success 0 -> 1 (every seed)": (NoiseModel("all_or_nothing", 0.0), NoiseModel("all_or_nothing", 1.0)),
}
#: the effects a fix is made of (the target's ">= 80% power"); +1 seed-SD is shown, not a fix
FIX_SIZED = (
    "seeds that learn 20% -> 80% (returns)",
    "seeds that learn 20% -> 80% (success)",
    "return +2 seed-SDs",
    "success 0 -> 1 (every seed)",
)


@dataclass(frozen=True)
class Design:
    """A screen (``screen_seeds`` per arm, passing at one-sided ``screen_level``) and a confirmation on fresh seeds."""

    name: str
    screen_seeds: int
    screen_level: float
    confirm: SequentialDesign

    def screen(self, null: NoiseModel, treated: NoiseModel, rng: np.random.Generator) -> bool:
        """Does a screen pass (the verification's screen test: improved at the screen's level)?"""
        from remedy.cases.model import Status
        from remedy.cases.verify import stats
        from remedy.cases.verify.verification import decide_status

        agg = stats.iqm if null.metric == "returns" else stats.mean
        t, c = treated.draw(self.screen_seeds, rng), null.draw(self.screen_seeds, rng)
        e = stats.effect(null.metric, t, c, aggregate=agg, confidence=1 - 2 * self.screen_level)
        return decide_status(e) is Status.improved

    def confirmation(self, null: NoiseModel, treated: NoiseModel, rng: np.random.Generator) -> tuple[bool, int]:
        """One confirmation on fresh seeds, look by look: (improved, seeds per arm spent)."""
        from remedy.cases.verify import stats

        agg = stats.iqm if null.metric == "returns" else stats.mean
        last = self.confirm.looks[-1]
        t, c = treated.draw(last, rng), null.draw(last, rng)  # drawn at once; a look sees only its first seeds
        for k, n in enumerate(self.confirm.looks):
            _, verdict = stats.sequential_look(null.metric, t[:n], c[:n], self.confirm, k, aggregate=agg)
            if verdict != stats.CONTINUE:
                return verdict == stats.IMPROVED, n
        return False, last  # unreachable: the last look never continues


def designs() -> list[Design]:
    """The shipped design, the new one, each change alone, and the sequential design at 12 seeds."""
    fixed8, seq8 = SequentialDesign(looks=(8,), futility=False), SequentialDesign(looks=(4, 8))
    return [
        Design("shipped: screen 3 @10%, confirm 8 @2.5%", 3, 0.10, fixed8),
        Design("new: screen 3 @20%, sequential 4/8 (Pocock, futility)", 3, 0.20, seq8),
        Design("screen 3 @10%, sequential 4/8", 3, 0.10, seq8),
        Design("screen 3 @20%, confirm 8 @2.5%", 3, 0.20, fixed8),
        Design("screen 3 @20%, sequential 6/12 (--confirm-seeds 12)", 3, 0.20, SequentialDesign(looks=(6, 12))),
    ]


def patient_false(design: Design, null: NoiseModel, rng: np.random.Generator, candidates: int, confirmations: int):
    """One patient whose every candidate does nothing, through the fix loop's order: screen each candidate,
    confirm a cleared one while confirmations last. (any improved, confirmations run, seeds per arm spent)."""
    used = seeds = 0
    for _ in range(candidates):
        seeds += design.screen_seeds
        if used >= confirmations or not design.screen(null, null, rng):
            continue
        used += 1
        ok, n = design.confirmation(null, null, rng)
        seeds += n
        if ok:
            return True, used, seeds
    return False, used, seeds


def power_cell(design: Design, control: NoiseModel, treated: NoiseModel, trials: int, rng: np.random.Generator):
    """Power of one candidate that is a real fix (screen then confirm), its seeds per arm, and its confirmations'
    share that stopped at the first look."""
    hits = seeds = early = confirms = 0
    for _ in range(trials):
        seeds += design.screen_seeds
        if not design.screen(control, treated, rng):
            continue
        ok, n = design.confirmation(control, treated, rng)
        confirms += 1
        seeds += n
        early += n == design.confirm.looks[0] and len(design.confirm.looks) > 1
        hits += ok
    return {
        "power": rate(hits, trials),
        "seeds_per_trial": seeds / trials,
        "seeds_per_fix": seeds / hits if hits else float("inf"),
        "stopped_at_first_look": early / confirms if confirms else float("nan"),
    }


def patient_power(
    design: Design,
    control: NoiseModel,
    treated: NoiseModel,
    trials: int,
    rng: np.random.Generator,
    candidates: int,
    confirmations: int,
) -> dict:
    """A patient whose one real fix sits at a random place among ``candidates`` (the others do nothing), through
    the fix loop's order and its cap of ``confirmations``: how often the fix is confirmed."""
    found = 0
    for _ in range(trials):
        fix_at, used = int(rng.integers(candidates)), 0
        for i in range(candidates):
            arm = treated if i == fix_at else control
            if used >= confirmations or not design.screen(control, arm, rng):
                continue
            used += 1
            if design.confirmation(control, arm, rng)[0]:
                found += i == fix_at
                break
    return rate(found, trials)


def confirm_alone(design: Design, null: NoiseModel, trials: int, rng: np.random.Generator) -> dict:
    """A/A false-pass rate of the confirmation by itself (what bounds each confirmation, whatever screened it)."""
    return rate(sum(design.confirmation(null, null, rng)[0] for _ in range(trials)), trials)


def run_power(args: argparse.Namespace) -> dict:
    """Tables (c): per design, false improved per patient and per confirmation under A/A noise models, and the
    power and seeds per confirmed fix of fix-sized effects."""
    ds = designs()
    start = time.perf_counter()
    out: dict = {
        "trials": args.trials,
        "seed": args.seed,
        "candidates": args.candidates,
        "confirmations": args.confirmations,
        "designs": [d.name for d in ds],
        "nulls": {},
        "effects": {},
    }
    for i, (name, null) in enumerate(NULLS.items()):
        row = {}
        for j, d in enumerate(ds):
            rng = np.random.default_rng([args.seed, 1, i, j])
            runs = [patient_false(d, null, rng, args.candidates, args.confirmations) for _ in range(args.trials)]
            row[d.name] = {
                "patient_false": rate(sum(r[0] for r in runs), args.trials),
                "confirmations_per_patient": sum(r[1] for r in runs) / args.trials,
                "seeds_per_patient": sum(r[2] for r in runs) / args.trials,
                "confirm_alone": confirm_alone(d, null, args.trials, rng),
            }
        out["nulls"][name] = row
        print(f"  A/A {name}: done ({time.perf_counter() - start:.0f} s)", flush=True)
    for i, (name, (control, treated)) in enumerate(EFFECTS.items()):
        out["effects"][name] = {}
        for j, d in enumerate(ds):
            rng = np.random.default_rng([args.seed, 2, i, j])
            cell = power_cell(d, control, treated, args.trials, rng)
            cell["patient_power"] = patient_power(
                d, control, treated, args.trials, rng, args.candidates, args.confirmations
            )
            out["effects"][name][d.name] = cell
        print(f"  effect {name}: done ({time.perf_counter() - start:.0f} s)", flush=True)
    out["wall_s"] = round(time.perf_counter() - start, 1)
    print_power(out)
    return out


def _table(title: str, names: list[str], rows: dict, cell) -> None:
    width = max(len(n) for n in names)
    print(f"\n{title}")
    print(f"| {'':38} | " + " | ".join(f"{n:{width}}" for n in names) + " |")
    print(f"|{'-' * 40}|" + "|".join("-" * (width + 2) for _ in names) + "|")
    for key, row in rows.items():
        print(f"| {key:38} | " + " | ".join(f"{cell(row[n]):{width}}" for n in names) + " |")


def print_power(out: dict) -> None:
    """The power tables, designs side by side (Markdown)."""
    names = out["designs"]
    n, c = out["candidates"], out["confirmations"]
    print(f"\nDesigns (screen seeds @ one-sided level; confirmation on fresh seeds), {out['trials']} trials a cell:")
    for k, name in enumerate(names):
        print(f"  D{k + 1} = {name}")
    short = [f"D{k + 1}" for k in range(len(names))]
    rename = lambda rows: {key: {f"D{k + 1}": row[nm] for k, nm in enumerate(names)} for key, row in rows.items()}  # noqa: E731
    nulls, effects = rename(out["nulls"]), rename(out["effects"])
    _table(
        f"False improved per patient (A/A: {n} candidates that do nothing, at most {c} confirmations)",
        short,
        nulls,
        lambda r: f"{r['patient_false']['rate']:.2%}",
    )
    _table(
        "False pass of one confirmation by itself (A/A; the per-confirmation bound)",
        short,
        nulls,
        lambda r: f"{r['confirm_alone']['rate']:.2%}",
    )
    _table(
        "Seeds per arm spent on such a patient (screens + confirmations)",
        short,
        nulls,
        lambda r: f"{r['seeds_per_patient']:.1f}",
    )
    _table("Power: a real fix screened then confirmed", short, effects, lambda r: f"{r['power']['rate']:.0%}")
    _table(
        f"Power per patient: the fix at a random place among {n} candidates (the others do nothing), at most {c} "
        "confirmations",
        short,
        effects,
        lambda r: f"{r['patient_power']['rate']:.0%}",
    )
    _table(
        "Seeds per arm per confirmed fix (all seeds spent on the fix / fixes)",
        short,
        effects,
        lambda r: f"{r['seeds_per_fix']:.1f}",
    )
    _table(
        "Confirmations that stopped at the first look",
        short,
        effects,
        lambda r: (
            "-" if r["stopped_at_first_look"] != r["stopped_at_first_look"] else f"{r['stopped_at_first_look']:.0%}"
        ),
    )


# --------------------------------------------------------------------------- (d) racing's false drops

#: stage 1 of a candidate (a third of its budget, 2 seeds per arm) against its control, by what the full budget
#: would show: slow-acting fixes whose gain is not there yet, or only partly, and candidates that do nothing or harm
STAGE_ONE: dict[str, tuple[NoiseModel, NoiseModel, bool]] = {
    # name: (control, treatment at stage 1, is a fix at the full budget)
    "fix, gain already whole (+2 seed-SDs)": (NoiseModel("normal", 0.0), NoiseModel("normal", 2.0), True),
    "slow fix, a third of its gain (+0.67)": (NoiseModel("normal", 0.0), NoiseModel("normal", 2 / 3), True),
    "slow fix, no gain yet": (NoiseModel("normal", 0.0), NoiseModel("normal", 0.0), True),
    "slow fix, behind at first (-0.67)": (NoiseModel("normal", 0.0), NoiseModel("normal", -2 / 3), True),
    "slow fix, learners 20% vs 20% yet": (NoiseModel("bimodal", 0.2), NoiseModel("bimodal", 0.2), True),
    "does nothing": (NoiseModel("normal", 0.0), NoiseModel("normal", 0.0), False),
    "harms (-1 seed-SD)": (NoiseModel("normal", 0.0), NoiseModel("normal", -1.0), False),
    "harms (-3 seed-SDs)": (NoiseModel("normal", 0.0), NoiseModel("normal", -3.0), False),
}


def stage_one_effect(control: NoiseModel, treated: NoiseModel, rng: np.random.Generator, seeds: int, confidence: float):
    """One candidate's stage-1 effect, as a race measures it (seed values, Welch interval at ``confidence``)."""
    from remedy.cases.verify import stats

    agg = stats.iqm if control.metric == "returns" else stats.mean
    return stats.effect(
        control.metric, treated.draw(seeds, rng), control.draw(seeds, rng), aggregate=agg, confidence=confidence
    )


def drop_rate(name: str, rule: str, rivals: int, trials: int, rng: np.random.Generator) -> dict:
    """How often stage 1 drops the candidate ``name``, raced alone (``rivals`` 0) or beside candidates that do
    nothing, under the drop ``rule`` (at its stage-1 confidence: 95% for the futility rule as it ran, the race's
    own for the harm rule)."""
    from remedy.cases.verify.racing import RACE_SEEDS, RaceSettings, rank_stage_one

    control, treated, _ = STAGE_ONE[name]
    null = STAGE_ONE["does nothing"]
    confidence = 0.95 if rule == "futility" else RaceSettings().confidence
    dropped = 0
    for _ in range(trials):
        effects = [stage_one_effect(control, treated, rng, RACE_SEEDS, confidence)]
        effects += [stage_one_effect(null[0], null[1], rng, RACE_SEEDS, confidence) for _ in range(rivals)]
        dropped += not rank_stage_one(effects, rule=rule)[0].survived
    return rate(dropped, trials)


def run_racing(args: argparse.Namespace) -> dict:
    """Table (d): stage-1 drop rates of slow-acting fixes (false drops) and of candidates that do nothing or harm,
    under the futility rule (racing rules 2-3) and the harm rule (rule 4), alone and beside one rival."""
    rules = ("futility", "harm")
    out: dict = {"trials": args.trials, "seed": args.seed, "rows": {}}
    for i, name in enumerate(STAGE_ONE):
        out["rows"][name] = {
            f"{rule}, {'alone' if rivals == 0 else 'beside 1'}": drop_rate(
                name, rule, rivals, args.trials, np.random.default_rng([args.seed, 3, i, j])
            )
            for j, (rule, rivals) in enumerate(itertools.product(rules, (0, 1)))
        }
    print_racing(out)
    return out


def print_racing(out: dict) -> None:
    """Drop rates, rules side by side (Markdown)."""
    cols = list(next(iter(out["rows"].values())))
    print(f"\nStage 1 drop rate ({out['trials']} trials a cell; 2 seeds per arm at a third of the budget)")
    print(f"| {'candidate at stage 1':40} | fix? | " + " | ".join(f"{c:18}" for c in cols) + " |")
    print(f"|{'-' * 42}|------|" + "|".join("-" * 20 for _ in cols) + "|")
    for name, row in out["rows"].items():
        kind = "yes " if STAGE_ONE[name][2] else "no  "
        cells = " | ".join(f"{row[c]['rate']:18.1%}" for c in cols)
        print(f"| {name:40} | {kind} | {cells} |")


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
    if "power" in whole:
        print_power(whole["power"])
    if "racing" in whole:
        print_racing(whole["racing"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=("sim", "real", "power", "racing", "report"))
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
    parser.add_argument("--candidates", type=int, default=6, help="power: null candidates per patient (3 rounds x 2)")
    parser.add_argument(
        "--confirmations", type=int, default=2, help="power: confirmations a patient's fix loop may run (CONFIRMATIONS)"
    )
    parser.add_argument("--seed-base", type=int, default=5000, help="real: first training seed of trial 0")
    parser.add_argument("--jsonl", default=str(REAL_JSONL), help="real: where trials are appended (resumable)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.part == "report":
        report()
        return
    if args.part == "racing":
        args.trials = args.trials or 2000
        save("racing", run_racing(args))
        return
    if args.part == "power":
        args.trials = args.trials or 2000
        save("power", run_power(args))
        return
    if args.part == "sim":
        args.trials = args.trials or 2000
        save(args.section or "sim", run_sim(args))
    else:
        args.trials = args.trials or 20
        save("real", run_real(args))


if __name__ == "__main__":
    main()
