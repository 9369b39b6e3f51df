"""The bench verbs: `remedy bench build` (build the fault-scenario patients, check each fails and its oracle
fixes it) and `remedy bench run|curve` (the fix loop on each scenario, scored; cold then warm).
`remedy bench factory` lives in `factory.py`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import TaskID
from rich.table import Table

from remedy.cases.errors import KBPathError

from .common import (
    DEFAULT_KB,
    JsonOption,
    KbOption,
    ScreenConfidenceOption,
    add_columns,
    console,
    print_json,
    progress_bar,
)
from .diagnose import (
    BudgetOption,
    CandidatesOption,
    ConfirmSeedsOption,
    DiagnoserOption,
    ExecutorOption,
    RaceFractionOption,
    RaceOption,
    RaceSeedsOption,
    RoundsOption,
    ScenariosOption,
    SeedsOption,
    _backend,
    _Live,
    _race,
)

__all__ = ["bench_build", "build_cmd", "bench_run", "bench_curve"]

#: console width from which the table shows the fault text.
_WIDE = 130


def _row(b) -> dict:
    s = b.scenario
    return {
        "scenario": s.name,
        "env_id": s.env_id,
        "algo": s.algo,
        "fault": s.fault,
        "train_steps": s.train_steps,
        "wall_time_s": round(b.wall_time_s, 2),
        "cached": b.cached,
        "source": b.source,
        "success_rate": b.success_rate,
        "run_dir": str(b.run.path),
        "quick": s.quick,
        "split": s.split,
    }


def _done_row(s, r) -> dict:
    """A scenario whose oracle check is already recorded: not rebuilt (resume)."""
    return {
        "scenario": s.name,
        "env_id": s.env_id,
        "algo": s.algo,
        "fault": s.fault,
        "train_steps": s.train_steps,
        "wall_time_s": r.wall_time_s,
        "cached": True,
        "source": "recorded",
        "success_rate": r.patient_success,
        "run_dir": None,
        "quick": s.quick,
        "split": s.split,
        "verdict": r.verdict,
        "oracle_status": r.oracle_status,
    }


def _table(rows: list[dict]) -> Table:
    t = Table(title="fault scenarios", show_lines=False)
    widest = max((len(r["scenario"]) for r in rows), default=8)
    wide = console.width >= _WIDE  # the fault text only where it fits; --json always has it
    columns: list[tuple[str, dict[str, Any]]] = [
        ("scenario", {"no_wrap": True, "min_width": widest}),
        ("env", {"no_wrap": True}),
        ("fault", {"overflow": "ellipsis", "no_wrap": True, "max_width": console.width - 120}),
        ("split", {"no_wrap": True}),
        ("steps", {"justify": "right", "no_wrap": True}),
        ("wall s", {"justify": "right", "no_wrap": True}),
        ("cached?", {"no_wrap": True}),
        ("success", {"justify": "right", "no_wrap": True}),
        ("oracle", {"no_wrap": True}),
    ]
    add_columns(t, [c for c in columns if c[0] != "fault" or wide])
    for r in rows:
        success = "-" if r["success_rate"] is None else f"{r['success_rate']:.0%}"
        cached = r["source"] if r["cached"] else "no"
        cells = [
            r["scenario"],
            r["env_id"],
            r["fault"],
            r["split"],
            f"{r['train_steps']:,}",
            f"{r['wall_time_s']:.1f}",
            cached,
            success,
            r.get("verdict") or "-",
        ]
        t.add_row(*(cells if wide else cells[:2] + cells[3:]))
    return t


def _check(s, built, settings, results, force, cache) -> dict:
    """Verify ``s``'s oracle (the patient is built already) and add the verdict to its row."""
    from remedy.cases.verify.solvability import check_scenarios

    row = _row(built)
    done = check_scenarios([s], settings, results=results, force=force, cache_dir=cache)
    if done:
        row.update(verdict=done[0].verdict, oracle_status=done[0].oracle_status)
    return row


