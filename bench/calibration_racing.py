"""Calibration (d) ``racing``: how often stage 1 of a race drops a slow-acting fix or a candidate that does
nothing or harms, simulated (``bench/calibration.py racing``)."""

from __future__ import annotations

import argparse
import itertools

import numpy as np
from calibration_common import rate
from calibration_power import NoiseModel

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
