"""The meta-learning curve on holdout in three columns: cold, warm, warm + optimized program.

- **cold**: an empty KB; diagnoses see the built-in priors only. Its attempts are stored in
  ``<work>/cold_kb`` and exported to ``reports/kb/holdout-cases.jsonl`` (the holdout data for
  `remedy mine`).
- **warm**: retrieval reads a KB of the dev scenarios' verified cases (``reports/kb/dev-cases.jsonl``,
  what `bench/run_split.py --split dev --kb` filled); nothing of holdout is in it.
- **opt**: the same KB, plus the program `remedy optimize --backend offline` promoted on it (tuned on
  dev cases only; its validation split is dev groups too).
- **baselines**: the no-diagnosis fixing arms (RL Zoo tuned defaults, seeded random search) at the
  same candidate count and per-candidate budget; they do not depend on the KB, so they run once.

Every column is resumable: one JSON per scenario under ``<out>/<column>/``, scenarios already
written are skipped, and KBs are rebuilt from the committed exports on a fresh machine. Warm
attempts go to a separate store, never to the KB retrieval reads, so every holdout scenario sees
the same dev KB whatever the order. Each column's control arms are cached beside its own store
(as a user's would be), so env steps are comparable across columns.

    .venv/bin/python bench/curve.py --column cold      # then warm, opt, baselines
    .venv/bin/python bench/curve.py --report-only      # render <out>/holdout-curve.md from what is done
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from run_split import _order, load_rows, open_kb, report_of, run_scenarios

from remedy.cases.verify.scenarios import build
from remedy.cases.verify.solvability import ORACLE_FILE, not_failing
from remedy.kb.bench import BenchSettings, _baselines, select_scenarios
from remedy.kb.bench_report import render_passes

COLUMNS = ("cold", "warm", "opt")
DEV_EXPORT = Path("reports/kb/dev-cases.jsonl")


def _retrieval_kb(work: Path, column: str, trials: int, seed: int, out: Path):
    """The dev KB retrieval reads for ``warm`` / ``opt`` (``opt``: with the promoted offline program)."""
    kb = open_kb(work / f"{column}_retrieval_kb", DEV_EXPORT)
    if column == "opt" and not (out / "opt-program.json").exists():
        remedy = str(Path(sys.executable).parent / "remedy")  # the CLI a user would run
        cmd = [remedy, "optimize", "--kb", str(kb.root), "--backend", "offline"]
        cmd += ["--trials", str(trials), "--seed", str(seed), "--reports", str(out), "--json"]
        result = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        (out / "opt-program.json").write_text(json.dumps(result, indent=2) + "\n")
        print(f"optimize: {result.get('message')}", flush=True)
    return kb


def _run_baselines(chosen, settings: BenchSettings, folder: Path, oracle: Path) -> None:
    """The no-diagnosis arms per scenario (one JSON each: arm -> BaselineFix)."""
    for s in chosen:
        target = folder / f"{s.name}.json"
        if target.exists() or s.name in not_failing([s], oracle):
            continue
        arms = _baselines(s, build(s), settings, None)
        target.write_text(json.dumps(arms, indent=2, default=str) + "\n")
        print(f"baselines {s.name}: " + ", ".join(f"{a}={v.get('fixed')}" for a, v in arms.items()), flush=True)


def _report(chosen, settings: BenchSettings, out: Path, oracle: Path) -> Path:
    arms = {p.stem: json.loads(p.read_text()) for p in sorted((out / "baselines").glob("*.json"))}
    passes = []
    for column in COLUMNS:
        rows = load_rows(out / column, chosen, oracle)
        rows = [replace(r, baselines=arms.get(r.scenario)) for r in rows]
        passes.append(report_of(rows, settings, column))
    out.mkdir(parents=True, exist_ok=True)
    path = out / "holdout-curve.md"
    path.write_text(render_passes(passes, "Meta-learning curve on holdout: cold, warm, warm + optimized"))
    data = {p.label: p.as_dict() for p in passes}
    (out / "holdout-curve.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    for p in passes:
        print(f"{p.label}: {len(p.scenarios)}/{len(chosen)} scenarios done", flush=True)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--column", choices=[*COLUMNS, "baselines"], default=None)
    ap.add_argument("--split", choices=["dev", "holdout"], default="holdout")
    ap.add_argument("--scenarios", default=None, help="name glob within the split")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--candidates", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--trials", type=int, default=200, help="offline optimizer trials (opt column)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the optimizer's split and search")
    ap.add_argument("--out", type=Path, default=Path("reports/kb/curve"))
    ap.add_argument("--work", type=Path, default=Path("bench/out/curve"), help="KBs and control caches")
    ap.add_argument("--oracle-results", type=Path, default=ORACLE_FILE)
    ap.add_argument(
        "--race", action=argparse.BooleanOptionalAction, default=False,
        help="race each round's candidates (the committed curve ran without racing, before it existed)",
    )  # fmt: skip
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    settings = BenchSettings(
        rounds=args.rounds,
        candidates=args.candidates,
        seeds=args.seeds,
        baselines=False,
        oracle_results=str(args.oracle_results),
        race=args.race,
    )
    chosen = _order(select_scenarios(args.scenarios, split=args.split), args.oracle_results)
    if not args.report_only and args.column is None:
        ap.error("pass --column cold|warm|opt|baselines, or --report-only")
    if not args.report_only:
        folder = args.out / args.column
        folder.mkdir(parents=True, exist_ok=True)
        if args.column == "baselines":
            _run_baselines(chosen, replace(settings, baselines=True), folder, args.oracle_results)
        else:
            export = (
                Path("reports/kb")
                / f"{args.split}-{'cases' if args.column == 'cold' else args.column + '-cases'}.jsonl"
            )
            store = open_kb(args.work / f"{args.column}_kb", export)
            retrieval = None
            if args.column != "cold":
                retrieval = _retrieval_kb(args.work, args.column, args.trials, args.seed, args.out)
            run_scenarios(
                chosen, settings, folder, args.oracle_results,
                store=store, export=export, retrieval=retrieval, label=args.column,
            )  # fmt: skip
    print(f"report: {_report(chosen, settings, args.out, args.oracle_results)}")


if __name__ == "__main__":
    main()
