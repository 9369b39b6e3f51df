"""`remedy verify RUN_DIR --patch PATCH.yaml`: fine-tune treatment vs control, store the case, print the effect.

A screen that clears is confirmed on the next block of fresh seeds (unless ``--no-confirm``);
both cases are stored, and only the confirmation can be ``improved``.

(`remedy bench build` lives in its own module.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from remedy.cases.errors import ValidationError
from remedy.kb.settings import VerifySettings, settings_from

from .common import (
    DEFAULT_KB,
    JsonOption,
    KbOption,
    ScreenConfidenceOption,
    ServerOption,
    TrustCheckpointOption,
    print_json,
    progress_bar,
)
from .jobs import verify_job
from .render import render_outcome

if TYPE_CHECKING:
    from remedy.cases.model import Case

__all__ = ["verify"]


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
        if no_store or ray_address:
            raise ValidationError("the service stores every case on its own executor; drop --no-store / --ray-address")
        return verify_job(server, run_dir, patch, json_out, wait, settings)
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


def _store(case: Case, kb: Path) -> bool:
    from remedy.kb.facade import KnowledgeBase

    with KnowledgeBase.open(kb, create=True) as handle:
        return handle.add(case)
