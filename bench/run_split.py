"""Resumable `bench run` over one split, one scenario at a time, each result kept as data.

``remedy bench run`` writes its report when the whole pass ends; on a shared 2-core machine
a pass over a split takes hours, so this script runs the same core (:func:`run_bench`) one
scenario at a time, writes ``<out>/<split>/<scenario>.json`` after each, skips scenarios
already written (resume) and patients `bench build` found not failing, and renders the combined per-split report (with baselines and
oracle solvability) to ``<out>/<split>-report.md`` / ``.json`` from whatever is done.

    .venv/bin/python bench/run_split.py --split holdout --rounds 1 --candidates 1 --seeds 2
    .venv/bin/python bench/run_split.py --split dev --report-only

A run writes its settings (rounds, candidates, seeds, baselines) to ``<out>/<split>/settings.json``;
``--report-only`` renders the report with those, not with the command line's defaults (for a run
made before that file existed, give the run's own flags).

With ``--kb`` the attempts are stored as ``bench`` cases in that KB (diagnoses stay cold:
retrieval sees nothing) and, with ``--export``, the whole KB is written to a JSONL file after
each scenario, the data that `remedy mine`, `remedy optimize` and their tests are built from.
On a fresh machine an empty ``--kb`` is first refilled from ``--export``, so a run resumes:

    .venv/bin/python bench/run_split.py --split dev --candidates 2 --no-baselines \
        --kb bench/out/dev_kb --export reports/kb/dev-cases.jsonl --out reports/kb/runs
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, fields, replace
from pathlib import Path

from remedy.cases.verify.solvability import ORACLE_FILE, latest_results, not_failing
from remedy.kb.bench import (
    BenchReport,
    BenchSettings,
    ScenarioResult,
    run_bench,
    select_scenarios,
    split_summaries,
    summarize,
)
from remedy.kb.bench_report import render_markdown


def _load(path: Path) -> ScenarioResult:
    data = json.loads(path.read_text())
    names = {f.name for f in fields(ScenarioResult)}
    return ScenarioResult(**{k: v for k, v in data.items() if k in names})


def _order(scenarios, oracle_file):
    """Solvable scenarios first (they are the fix-rate denominators), then unchecked, then the rest."""
    records = latest_results(scenarios, oracle_file)

    def rank(s) -> int:
        r = records.get(s.name)
        return 1 if r is None else (0 if r.verdict == "solvable" else 2)

    return sorted(scenarios, key=lambda s: (rank(s), s.name))


def open_kb(path: Path, export: Path | None):
    """The KB at ``path`` (created if new), refilled from ``export`` when it is empty (resume on a fresh machine).

    Two bench processes often open one cell's KB at once (``--reverse``): the open, the refill and a reconcile
    run under one file lock, so the second waits until the first has stored AND indexed every case. Without it
    the second diagnosed its first patient from a half-written index (fewer neighbours, another answer)."""
    import fcntl

    from remedy.kb.facade import KnowledgeBase

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.open.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        kb = KnowledgeBase.open(path, create=True)
        if kb.count() == 0 and export is not None and export.exists():
            print(f"refilled {path} from {export}: {kb.import_file(export).added} cases", flush=True)
        kb.reconcile()  # the index holds every stored case before any diagnosis reads it
    return kb


def export_kb(kb, path: Path) -> None:
    """Rewrite ``path`` as the whole KB in JSONL, atomically (a kill leaves the previous export)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.jsonl")
    kb.export(tmp)
    tmp.replace(path)  # whole or not at all


