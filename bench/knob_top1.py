"""One vote knob, on and off, at 100% of the training pool: top-1 cause and the top candidate's family.

The learning curve's diagnosis-only measure (``bench/learning_curve.py``: the same pool, splits, retrieval by
past failure and answer keys) at its 100% point, for the shipped vote against the vote with ``--set`` knobs
changed, paired over the same patients (95% bootstrap), beside the empty KB. Minutes, not hours: use it to
see what one knob does before rerunning the fix loops.

    .venv/bin/python bench/knob_top1.py --set budget_failure_reach=none
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import learning_curve as lc

from remedy.cases.verify.scenarios import bundled_scenarios


def parse_set(items: list[str]) -> dict[str, object]:
    """``name=value`` pairs: JSON values, ``none`` for None."""
    out: dict[str, object] = {}
    for item in items:
        name, _, raw = item.partition("=")
        if not name or not _:
            raise SystemExit(f"--set {item!r}: write name=value, e.g. budget_failure_reach=none")
        if name not in lc.OfflineSettings.model_fields:
            raise SystemExit(f"--set {name}: not an OfflineSettings knob")
        try:
            out[name] = None if raw.lower() == "none" else json.loads(raw)
        except json.JSONDecodeError:
            raise SystemExit(f'--set {item!r}: the value is not JSON (numbers, true/false, "text", none)') from None
    return out


def paired(a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> str:
    d = a - b
    lo, hi = lc.bootstrap(d, rng)
    return f"{d.mean():+.2f} [{lo:+.2f}, {hi:+.2f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", nargs="+", required=True, help="knobs of the changed vote, name=value (none: None)")
    ap.add_argument("--cases", nargs="*", default=list(lc.SOURCES), help="globs of case files (JSONL / Parquet)")
    ap.add_argument("--show", action="store_true", help="print every patient whose answer changed")
    args = ap.parse_args()
    changes = parse_set(args.set)
    scenarios = {s.name: s for s in bundled_scenarios()}
    cases = lc.load(tuple(args.cases))
    attempts = lc.attempts_of(cases)
    patients = lc.patients_of(cases, scenarios)
    retrieval = lc.Retrieval(cases, patients)
    fixes = lc.fixed_families(attempts)
    rng = np.random.default_rng(0)
    print(f"{len(attempts)} attempts, {len(patients)} patients; changed vote: {changes}\n")
    print("| split | measure | patients | shipped | changed | empty KB | shipped − changed [95% CI] |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for split in ("holdout", "lofo"):
        top, fam = [], []
        for _, test, pool in lc.folds(patients, attempts, scenarios, split):
            ids = sorted({retrieval.index[i] for a in pool for i in a.case_ids})
            for p in test:
                near = retrieval.similar(p, ids)
                arms = (lc.top1(p, near, None), lc.top1(p, near, None, changes=changes), lc.top1(p, (), None))
                top.append([hit for hit, _ in arms])
                if p.name in fixes:
                    fam.append([float(f in fixes[p.name]) for _, f in arms])
                if args.show and arms[0] != arms[1]:
                    print(f"  {split} {p.name}: shipped {arms[0]}, changed {arms[1]}", file=sys.stderr)
        for measure, rows in (("top-1 cause", top), ("top candidate's family fixes", fam)):
            x = np.array(rows, dtype=float)
            print(f"| {split} | {measure} | {len(x)} | {x[:, 0].mean():.2f} | {x[:, 1].mean():.2f} | "
                  f"{x[:, 2].mean():.2f} | {paired(x[:, 0], x[:, 1], rng)} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
