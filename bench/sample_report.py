"""The sample heuristics report, straight from a JSONL export of bench cases (no KB, no bench re-run).

Mines the exported cases (``miners.mine.mine``, same seed → same rules) and writes the report
(``miners.report.write_report``) that ``remedy report`` would write for a KB holding those cases
and the mined rules, all ``proposed`` (nobody has reviewed them). Prints the paths, the rule
counts and how long mining and rendering took:

    .venv/bin/python bench/sample_report.py --cases reports/kb/dev-cases.jsonl --out reports/ --date 2026-12-03
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from pathlib import Path

from remedy.cases.io import read_cases
from remedy.miners.report import write_report


def main() -> None:
    """Parse the arguments, mine, render, print."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=Path, default=Path("reports/kb/dev-cases.jsonl"), help="JSONL export of cases")
    ap.add_argument("--out", type=Path, default=Path("bench/out/sample-report"), help="report directory")
    ap.add_argument("--date", type=dt.date.fromisoformat, default=None, help="YYYY-MM-DD (default today)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-support", type=int, default=3)
    ap.add_argument("--fdr", type=float, default=0.1)
    args = ap.parse_args()
    from remedy.miners.mine import mine  # the miner's branch; imported here so --help works without it

    cases, problems = read_cases(args.cases)
    t0 = time.perf_counter()
    result = mine(cases, min_support=args.min_support, fdr=args.fdr, seed=args.seed)
    t1 = time.perf_counter()
    paths = write_report(
        result.rules,
        {c.case_id: c for c in cases},
        args.out,
        date=args.date,
        seed=args.seed,
        kb_label=f"{args.cases} (export)",
        verified_cases=sum(c.verification is not None for c in cases),
    )
    t2 = time.perf_counter()
    print(
        f"{len(cases)} cases ({len(problems)} unreadable), {result.n_tested} candidates tested, {len(result.rules)} kept"
    )
    print(f"mining {t1 - t0:.2f} s, rendering {t2 - t1:.2f} s ({len(paths.plots)} plots)")
    print(paths.markdown)
    print(paths.html)


if __name__ == "__main__":
    main()
