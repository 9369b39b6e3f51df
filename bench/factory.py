"""The case factory: the fix loop over the patient zoo, resumable and sharded, its cases shipped in chunks.

A thin script face of :mod:`remedy.kb.factory` (the same as ``remedy bench factory``; same manifest, chunks and
resume). What follows describes the factory; the code lives in the package.

Each *unit* is one patient (a bench scenario) on one *pass*: the fix loop (:func:`remedy.kb.bench.run_bench`,
cold diagnoses, attempts stored as ``bench`` cases) with pass ``p`` screening on training seeds from
``p * 1000`` and drawing its exploration from seed ``p``, so a later pass is another,
independent measurement of the same patients. Patients whose oracle fixes them (``bench/data/oracle.jsonl``)
go first, then unchecked ones, then the unsolvable ones; patients found not failing are skipped.

A share of the candidate slots (``--explore``, default 1 in 5, seeded) goes on purpose to a random
lower-ranked candidate, so the data holds counterfactual negatives and not only the diagnoser's choices;
every case is tagged with how it was chosen (``chosen:diagnosis`` / ``chosen:exploration``, ``rank:N``,
``score:X``). Every confirmation records whether the agent now works (``verification.fixed``,
:mod:`remedy.cases.verify.fixed`) beside ``improved``.

A finished unit's cases wait under ``<out>/pending/`` (not committed); every ``--chunk`` units they become
``<out>/chunk-<shard>-<n>.parquet`` (the KB's Parquet export: ``remedy kb import`` reads it) and an entry in
``<out>/manifest.json`` (git commit, versions, settings, the units, counts of attempts / improved / fixed /
env steps / wall time). A re-run skips every unit already in a chunk or pending (resume); ``--shard i/n``
takes every n-th unit; ``--commit`` commits each chunk (its Parquet and the manifest) as it lands.

    nohup nice -n 5 .venv/bin/python bench/factory.py --commit > /work/notes/factory.log 2>&1 &
    .venv/bin/python bench/factory.py --status
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from remedy.cases.verify.solvability import ORACLE_FILE
from remedy.kb.factory import OUT, FactoryPlan, factory_settings, run_plan, status, todo_units


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default=None, help="name glob of the zoo (default: every bundled scenario)")
    ap.add_argument(
        "--split",
        default="all",
        help="all, dev, holdout, lofo:<family> (that family only) or lofo-train:<family> (every other family)",
    )
    ap.add_argument("--passes", type=int, default=1, help="passes over the zoo (each on its own seed block)")
    ap.add_argument("--shard", default=None, help="i/n: every n-th unit from the i-th")
    ap.add_argument("--chunk", type=int, default=4, help="units per committed chunk")
    ap.add_argument("--max-units", type=int, default=None, help="stop after this many units (this run)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--candidates", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=2, help="training seeds per arm of a screen")
    ap.add_argument(
        "--confirm-seeds", type=int, default=None, help="seeds per arm of a confirmation (default: the fix loop's)"
    )
    ap.add_argument("--explore", type=float, default=0.2, help="share of candidate slots given to a lower-ranked one")
    ap.add_argument("--no-race", action="store_true")
    ap.add_argument("--executor", default="local", choices=["local", "ray"])
    ap.add_argument("--ray-address", default=None)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--oracle-results", type=Path, default=ORACLE_FILE)
    ap.add_argument("--commit", action="store_true", help="git-commit each chunk (Parquet + manifest) as it lands")
    ap.add_argument("--status", action="store_true", help="print the manifest's totals and what is pending, and stop")
    ap.add_argument("--build-first", action="store_true", help="train every zoo patient not yet built, first")
    ap.add_argument(
        "--check-oracle", action="store_true", help="check a patient's oracle before its first unit, if unrecorded"
    )
    ap.add_argument(
        "--oracle-cases",
        action="store_true",
        help="only re-run the oracle check of every solvable patient whose oracle attempts are not kept yet",
    )
    ap.add_argument("--dry-run", action="store_true", help="list this shard's units still to run, and stop")
    args = ap.parse_args(argv)
    if args.status:
        return print(json.dumps(status(args.out, args.oracle_results), indent=1))
    plan = FactoryPlan(
        scenarios=args.scenarios,
        split=args.split,
        passes=args.passes,
        shard=args.shard,
        chunk=args.chunk,
        max_units=args.max_units,
        out=args.out,
        oracle_results=args.oracle_results,
        commit=args.commit,
        build_first=args.build_first,
        check_oracle=args.check_oracle,
        oracle_cases=args.oracle_cases,
        executor=args.executor,
        ray_address=args.ray_address,
    )
    if args.dry_run:
        todo = todo_units(plan)
        return print("\n".join(todo) + f"\n{len(todo)} unit(s) to run")
    settings = factory_settings(
        rounds=args.rounds,
        candidates=args.candidates,
        seeds=args.seeds,
        confirm_seeds=args.confirm_seeds,
        explore=args.explore,
        race=not args.no_race,
        executor=args.executor,
        oracle_results=args.oracle_results,
    )
    print(json.dumps(run_plan(plan, settings), indent=1))


if __name__ == "__main__":
    from remedy.cases.errors import RemedyError

    try:
        main()
    except RemedyError as err:  # bad input: one line, non-zero exit
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