def bench_build(
    scenarios: str | None,
    force: bool,
    cache: Path | None,
    quick: bool,
    as_json: bool,
    *,
    oracle: bool = True,
    shard: str | None = None,
    results: Path | None = None,
    seeds: int = 3,
    workers: int = 1,
    confirm_seeds: int = 8,
    screen_confidence: float = 0.8,
) -> list[dict]:
    """Build the selected scenarios (this shard's), check each patient fails and its oracle fixes it; render."""
    from remedy.cases.verify.scenarios import build_scenario, load_scenarios
    from remedy.cases.verify.solvability import (
        ORACLE_FILE,
        OracleSettings,
        by_cost,
        latest_results,
        parse_shard,
        shard_of,
    )

    selected = [s for s in load_scenarios(scenarios) if s.quick or not quick]
    chosen = shard_of(by_cost(selected, seeds) if oracle else selected, parse_shard(shard))
    settings = OracleSettings(
        seeds=seeds, confirm_seeds=confirm_seeds, workers=workers, screen_confidence=screen_confidence
    )
    results = results or ORACLE_FILE
    done = {} if (force or not oracle) else latest_results(chosen, results, settings)
    rows: list[dict] = []
    with progress_bar(to=console, disable=as_json) as bar:
        overall = bar.add_task("scenarios", total=len(chosen))
        for s in chosen:
            if s.name in done and done[s.name].verdict != "error":
                rows.append(_done_row(s, done[s.name]))
                bar.advance(overall)
                continue
            step = bar.add_task(f"  {s.name}", total=s.train_steps)

            def on_progress(done_: int, total: int, t: TaskID = step) -> None:
                bar.update(t, completed=done_, total=total)

            built = build_scenario(s, cache, force=force, progress=on_progress)
            bar.update(step, description=f"  {s.name}: oracle", completed=s.train_steps)
            rows.append(_check(s, built, settings, results, force, cache) if oracle else _row(built))
            bar.update(step, visible=False)
            bar.advance(overall)
    if as_json:
        print_json(rows)
    else:
        console.print(_table(rows))
    return rows


