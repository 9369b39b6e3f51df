"""`remedy verify RUN_DIR --patch PATCH.yaml`: fine-tune treatment vs control, store the case, print the effect.

A screen that clears is confirmed on the next block of fresh seeds (unless ``--no-confirm``);
both cases are stored, and only the confirmation can be ``improved``.

(`remedy bench build` lives in its own module.)
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Group
from rich.table import Table

from remedy.cases.errors import ValidationError
from remedy.kb.settings import VerifySettings, settings_from

from .common import (
    DEFAULT_KB,
    JsonOption,
    KbOption,
    ScreenConfidenceOption,
    ServerOption,
    TrustCheckpointOption,
    console,
    print_json,
    progress_bar,
    shown,
    status_markup,
)

if TYPE_CHECKING:
    from remedy.cases.model import Case

__all__ = ["verify", "render_verification", "render_outcome"]


class _Executor(StrEnum):
    local = "local"
    ray = "ray"


@contextmanager
def _progress() -> Iterator[Callable[[str, int, int], None]]:
    """A rich progress line on stderr (stdout stays clean for ``--json``); yields ``update(message, done, total)``."""
    with progress_bar() as bar:
        task = bar.add_task("verify", total=None)

        def update(message: str, done: int, total: int) -> None:
            bar.update(task, description=message, completed=done, total=total or None)

        yield update


def verify(
    run_dir: Annotated[Path, typer.Argument(help="Run directory: run.yaml + model.zip.", resolve_path=True)],
    patch: Annotated[Path, typer.Option("--patch", help="Patch file (YAML or JSON).", resolve_path=True)],
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="Training seeds per arm.")] = VerifySettings.default(
        "seeds"
    ),
    budget: Annotated[
        int | None,
        typer.Option(
            "--budget",
            min=1,
            help="Fine-tuning env steps per arm (default: the scenario's declared budget, else 20% of train_steps).",
        ),
    ] = None,
    confirm_seeds: Annotated[
        int,
        typer.Option(
            "--confirm-seeds",
            min=2,
            help="Training seeds per arm of the confirmation (fresh seeds, run when the screen clears).",
        ),
    ] = VerifySettings.default("confirm_seeds"),
    screen_confidence: ScreenConfidenceOption = VerifySettings.default("screen_confidence"),
    seed_base: Annotated[
        int,
        typer.Option(
            "--seed-base",
            min=0,
            help="First training seed (seeds BASE..BASE+seeds-1; a confirmation uses the next block). Use a fresh base to re-verify.",
        ),
    ] = VerifySettings.default("seed_base"),
    no_confirm: Annotated[
        bool, typer.Option("--no-confirm", help="Screen only: a screen that clears stays inconclusive.")
    ] = False,
    episodes: Annotated[
        int, typer.Option("--episodes", min=1, help="Evaluation episodes per agent.")
    ] = VerifySettings.default("episodes"),
    n_envs: Annotated[
        int, typer.Option("--n-envs", min=1, help="Parallel envs of an on-policy fine-tune.")
    ] = VerifySettings.default("n_envs"),
    executor: Annotated[_Executor, typer.Option("--executor", help="Where jobs run.")] = _Executor.local,
    ray_address: Annotated[
        str | None, typer.Option("--ray-address", help="Ray cluster address (default: a local Ray).")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Train even if the trajectory preference check fails.")
    ] = False,
    no_store: Annotated[bool, typer.Option("--no-store", help="Do not store the case in the KB.")] = False,
    json_out: JsonOption = False,
    kb: KbOption = Path(DEFAULT_KB),
    server: ServerOption = None,
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="With --server: follow the job, or print its id.")
    ] = True,
    trust_checkpoint: TrustCheckpointOption = False,
) -> None:
    """Fine-tune with the patch (treatment) and without (control), compare on the original task, store the case."""
    settings = settings_from(
        VerifySettings,
        seeds=seeds,
        confirm_seeds=confirm_seeds,
        screen_confidence=screen_confidence,
        budget=budget,
        episodes=episodes,
        n_envs=n_envs,
        executor=executor.value,
        force=force,
        seed_base=seed_base,
        confirm=not no_confirm,
    )
    if server:
        from . import remote

        if no_store or ray_address:
            raise ValidationError("the service stores every case on its own executor; drop --no-store / --ray-address")
        return remote.verify(server, run_dir, patch, json_out, wait, settings)
    from remedy.cases.evidence.rundir import RunDir
    from remedy.cases.patches.io import load_patch
    from remedy.cases.verify.executors import get_executor
    from remedy.kb.verify import verify as verify_run

    the_patch = load_patch(patch)
    runner = get_executor("ray", address=ray_address) if executor is _Executor.ray and ray_address else None
    try:
        with _progress() as update:
            outcome = verify_run(
                RunDir.load(run_dir, trust=True) if trust_checkpoint else run_dir,
                the_patch,
                settings,
                store=None if no_store else (lambda case: _store(case, kb)),
                control_cache=None if no_store else Path(kb).resolve() / "controls",
                executor=runner,
                progress=update,
            )
    finally:
        if runner is not None:
            runner.shutdown()
    if json_out:
        print_json(outcome.as_dict())
        return
    render_outcome(outcome.as_dict(), str(kb), no_store)


def render_outcome(data: dict, place: str, no_store: bool = False) -> None:
    """Print a verification's outcome (the ``remedy verify --json`` shape, local or from the service): each
    case's table, where it was stored, and the seeds it used."""
    from remedy.cases.model import Case

    parts = [data["screen"], data] if data.get("screen") else [data]
    cases = [Case.model_validate(part["case"]) for part in parts]
    for case, part in zip(cases, parts):
        console.print(render_verification(case))
        where = (
            f"stored in {place}"
            if part["stored"]
            else ("not stored (--no-store)" if no_store else f"already in {place}")
        )
        console.print(f"{_stage(case)} case [bold]{shown(case.case_id)}[/] {shown(where)}", highlight=False)
    first = cases[0].verification.seed_base if cases[0].verification is not None else 0
    next_base = data["next_seed_base"]
    console.print(
        f"[dim]seeds used: {first}..{next_base - 1}; to re-verify on fresh seeds pass --seed-base {next_base}[/]",
        highlight=False,
    )


