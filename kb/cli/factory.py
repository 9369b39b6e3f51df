"""`remedy bench factory`: the case factory (the fix loop over the zoo, resumable and sharded, cases in
chunks), and its manifest's tables."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from .common import JsonOption, add_columns, console, err_console, print_json, shown

__all__ = ["factory_cmd"]


def _factory_table(state: dict) -> Table:
    """The manifest's totals (and what waits to be sealed) as a two-column table."""
    t = Table(title="case factory", title_justify="left")
    add_columns(t, [("figure", {}), ("value", {"justify": "right"})])
    totals = state["totals"]
    keys = ("chunks", "n_units", "attempts", "measured", "improved", "fixed", "stopped_early", "exploration", "oracle")
    for key in (*keys, "oracle_improved"):
        t.add_row(key.replace("_", " "), f"{totals.get(key, 0):,}")
    t.add_row("env steps", f"{totals.get('env_steps', 0):,}")
    t.add_row("wall hours", f"{totals.get('wall_time_s', 0.0) / 3600:.2f}")
    per_hour = totals.get("per_hour") or {}
    t.add_row("per hour (attempts / improved / fixed)", " / ".join(f"{per_hour.get(k, 0):g}" for k in per_hour) or "-")
    t.add_row("pending units", shown(", ".join(state["pending"]) or "-"))
    zoo = state.get("zoo")
    if zoo:
        share = zoo["solvable_share_of_checked"]
        t.add_row(
            "zoo (solvable / unsolvable / not failing / unchecked)",
            f"{zoo['patients']}: {zoo['solvable']} / {zoo['unsolvable']} / {zoo['not_failing']} / {zoo['unchecked']}"
            + ("" if share is None else f" ({share:.0%} of checked solvable)"),
        )
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
    oracle_cases: Annotated[
        bool,
        typer.Option(
            "--oracle-cases",
            help="Only re-run the oracle check of every solvable patient whose oracle attempts are not in the dataset "
            "yet, keeping them (chosen:oracle); resumable, its own chunks.",
        ),
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List this shard's units still to run, and stop.")] = False,
    as_json: JsonOption = False,
) -> None:
    """The case factory: the fix loop over the zoo, resumable (re-run to go on) and sharded; cases in chunks."""
    from remedy.kb.factory import FactoryPlan, factory_settings, run_plan, status, todo_units

    if status_only:
        return _show_factory(status(out, oracle_results), as_json)
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
        oracle_cases=oracle_cases,
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