def build_cmd(
    scenarios: Annotated[
        str | None,
        typer.Option(
            "--scenarios", help="Name glob over the bundled scenarios ('cartpole_*'), or a YAML file/dir/path glob."
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Retrain and re-check even when a build or record exists.")
    ] = False,
    cache: Annotated[
        Path | None, typer.Option("--cache", help="Build cache directory (default ~/.cache/remedy/scenarios).")
    ] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Only the quick default subset.")] = False,
    oracle: Annotated[
        bool,
        typer.Option("--oracle/--no-oracle", help="Check each patient fails and its oracle patch fixes it (verified)."),
    ] = True,
    shard: Annotated[
        str | None,
        typer.Option("--shard", help="Only shard i of n ('1/2'): every n-th scenario; run the shards in parallel."),
    ] = None,
    results: Annotated[
        Path | None,
        typer.Option("--results", help="Oracle results file (JSONL, appended; default bench/data/oracle.jsonl)."),
    ] = None,
    seeds: Annotated[
        int,
        typer.Option("--seeds", min=2, help="Seeds per arm for the oracle's screen."),
    ] = 3,
    confirm_seeds: Annotated[
        int, typer.Option("--confirm-seeds", min=2, help="Seeds per arm of the oracle's confirmation (the fix loop's).")
    ] = 8,
    screen_confidence: ScreenConfidenceOption = 0.8,
    workers: Annotated[int, typer.Option("--workers", min=1, help="Verification jobs run at once.")] = 1,
    as_json: JsonOption = False,
) -> None:
    """Train the fault-scenario patients (cached by hash), check each fails and its oracle fixes it (resumable)."""
    bench_build(
        scenarios,
        force,
        cache,
        quick,
        as_json,
        oracle=oracle,
        shard=shard,
        results=results,
        seeds=seeds,
        workers=workers,
        confirm_seeds=confirm_seeds,
        screen_confidence=screen_confidence,
    )


def _bench_settings(
    diagnoser,
    rounds,
    candidates,
    seeds,
    budget,
    executor,
    baselines=False,
    oracle_results=None,
    race=None,
    confirm_seeds=8,
):
    from remedy.kb.bench import BenchSettings

    race = race or _race(True, 1 / 3, 2)
    return BenchSettings(
        race=race.enabled,
        race_fraction=race.fraction,
        race_seeds=race.seeds,
        diagnoser=diagnoser,
        rounds=rounds,
        candidates=candidates,
        seeds=seeds,
        confirm_seeds=confirm_seeds,
        budget=budget,
        executor=executor,
        baselines=baselines,
        oracle_results=None if oracle_results is None else str(oracle_results),
    )


def _split_table(reports) -> Table:
    """Per split: Remedy's accuracy and fix rate next to the baselines'."""
    t = Table(title="Per split, with baselines", title_justify="left")
    for col in (
        "split",
        "pass",
        "n",
        "top-1",
        "top-3",
        "improved rate (solvable)",
        "fixed rate (agent works)",
        "budget-only / other",
        "baseline top-1 / top-3",
        "baseline fix rates",
        "unsolvable",
    ):
        t.add_column(col, overflow="fold")
    for r in reports:
        for x in r.splits:
            arms = ", ".join(f"{a} {v:.0%}" for a, v in sorted(x.baseline_fix_rates.items())) or "not run"
            t.add_row(
                x.split,
                r.label,
                str(x.n),
                f"{x.top1_accuracy:.0%}",
                f"{x.top3_accuracy:.0%}",
                f"{x.fix_rate:.0%} of {x.fix_denominator}",
                f"{x.works_rate:.0%} of {x.fix_denominator}",
                f"{x.budget_only_fix_rate:.0%} / {x.other_fix_rate:.0%}",
                f"{x.baseline_top1:.0%} / {x.baseline_top3:.0%}",
                arms,
                ", ".join(x.unsolvable) or "-",
            )
    return t


def _bench_table(reports) -> Table:
    """Overall figures, one column per pass."""
    t = Table(title="Overall", title_justify="left")
    t.add_column("figure")
    for r in reports:
        t.add_column(r.label, justify="right")

    def pct(x):
        return f"{x:.0%}"

    def num(spec):
        return lambda x: "-" if x is None else format(x, spec)

    for name, attr, fmt in (
        ("scenarios", "n", str),
        ("top-1 accuracy", "top1_accuracy", pct),
        ("top-3 accuracy", "top3_accuracy", pct),
        ("confirmed-improved rate", "fix_rate", pct),
        ("fixed rate (the agent now works)", "works_rate", pct),
        ("attempts to fix (mean)", "mean_attempts_to_fix", num(".2f")),
        ("env steps to fix (mean)", "mean_env_steps_to_fix", num(",.0f")),
        ("wall s to fix (mean)", "mean_wall_time_to_fix_s", num(".0f")),
        ("candidates stopped early (race)", "stopped_early", str),
        ("total env steps", "total_env_steps", num(",")),
        ("total wall s", "total_wall_time_s", num(".0f")),
    ):
        t.add_row(name, *[fmt(getattr(r.summary, attr)) for r in reports])
    return t


def _scenario_table(report) -> Table:
    t = Table(title=f"Scenarios ({report.label})", title_justify="left")
    for col in (
        "scenario",
        "ground truth",
        "first diagnosis",
        "top-1",
        "top-3",
        "improved",
        "fixed (works)",
        "attempts",
        "env steps to fix",
        "wall s to fix",
        "winning patch",
    ):
        t.add_column(col, overflow="fold")

    def yes(b):
        return "[green]yes[/]" if b else "[red]no[/]"

    for r in report.scenarios:
        diag = ", ".join(r.first_causes[:3]) or (f"[red]{r.error}[/]" if r.error else "-")
        t.add_row(
            r.scenario,
            ", ".join(r.ground_truth),
            diag,
            yes(r.top1),
            yes(r.top3),
            yes(r.fixed),
            "-" if r.works is None else yes(r.works),
            f"{r.attempts_to_fix or '-'}/{r.attempts}",
            "-" if r.env_steps_to_fix is None else f"{r.env_steps_to_fix:,}",
            "-" if r.wall_time_to_fix_s is None else f"{r.wall_time_to_fix_s:.0f}",
            r.winning_patch or "-",
        )
    return t


QuickOption = Annotated[bool, typer.Option("--quick", help="Only the quick default subset (shipped checkpoints).")]
ReportsOption = Annotated[Path, typer.Option("--reports", help="Where the JSON and Markdown reports go.")]
CacheOption = Annotated[
    Path | None, typer.Option("--cache", help="Scenario build cache (default ~/.cache/remedy/scenarios).")
]
SplitOption = Annotated[
    str,
    typer.Option(
        "--split",
        help="dev, holdout or all (each reported separately); lofo:<family> (one fault family) or "
        "lofo-train:<family> (all the others).",
    ),
]
BaselinesOption = Annotated[
    bool,
    typer.Option(
        "--baselines/--no-baselines", help="Also run the no-diagnosis fixing arms (RL Zoo defaults, random search)."
    ),
]
OracleOption = Annotated[
    Path | None,
    typer.Option(
        "--oracle-results", help="Oracle solvability records (default bench/data/oracle.jsonl, from `bench build`)."
    ),
]


def bench_run(
    scenarios: ScenariosOption = None,
    diagnoser: DiagnoserOption = "offline",
    rounds: RoundsOption = 3,
    candidates: CandidatesOption = 2,
    seeds: SeedsOption = 3,
    confirm_seeds: ConfirmSeedsOption = 8,
    budget: BudgetOption = None,
    executor: ExecutorOption = "local",
    cold: Annotated[bool, typer.Option("--cold", help="Diagnose against an empty KB (built-in priors only).")] = False,
    quick: QuickOption = False,
    split: SplitOption = "all",
    baselines: BaselinesOption = True,
    oracle_results: OracleOption = None,
    reports: ReportsOption = Path("reports/bench"),
    cache: CacheOption = None,
    race: RaceOption = True,
    race_fraction: RaceFractionOption = 1 / 3,
    race_seeds: RaceSeedsOption = 2,
    kb: KbOption = Path(DEFAULT_KB),
    as_json: JsonOption = False,
) -> None:
    """Run the fix loop on each fault scenario; score accuracy and fix rate per split, next to baselines."""
    from remedy.kb.bench import run_bench, select_scenarios
    from remedy.kb.bench_report import write_report
    from remedy.kb.facade import KnowledgeBase

    racing = _race(race, race_fraction, race_seeds)
    chosen = select_scenarios(scenarios, quick, split)
    settings = _bench_settings(
        diagnoser, rounds, candidates, seeds, budget, executor, baselines, oracle_results, racing, confirm_seeds
    )
    _backend(diagnoser)
    with KnowledgeBase.open(kb, create=True) as base, _Live(disable=as_json) as live:
        report = run_bench(
            None if cold else base,
            chosen,
            settings,
            store=base,
            label="cold" if cold else "kb",
            cache_dir=cache,
            progress=live.scenario,
        )
    paths = write_report(report, reports)
    if as_json:
        print_json({**report.as_dict(), "written": [str(p) for p in paths]})
        return
    console.print(_scenario_table(report))
    console.print(_split_table([report]))
    console.print(_bench_table([report]))
    console.print("wrote " + ", ".join(str(p) for p in paths), highlight=False, soft_wrap=True)


def bench_curve(
    scenarios: ScenariosOption = None,
    diagnoser: DiagnoserOption = "offline",
    rounds: RoundsOption = 3,
    candidates: CandidatesOption = 2,
    seeds: SeedsOption = 3,
    confirm_seeds: ConfirmSeedsOption = 8,
    budget: BudgetOption = None,
    executor: ExecutorOption = "local",
    quick: QuickOption = False,
    split: SplitOption = "all",
    baselines: BaselinesOption = True,
    oracle_results: OracleOption = None,
    reports: ReportsOption = Path("reports/bench"),
    cache: CacheOption = None,
    keep: Annotated[
        Path | None,
        typer.Option("--keep-kb", help="Keep the curve's KB (cold and warm cases) here instead of a temporary folder."),
    ] = None,
    race: RaceOption = True,
    race_fraction: RaceFractionOption = 1 / 3,
    race_seeds: RaceSeedsOption = 2,
    as_json: JsonOption = False,
) -> None:
    """The meta-learning curve: the suite cold (empty KB), then warm (KB of the other scenarios' cold cases)."""
    import tempfile

    from remedy.kb.bench import run_curve, select_scenarios
    from remedy.kb.bench_report import write_report
    from remedy.kb.facade import KnowledgeBase

    racing = _race(race, race_fraction, race_seeds)
    chosen = select_scenarios(scenarios, quick, split)
    settings = _bench_settings(
        diagnoser, rounds, candidates, seeds, budget, executor, baselines, oracle_results, racing, confirm_seeds
    )
    _backend(diagnoser)
    with tempfile.TemporaryDirectory(prefix="remedy-curve-") as tmp:
        where = keep if keep is not None else Path(tmp) / "kb"
        with KnowledgeBase.open(where, create=True) as work, _Live(disable=as_json) as live:
            if work.count():
                raise KBPathError(f"--keep-kb {where} already holds cases; the cold pass needs an empty KB")
            curve = run_curve(chosen, settings, work_kb=work, cache_dir=cache, progress=live.scenario)
    paths = write_report(curve, reports)
    if as_json:
        print_json({**curve.as_dict(), "written": [str(p) for p in paths]})
        return
    console.print(_scenario_table(curve.cold))
    console.print(_scenario_table(curve.warm))
    console.print(_split_table([curve.cold, curve.warm]))
    console.print(_bench_table([curve.cold, curve.warm]))
    console.print("wrote " + ", ".join(str(p) for p in paths), highlight=False, soft_wrap=True)
