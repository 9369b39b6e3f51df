"""`remedy bench build`: build the fault-scenario patients, check each fails and its oracle fixes it; show a table."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import TaskID
from rich.table import Table

from .common import JsonOption, ScreenConfidenceOption, add_columns, console, print_json, progress_bar

__all__ = ["bench_build", "build_cmd"]

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
