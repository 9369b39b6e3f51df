"""Calibration (c) ``power``: whole verification designs side by side under A/A noise models and fix-sized
effects, simulated (``bench/calibration.py power``)."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np
from calibration_common import rate

from remedy.cases.verify.stats import SequentialDesign


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
    """D1..D5: the shipped design, the sequential 4/8 one, each change alone, and the sequential design at 12
    seeds; D6..: designs that spend the per-patient budget left over for power (a 4-seed screen, three looks
    4/8/12, a one-sided 5% per confirmation). Their order is fixed: a design's random streams follow its place."""
    fixed8, seq8 = SequentialDesign(looks=(8,), futility=False), SequentialDesign(looks=(4, 8))
    three, three5 = SequentialDesign(looks=(4, 8, 12)), SequentialDesign(looks=(4, 8, 12), alpha=0.05)
    return [
        Design("shipped: screen 3 @10%, confirm 8 @2.5%", 3, 0.10, fixed8),
        Design("new: screen 3 @20%, sequential 4/8 (Pocock, futility)", 3, 0.20, seq8),
        Design("screen 3 @10%, sequential 4/8", 3, 0.10, seq8),
        Design("screen 3 @20%, confirm 8 @2.5%", 3, 0.20, fixed8),
        Design("screen 3 @20%, sequential 6/12 (--confirm-seeds 12)", 3, 0.20, SequentialDesign(looks=(6, 12))),
        Design("screen 4 @20%, sequential 4/8/12 @2.5% (Pocock)", 4, 0.20, three),
        Design("screen 4 @20%, sequential 4/8/12 @5% (Pocock)", 4, 0.20, three5),
        Design("screen 4 @30%, sequential 4/8/12 @5% (Pocock)", 4, 0.30, three5),
        Design("screen 3 @20%, sequential 4/8/12 @5% (Pocock)", 3, 0.20, three5),
        Design(
            "screen 4 @20%, sequential 4/8/12 @5% (O'Brien-Fleming)",
            4,
            0.20,
            SequentialDesign(looks=(4, 8, 12), alpha=0.05, spending="obrien_fleming"),
        ),
        Design("screen 4 @20%, sequential 6/12 @5% (Pocock)", 4, 0.20, SequentialDesign(looks=(6, 12), alpha=0.05)),
        Design("screen 4 @30%, sequential 8/16 @2.5% (Pocock)", 4, 0.30, SequentialDesign(looks=(8, 16))),
        Design("screen 6 @20%, sequential 8/16 @2.5% (Pocock)", 6, 0.20, SequentialDesign(looks=(8, 16))),
        Design(
            "screen 4 @30%, sequential 4/8/12/16 @5% (Pocock)",
            4,
            0.30,
            SequentialDesign(looks=(4, 8, 12, 16), alpha=0.05),
        ),
        Design("screen 4 @30%, sequential 6/12/18 @2.5% (Pocock)", 4, 0.30, SequentialDesign(looks=(6, 12, 18))),
        Design("screen 4 @35%, sequential 6/12/18 @2.5% (Pocock)", 4, 0.35, SequentialDesign(looks=(6, 12, 18))),
        Design("screen 4 @40%, sequential 6/12/18 @2.5% (Pocock)", 4, 0.40, SequentialDesign(looks=(6, 12, 18))),
        Design("screen 4 @35%, sequential 8/16 @2.5% (Pocock)", 4, 0.35, SequentialDesign(looks=(8, 16))),
    ]


def chosen(spec: str | None) -> list[tuple[int, Design]]:
    """The designs ``--designs`` names (``D1,D6``; all by default), each with its place in :func:`designs`."""
    every = list(enumerate(designs()))
    if not spec:
        return every
    try:
        picks = [int(tok.strip().upper().removeprefix("D")) for tok in spec.split(",") if tok.strip()]
    except ValueError:
        picks = []
    if not picks or any(not 1 <= k <= len(every) for k in picks):
        raise SystemExit(f"--designs: a comma list of D1..D{len(every)} (e.g. D1,D6), got {spec!r}")
    return [every[k - 1] for k in picks]


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
    picked = chosen(getattr(args, "designs", None))
    ds = [d for _, d in picked]
    start = time.perf_counter()
    out: dict = {
        "trials": args.trials,
        "seed": args.seed,
        "candidates": args.candidates,
        "confirmations": args.confirmations,
        "designs": [d.name for d in ds],
        "labels": [f"D{j + 1}" for j, _ in picked],
        "nulls": {},
        "effects": {},
    }
    for i, (name, null) in enumerate(NULLS.items()):
        row = {}
        for j, d in picked:
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
        for j, d in picked:
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
    short = out.get("labels") or [f"D{k + 1}" for k in range(len(names))]  # saved before --designs: D1..Dn
    n, c = out["candidates"], out["confirmations"]
    print(f"\nDesigns (screen seeds @ one-sided level; confirmation on fresh seeds), {out['trials']} trials a cell:")
    for label, name in zip(short, names, strict=True):
        print(f"  {label} = {name}")
    rename = lambda rows: {key: {lb: row[nm] for lb, nm in zip(short, names, strict=True)} for key, row in rows.items()}  # noqa: E731
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
