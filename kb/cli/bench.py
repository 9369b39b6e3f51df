"""`remedy bench build`: train (or find cached/shipped) the fault-scenario patients and show a table."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from .common import JsonOption, add_columns, console, print_json, progress_bar

__all__ = ["bench_build", "build_cmd"]

#: console width from which the table shows the fault text.
_WIDE = 130


def _row(b) -> dict:
    s = b.scenario
    return {
        "scenario": s.name, "env_id": s.env_id, "algo": s.algo, "fault": s.fault, "train_steps": s.train_steps,
        "wall_time_s": round(b.wall_time_s, 2), "cached": b.cached, "source": b.source,
        "success_rate": b.success_rate, "run_dir": str(b.run.path), "quick": s.quick,
    }


def _table(rows: list[dict]) -> Table:
    t = Table(title="fault scenarios", show_lines=False)
    widest = max((len(r["scenario"]) for r in rows), default=8)
    wide = console.width >= _WIDE  # the fault text only where it fits; --json always has it
    columns: list[tuple[str, dict[str, Any]]] = [
        ("scenario", {"no_wrap": True, "min_width": widest}), ("env", {"no_wrap": True}),
        ("fault", {"overflow": "ellipsis", "no_wrap": True, "max_width": console.width - 100}),
        ("steps", {"justify": "right", "no_wrap": True}), ("wall s", {"justify": "right", "no_wrap": True}),
        ("cached?", {"no_wrap": True}), ("success", {"justify": "right", "no_wrap": True})]
    add_columns(t, [c for c in columns if c[0] != "fault" or wide])
    for r in rows:
        success = "-" if r["success_rate"] is None else f"{r['success_rate']:.0%}"
        cached = r["source"] if r["cached"] else "no"
        cells = [r["scenario"], r["env_id"], r["fault"], f"{r['train_steps']:,}", f"{r['wall_time_s']:.1f}", cached, success]
        t.add_row(*(cells if wide else cells[:2] + cells[3:]))
    return t


def bench_build(scenarios: str | None, force: bool, cache: Path | None, quick: bool, as_json: bool) -> list[dict]:
    """Build the selected scenarios (one core call per scenario) and render the table or JSON."""
    from remedy.cases.verify.scenarios import build_scenario, load_scenarios

    chosen = [s for s in load_scenarios(scenarios) if s.quick or not quick]
    rows: list[dict] = []
    with progress_bar(to=console, disable=as_json) as bar:
        overall = bar.add_task("scenarios", total=len(chosen))
        for s in chosen:
            step = bar.add_task(f"  {s.name}", total=s.train_steps)
            built = build_scenario(s, cache, force=force,
                                   progress=lambda done, total, t=step: bar.update(t, completed=done, total=total))
            bar.update(step, completed=s.train_steps, visible=False)
            bar.advance(overall)
            rows.append(_row(built))
    if as_json:
        print_json(rows)
    else:
        console.print(_table(rows))
    return rows



def build_cmd(
    scenarios: Annotated[Optional[str], typer.Option(
        "--scenarios", help="Name glob over the bundled scenarios ('cartpole_*'), or a YAML file/dir/path glob.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Retrain even when a cached or shipped build exists.")] = False,
    cache: Annotated[Optional[Path], typer.Option(
        "--cache", help="Build cache directory (default ~/.cache/remedy/scenarios).")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Only the quick default subset.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Train the fault-scenario patients (cached by a hash of each scenario) and show what was built."""
    bench_build(scenarios, force, cache, quick, as_json)