def _stage(case: Case) -> str:
    """The verification stage of a case this command verified (screen or confirm)."""
    if case.verification is None:
        raise ValueError(f"case {case.case_id} carries no verification")
    return case.verification.stage.value


def _store(case: Case, kb: Path) -> bool:
    from remedy.kb.facade import KnowledgeBase

    with KnowledgeBase.open(kb, create=True) as handle:
        return handle.add(case)


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.3g} ± {sd:.2g}"


def _budget_source(v) -> str:
    """`` (source kb: c-1, c-2)``: where the budget came from, when the case recorded it."""
    if v.budget_source is None:
        return ""
    cases = f": {', '.join(v.budget_cases)}" if v.budget_cases else ""
    return shown(f" (source {v.budget_source}{cases})")


def render_verification(case: Case) -> Group:
    """The effect table (arm, seeds, metric mean ± spread, per-seed values), secondary effects, and a status line."""
    v = case.verification
    if v is None:
        return Group("[dim]not verified[/]")
    if v.effect is None:
        return Group(
            f"[bold red]{v.status.value}[/]: {shown(v.reason)}",
            f"[dim]env steps {v.env_steps:,} · wall {v.wall_time_s:.1f}s · budget {v.budget_steps:,}{_budget_source(v)}[/]",
        )
    e = v.effect
    # case text (env id, patch, reasons that quote reward code's errors) goes through shown()
    arms = Table(title=f"{shown(case.subject.env_id)} · {shown(case.patch.summary())}", title_justify="left")
    for col in ("arm", "seeds", f"{shown(e.metric)} mean ± sd", "per seed"):
        arms.add_column(col)
    for arm in ("treatment", "control"):
        values = v.per_seed.get(arm, [])
        arms.add_row(arm, str(len(values)), _spread(values), ", ".join(f"{x:.3g}" for x in values))
    effects = Table(show_header=True)
    for col in ("metric", "treatment", "control", "effect", f"{e.confidence_level:.0%} CI", "P(improve)"):
        effects.add_column(col)
    for eff in [e, *v.secondary.values()]:
        pi = f"{eff.prob_improvement:.2f}" if eff.prob_improvement is not None else "-"
        name = f"[bold]{shown(eff.metric)}[/]" if eff is e else shown(eff.metric)
        effects.add_row(
            name,
            f"{eff.treatment:.3g}",
            f"{eff.control:.3g}",
            f"{eff.diff:+.3g}",
            f"[{eff.ci_low:+.3g}, {eff.ci_high:+.3g}]",
            pi,
        )
    seeds = f"seeds {v.seed_base}..{v.seed_base + v.seeds - 1}"
    status = (
        f"{v.stage.value} status {status_markup(v.status.value, bold=True)} · {seeds} · env steps {v.env_steps:,}"
        f" · wall {v.wall_time_s:.1f}s · budget {v.budget_steps:,}/arm{_budget_source(v)}"
    )
    if v.comparison == "budget_vs_none":
        status += " · more training vs none (the control is the unpatched checkpoint)"
    return Group(arms, effects, status, f"[dim]{shown(v.reason)}[/]")