def run_scenarios(
    chosen, settings, folder: Path, oracle: Path, *, store=None, export=None, retrieval=None, label="cold"
):
    """The fix loop on each scenario not yet written to ``folder`` (nor found not failing), one JSON each.

    ``retrieval`` is the KB diagnoses read (None: cold); attempts go to ``store`` (None: nowhere),
    which is exported whole to ``export`` after each scenario.
    """
    for s in chosen:
        target = folder / f"{s.name}.json"
        with claimed(folder / f".{s.name}.lock") as mine:
            # re-read under the claim: `bench build` or the other process (--reverse) may have written it
            if not mine or target.exists() or s.name in not_failing([s], oracle):
                continue  # running elsewhere, done, or no fault scenario at this budget (it already succeeds)
            report = run_bench(retrieval, [s], settings, store=store, label=label)
            target.write_text(json.dumps(asdict(report.scenarios[0]), indent=2, default=str) + "\n")
            if store is not None and export is not None:
                export_kb(store, export)
        print(f"{label} {s.name}: top1={report.scenarios[0].top1} fixed={report.scenarios[0].fixed}", flush=True)


@contextmanager
def claimed(path: Path) -> Iterator[bool]:
    """Whether this process holds ``path``'s lock (taken without waiting) for the ``with`` block.

    Two processes meeting half-way (``--reverse``) must not run one patient at once: the second would
    empty the first's control cache (``remedy.kb.bench.patient_controls``) and train it twice. A killed
    process's lock goes with it, so a resumed run takes the patient again."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def load_rows(folder: Path, chosen, oracle: Path) -> list[ScenarioResult]:
    """The scenario results written to ``folder``, with solvability as the oracle records say now."""
    names = {s.name for s in chosen}
    done = [_load(p) for p in sorted(folder.glob("*.json")) if p.stem in names]
    records = latest_results(chosen, oracle)  # solvability may have been recorded since
    return [
        replace(
            r,
            solvable=None
            if r.scenario not in records or records[r.scenario].verdict == "error"
            else records[r.scenario].verdict == "solvable",
        )
        for r in done
    ]


def report_of(rows: list[ScenarioResult], settings: BenchSettings, label: str) -> BenchReport:
    """One pass's report from scenario results written one at a time."""
    return BenchReport(
        label=label,
        kb=None,
        settings=settings,
        scenarios=rows,
        summary=summarize(rows),
        started_at="(per scenario)",
        wall_time_s=sum(r.total_wall_time_s for r in rows),
        splits=split_summaries(rows),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", choices=["dev", "holdout"], required=True)
    ap.add_argument("--scenarios", default=None, help="name glob within the split")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--candidates", type=int, default=1)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("bench/data/runs"))
    ap.add_argument("--oracle-results", type=Path, default=ORACLE_FILE)
    ap.add_argument("--kb", type=Path, default=None, help="store the attempts as cases in this KB")
    ap.add_argument("--export", type=Path, default=None, help="JSONL export of --kb after each scenario")
    ap.add_argument("--report-only", action="store_true", help="only render the report from what is done")
    args = ap.parse_args()
    settings = BenchSettings(
        rounds=args.rounds,
        candidates=args.candidates,
        seeds=args.seeds,
        baselines=not args.no_baselines,
        oracle_results=str(args.oracle_results),
    )
    folder = args.out / args.split
    folder.mkdir(parents=True, exist_ok=True)
    saved = folder / "settings.json"
    if args.report_only and saved.exists():
        settings = replace(settings, **json.loads(saved.read_text()))
    elif not args.report_only:
        keep = {k: getattr(settings, k) for k in ("rounds", "candidates", "seeds", "baselines")}
        saved.write_text(json.dumps(keep, indent=1) + "\n")
    chosen = _order(select_scenarios(args.scenarios, split=args.split), args.oracle_results)
    kb = None
    if args.kb is not None and not args.report_only:
        kb = open_kb(args.kb, args.export)
    if not args.report_only:
        run_scenarios(chosen, settings, folder, args.oracle_results, store=kb, export=args.export)
    done = load_rows(folder, chosen, args.oracle_results)
    report = report_of(done, settings, "cold")
    (args.out / f"{args.split}-report.md").write_text(render_markdown(report))
    (args.out / f"{args.split}-report.json").write_text(json.dumps(report.as_dict(), indent=2, default=str) + "\n")
    print(f"{len(done)}/{len(chosen)} scenarios of {args.split} done; report in {args.out}/{args.split}-report.md")


if __name__ == "__main__":
    main()
