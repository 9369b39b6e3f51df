"""`remedy bench build` (build the fault-scenario patients, check each fails and its oracle fixes it) and
`remedy bench factory` (the case factory: the fix loop over the zoo, resumable and sharded, cases in chunks)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import TaskID
from rich.table import Table

from .common import (
    JsonOption,
    ScreenConfidenceOption,
    add_columns,
    console,
    err_console,
    print_json,
    progress_bar,
    shown,
)

__all__ = ["bench_build", "build_cmd", "factory_cmd"]

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


def _factory_table(state: dict) -> Table:
    """The manifest's totals (and what waits to be sealed) as a two-column table."""
    t = Table(title="case factory", title_justify="left")
    add_columns(t, [("figure", {}), ("value", {"justify": "right"})])
    totals = state["totals"]
    for key in ("chunks", "n_units", "attempts", "measured", "improved", "fixed", "stopped_early", "exploration"):
        t.add_row(key.replace("_", " "), f"{totals.get(key, 0):,}")
    t.add_row("env steps", f"{totals.get('env_steps', 0):,}")
    t.add_row("wall hours", f"{totals.get('wall_time_s', 0.0) / 3600:.2f}")
    per_hour = totals.get("per_hour") or {}
    t.add_row("per hour (attempts / improved / fixed)", " / ".join(f"{per_hour.get(k, 0):g}" for k in per_hour) or "-")
    t.add_row("pending units", shown(", ".join(state["pending"]) or "-"))
    return t


def factory_cmd(
    scenarios: Annotated[
        str | None, typer.Option("--scenarios", help="Name glob of the zoo (default: every bundled scenario).")
    ] = None,
    split: Annotated[
        str,
        typer.Option(
            "--split", help="all, dev, holdout, lofo:<family> (that family) or lofo-train:<family> (the rest)."
        ),
    ] = "all",
    passes: Annotated[
        int, typer.Option("--passes", min=1, help="Passes over the zoo (each on its own seed block).")
    ] = 1,
    shard: Annotated[str | None, typer.Option("--shard", help="i/n: every n-th unit from the i-th.")] = None,
    chunk: Annotated[int, typer.Option("--chunk", min=1, help="Units per chunk (Parquet + manifest entry).")] = 4,
    max_units: Annotated[int | None, typer.Option("--max-units", min=1, help="Stop after this many units.")] = None,
    rounds: Annotated[int, typer.Option("--rounds", min=1, help="Diagnose-verify rounds per unit.")] = 2,
    candidates: Annotated[int, typer.Option("--candidates", min=1, help="Candidates verified per round.")] = 2,
    seeds: Annotated[int, typer.Option("--seeds", min=2, help="Training seeds per arm of a screen.")] = 2,
    confirm_seeds: Annotated[
        int | None,
        typer.Option("--confirm-seeds", min=2, help="Seeds per arm of a confirmation (default: the loop's)."),
    ] = None,
    explore: Annotated[
        float, typer.Option("--explore", min=0.0, max=1.0, help="Share of candidate slots given to a lower-ranked one.")
    ] = 0.2,
    race: Annotated[bool, typer.Option("--race/--no-race", help="Race each round's candidates.")] = True,
    executor: Annotated[str, typer.Option("--executor", help="Where verification jobs run: local or ray.")] = "local",
    ray_address: Annotated[str | None, typer.Option("--ray-address", help="An existing Ray cluster.")] = None,
    out: Annotated[Path, typer.Option("--out", help="The dataset folder (chunks + manifest.json).")] = Path(
        "bench/data/factory"
    ),
    oracle_results: Annotated[
        Path, typer.Option("--oracle-results", help="Oracle solvability records (JSONL).")
    ] = Path("bench/data/oracle.jsonl"),
    commit: Annotated[
        bool, typer.Option("--commit", help="git-commit each chunk and the manifest as it lands.")
    ] = False,
    status_only: Annotated[
        bool, typer.Option("--status", help="Show the manifest's totals and the pending units, and stop.")
    ] = False,
    build_first: Annotated[
        bool, typer.Option("--build-first", help="Train every patient not yet built, first.")
    ] = False,
    check_oracle: Annotated[
        bool, typer.Option("--check-oracle", help="Check a patient's oracle before its first unit, if unrecorded.")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List this shard's units still to run, and stop.")] = False,
    as_json: JsonOption = False,
) -> None:
    """The case factory: the fix loop over the zoo, resumable (re-run to go on) and sharded; cases in chunks."""
    from remedy.kb.factory import FactoryPlan, factory_settings, run_plan, status, todo_units

    if status_only:
        return _show_factory(status(out), as_json)
    plan = FactoryPlan(
        scenarios=scenarios,
        split=split,
        passes=passes,
        shard=shard,
        chunk=chunk,
        max_units=max_units,
        out=out,
        oracle_results=oracle_results,
        commit=commit,
        build_first=build_first,
        check_oracle=check_oracle,
        executor=executor,
        ray_address=ray_address,
    )
    if dry_run:
        todo = todo_units(plan)
        if as_json:
            return print_json({"todo": todo})
        return console.print("\n".join([*todo, f"{len(todo)} unit(s) to run"]), highlight=False)
    settings = factory_settings(
        rounds=rounds,
        candidates=candidates,
        seeds=seeds,
        confirm_seeds=confirm_seeds,
        explore=explore,
        race=race,
        executor=executor,
        oracle_results=oracle_results,
    )
    # one progress line per unit (and per stage): stderr with --json, so stdout stays the JSON
    say_to = err_console if as_json else console
    _show_factory(run_plan(plan, settings, say=lambda line: say_to.print(shown(line), highlight=False)), as_json)


def _family_table(state: dict) -> Table:
    """Units, attempts, improved and fixed per fault family."""
    t = Table(title="per fault family", title_justify="left")
    keys = ("units", "attempts", "improved", "fixed")
    add_columns(t, [("family", {"no_wrap": True}), *[(k, {"justify": "right"}) for k in keys]])
    for family, row in state.get("by_family", {}).items():
        t.add_row(shown(family), *[f"{row[k]:,}" for k in keys])
    return t


def _show_factory(state: dict, as_json: bool) -> None:
    if as_json:
        print_json(state)
        return
    console.print(_factory_table(state))
    if state.get("by_family"):
        console.print(_family_table(state))
