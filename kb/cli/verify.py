"""`remedy verify RUN_DIR --patch PATCH.yaml`: fine-tune treatment vs control, store the case, print the effect.

(`remedy bench build` lives in its own module.)
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console, Group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .common import DEFAULT_KB, JsonOption, KbOption, ServerOption, console, print_json

if TYPE_CHECKING:
    from remedy.cases.model import Case

__all__ = ["verify", "render_verification"]

_err = Console(stderr=True)


class _Executor(StrEnum):
    local = "local"
    ray = "ray"




@contextmanager
def _progress() -> Iterator[Callable[[str, int, int], None]]:
    """A rich progress line on stderr (stdout stays clean for ``--json``); yields ``update(message, done, total)``."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=_err, transient=True) as bar:
        task = bar.add_task("verify", total=None)

        def update(message: str, done: int, total: int) -> None:
            bar.update(task, description=message, completed=done, total=total or None)

        yield update


def verify(
    run_dir: Annotated[Path, typer.Argument(help="Run directory: run.yaml + model.zip.")],
    patch: Annotated[Path, typer.Option("--patch", help="Patch file (YAML or JSON).")],
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="Training seeds per arm.")] = 3,
    budget: Annotated[Optional[int], typer.Option("--budget", min=1, help="Fine-tuning env steps per arm (default 20% of train_steps).")] = None,
    episodes: Annotated[int, typer.Option("--episodes", min=1, help="Evaluation episodes per agent.")] = 20,
    executor: Annotated[_Executor, typer.Option("--executor", help="Where jobs run.")] = _Executor.local,
    ray_address: Annotated[Optional[str], typer.Option("--ray-address", help="Ray cluster address (default: a local Ray).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Train even if the trajectory preference check fails.")] = False,
    no_store: Annotated[bool, typer.Option("--no-store", help="Do not store the case in the KB.")] = False,
    json_out: JsonOption = False,
    kb: KbOption = Path(DEFAULT_KB),
    server: ServerOption = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="With --server: follow the job, or print its id.")] = True,
) -> None:
    """Fine-tune with the patch (treatment) and without (control), compare on the original task, store the case."""
    if server:
        from . import remote

        return remote.verify(server, run_dir, patch, json_out, wait, seeds=seeds, budget=budget, episodes=episodes,
                             force=force)
    from remedy.cases.verify.executors import get_executor
    from remedy.cases.patches.io import load_patch
    from remedy.cases.verify.verification import VerifyConfig, verify_patch

    the_patch = load_patch(patch)
    config = VerifyConfig(seeds=seeds, budget_steps=budget, eval_episodes=episodes, executor=executor.value, force=force)
    runner = get_executor("ray", address=ray_address) if executor is _Executor.ray else get_executor("local")
    try:
        with _progress() as update:
            case = verify_patch(run_dir, the_patch, config, executor=runner, progress=update)
    finally:
        if hasattr(runner, "shutdown"):
            runner.shutdown()
    stored = False if no_store else _store(case, kb)
    if json_out:
        from remedy.cases.io import case_to_json

        print_json({"case_id": case.case_id, "status": case.status, "stored": stored, "case": json.loads(case_to_json(case))})
        return
    console.print(render_verification(case))
    where = f"stored in {kb}" if stored else ("not stored (--no-store)" if no_store else f"already in {kb}")
    console.print(f"case [bold]{case.case_id}[/] {where}", highlight=False)


def _store(case: "Case", kb: Path) -> bool:
    from remedy.kb.facade import KnowledgeBase

    with KnowledgeBase.open(kb, create=True) as handle:
        return handle.add(case)


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.3g} ± {sd:.2g}"


def render_verification(case: "Case") -> Group:
    """The effect table (arm, seeds, metric mean ± spread, per-seed values), secondary effects, and a status line."""
    v = case.verification
    if v is None:
        return Group("[dim]not verified[/]")
    if v.effect is None:
        return Group(f"[bold red]{v.status.value}[/]: {v.reason}",
                     f"[dim]env steps {v.env_steps:,} · wall {v.wall_time_s:.1f}s · budget {v.budget_steps:,}[/]")
    e = v.effect
    arms = Table(title=f"{case.subject.env_id} · {case.patch.summary()}", title_justify="left")
    for col in ("arm", "seeds", f"{e.metric} mean ± sd", "per seed"):
        arms.add_column(col)
    for arm in ("treatment", "control"):
        values = v.per_seed.get(arm, [])
        arms.add_row(arm, str(len(values)), _spread(values), ", ".join(f"{x:.3g}" for x in values))
    effects = Table(show_header=True)
    for col in ("metric", "treatment", "control", "effect", f"{e.confidence_level:.0%} CI", "P(improve)"):
        effects.add_column(col)
    for eff in [e, *v.secondary.values()]:
        pi = f"{eff.prob_improvement:.2f}" if eff.prob_improvement is not None else "-"
        name = f"[bold]{eff.metric}[/]" if eff is e else eff.metric
        effects.add_row(name, f"{eff.treatment:.3g}", f"{eff.control:.3g}", f"{eff.diff:+.3g}",
                        f"[{eff.ci_low:+.3g}, {eff.ci_high:+.3g}]", pi)
    colour = {"improved": "green", "worse": "red", "reward_hacking": "magenta"}.get(v.status.value, "yellow")
    status = (f"status [bold {colour}]{v.status.value}[/] · env steps {v.env_steps:,} · wall {v.wall_time_s:.1f}s"
              f" · budget {v.budget_steps:,}/arm")
    return Group(arms, effects, status, f"[dim]{v.reason}[/]")
