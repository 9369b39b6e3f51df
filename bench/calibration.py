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
    confirmation, the new lenient screen + sequential 4/8 confirmation, each change alone, a
    sequential 6/12, and from D6 on designs that spend the per-patient budget for power: 4-6 seed
    screens at one-sided 20-40%, three looks (4/8/12, 6/12/18), 8/16, a one-sided 5% per confirmation;
    ``--designs D1,D16`` runs some of them, each on its own random streams). Per design: the false-``improved`` rate per patient (``--candidates`` null
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
    nice python bench/calibration.py power [--trials 2000] [--designs D1,D6]  # simulation only
    nice python bench/calibration.py racing [--trials 2000]    # simulation only
    python bench/calibration.py report          # print both from bench/out without running anything

Figures go to stdout and to ``bench/out/calibration.json`` (one section per part); ``report`` also
prints the power and racing tables saved there. Each part lives in its own module: ``calibration_sim.py``,
``calibration_real.py``, ``calibration_power.py``, ``calibration_racing.py`` (shared: ``calibration_common.py``).
"""

from __future__ import annotations

import argparse
import json
import os

from calibration_common import JSON_PATH, OUT, REAL_JSONL, fmt
from calibration_power import print_power, run_power
from calibration_racing import print_racing, run_racing
from calibration_real import print_real, run_real
from calibration_sim import run_sim


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
    parser.add_argument(
        "--designs",
        default=None,
        help="power: which designs to run, e.g. D1,D6,D7 (default: all; see the list printed)",
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
