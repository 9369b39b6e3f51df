"""How many distinct past patients a diagnosis's k nearest cases come from.

Every attempt on one patient stores that patient's signature, so the k nearest cases can all be
one patient's attempts: the vote then hears one past failure, however large the KB. For each
holdout patient (its first-round signature, as ``bench/learning_curve.py`` sees it), search a KB of
the dev attempts (the learning curve's holdout pool, built from ``--cases``) and count the distinct
scenarios among the k nearest cases (the patient's own scenario excluded, as the fix loop does).

    .venv/bin/python bench/neighbour_diversity.py [--k 10] [--kb DIR]

Prints one line per patient and the summary (mean distinct patients, share of patients whose
neighbours are one patient); ``--json`` prints the summary as JSON. Takes a minute or two (embeds
the pool once when ``--kb`` does not exist yet).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from learning_curve import SOURCES, attempts_of, folds, load, patients_of
from run_split import open_kb

from remedy.cases.io import write_cases
from remedy.cases.verify.scenarios import bundled_scenarios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="*", default=list(SOURCES), help="globs of case files (JSONL / Parquet)")
    ap.add_argument("--k", type=int, default=10, help="neighbours a diagnosis retrieves (the fix loop's default)")
    ap.add_argument("--kb", type=Path, default=None, help="a KB of the dev pool to reuse (built here when absent)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    scenarios = {s.name: s for s in bundled_scenarios()}
    cases = load(tuple(args.cases))
    ((_, test, pool),) = folds(patients_of(cases, scenarios), attempts_of(cases), scenarios, "holdout")
    root = args.kb or Path(tempfile.mkdtemp(prefix="remedy-diversity-"))
    export = root.parent / f"{root.name}-pool.jsonl"
    if not export.exists():
        by_id = {c.case_id: c for c in cases}
        write_cases(export, [by_id[i] for a in pool for i in a.case_ids])
    kb = open_kb(root, export)
    counts = []
    for p in test:
        hits = kb.similar(p.signature, k=args.k, exclude_scenario=p.name)
        groups = Counter(h.case.scenario or h.case.case_id for h in hits)
        counts.append(len(groups))
        if not args.json:
            top = ", ".join(f"{n} x{c}" for n, c in groups.most_common(3))
            print(f"{p.name:44s} {len(groups)} distinct in top-{args.k}: {top}")
    summary = {
        "patients": len(counts),
        "pool_attempts": len(pool),
        "k": args.k,
        "mean_distinct": round(sum(counts) / max(len(counts), 1), 2),
        "one_patient_share": round(sum(c == 1 for c in counts) / max(len(counts), 1), 3),
    }
    print(json.dumps(summary) if args.json else f"\n{summary}")


if __name__ == "__main__":
    main()
