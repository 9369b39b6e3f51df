"""`remedy signature RUN_DIR`: roll the agent out and show its failure signature."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from remedy.cases.vocab import COMPONENT_PREFIX, FEATURES, SYMPTOMS

from .common import JsonOption, TrustCheckpointOption, console, print_json

if TYPE_CHECKING:
    from remedy.cases.evidence.signature import RunSignature

__all__ = ["signature_command", "render_signature"]


def _meaning(name: str) -> str:
    if name in FEATURES:
        return FEATURES[name]
    if name.startswith(COMPONENT_PREFIX):
        comp, stat = name[len(COMPONENT_PREFIX) :].rsplit(".", 1)
        what = {
            "mean": "mean per-episode sum",
            "std": "std of per-episode sums",
            "success_corr": "correlation with success",
        }
        return f"reward component '{comp}': {what.get(stat, stat)}"
    return ""


def _value(v: float) -> str:
    if not math.isfinite(v):
        return "[dim]n/a[/]"
    return f"{v:.4g}"


def render_signature(rs: RunSignature) -> None:
    """Print a run's features, symptoms and summary as rich tables."""
    s = rs.subject
    console.print(
        f"[bold]{rs.run.path}[/]  {s.env_id} · {s.algo} · {s.traits.action_space.value} actions · success: {s.success}"
    )
    table = Table(title="features", show_lines=False)
    table.add_column("feature", style="cyan", no_wrap=True)
    table.add_column("value", justify="right")
    table.add_column("meaning", style="dim")
    for name, value in rs.features.items():
        table.add_row(name, _value(value), _meaning(name))
    console.print(table)
    if rs.signature.symptoms:
        sym = Table(title="symptoms")
        sym.add_column("symptom", style="bold yellow")
        sym.add_column("meaning")
        for tag in rs.signature.symptoms:
            sym.add_row(tag, SYMPTOMS.get(tag, ""))
        console.print(sym)
    else:
        console.print("[green]no symptoms[/]")
    for note in rs.bundle.notes:
        console.print(f"[dim]note: {note}[/]")
    console.print(f"[bold]summary:[/] {rs.signature.summary}", highlight=False)


def signature_command(
    run_dir: Annotated[Path, typer.Argument(help="Run directory (run.yaml + model.zip).", resolve_path=True)],
    episodes: Annotated[int, typer.Option("--episodes", min=1, help="Evaluation episodes per mode.")] = 20,
    seed: Annotated[int, typer.Option("--seed", help="First episode seed.")] = 0,
    as_json: JsonOption = False,
    trust_checkpoint: TrustCheckpointOption = False,
) -> None:
    """Roll the agent out (deterministic and stochastic) and print its failure signature."""
    from remedy.cases.evidence.signature import signature_of_run  # rollouts need gymnasium, SB3, scipy

    if as_json:
        rs = signature_of_run(run_dir, n_episodes=episodes, seed=seed, trust=trust_checkpoint)
        print_json(rs.signature.model_dump(mode="json"))
        return
    with console.status(f"rolling out {episodes} episodes per mode..."):
        rs = signature_of_run(run_dir, n_episodes=episodes, seed=seed, trust=trust_checkpoint)
    render_signature(rs)
