"""`remedy diagnose`, `remedy fix`, `remedy bench run|curve`, `remedy demo`."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.table import Table

from remedy.cases.errors import KBNotFoundError
from remedy.cases.patches.spec import Patch

from .cli_common import DEFAULT_KB, JsonOption, KbOption, console, print_json

__all__ = ["register", "write_patches"]

DiagnoserOption = Annotated[
    str, typer.Option("--diagnoser", help="offline (no network), llm (needs REMEDY_LM), or auto (llm if configured).")
]


def register(app, bench_app) -> None:
    """Attach the diagnosis commands."""
    _register_diagnose(app)


def _register_diagnose(app) -> None:
    @app.command("diagnose")
    def diagnose(
        run_dir: Annotated[Path, typer.Argument(help="Run directory (run.yaml + model.zip).")],
        diagnoser: DiagnoserOption = "offline",
        k: Annotated[int, typer.Option("--k", min=0, help="Similar cases to retrieve.")] = 10,
        episodes: Annotated[int, typer.Option("--episodes", min=1, help="Evaluation episodes for the signature.")] = 20,
        seed: Annotated[int, typer.Option("--seed", help="Seed of the evaluation rollouts.")] = 0,
        exclude_scenario: Annotated[
            str | None, typer.Option("--exclude-scenario", help="Leave out cases of this scenario (benchmarks).")
        ] = None,
        write_patches_dir: Annotated[
            Path | None, typer.Option("--write-patches", help="Write each candidate as a YAML patch file here.")
        ] = None,
        kb: KbOption = Path(DEFAULT_KB),
        as_json: JsonOption = False,
    ) -> None:
        """Say why the agent in RUN_DIR fails: ranked root causes and candidate patches."""
        from remedy.kb.diagnose import diagnose_run

        store, warnings = _open_kb(kb)
        try:
            report = diagnose_run(store, run_dir, diagnoser=diagnoser, k=k, n_episodes=episodes, seed=seed,
                                  exclude_scenario=exclude_scenario)
        finally:
            if store is not None:
                store.close()
        report = report.model_copy(update={"warnings": [*warnings, *report.warnings]})
        written = write_patches(report.candidates, write_patches_dir) if write_patches_dir else []
        if as_json:
            data = report.model_dump(mode="json")
            data["patch_files"] = [str(p) for p in written]
            print_json(data)
            return
        _render(report, written)


def _open_kb(path: Path):
    """The KB at ``path``, or None (cold: priors only) with a warning when there is none yet."""
    from remedy.kb.facade import KnowledgeBase

    try:
        return KnowledgeBase.open(path, create=False), []
    except KBNotFoundError:
        return None, [f"no knowledge base at {path}: advice comes from the built-in priors only "
                      "(create one with `remedy kb init`)"]


def _save(patch: Patch, path: Path) -> None:
    try:  # the patch module's own writer, when present, keeps one file format
        save = importlib.import_module("remedy.cases.patches.io").save_patch
    except (ImportError, AttributeError):
        save = None
    if save is not None:
        save(patch, path)
        return
    path.write_text(yaml.safe_dump(patch.model_dump(mode="json"), sort_keys=False))


def write_patches(candidates, directory: Path) -> list[Path]:
    """Write each candidate patch as ``NN-<family>.yaml`` under ``directory``; returns the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for i, cand in enumerate(candidates, start=1):
        path = directory / f"{i:02d}-{cand.family.value}.yaml"
        _save(cand.patch, path)
        out.append(path)
    return out


def _render(report, written: list[Path]) -> None:
    d, sig = report.diagnosis, report.signature
    console.print(f"[bold]Signature[/]: {sig.summary}")
    console.print("symptoms: " + (", ".join(sig.symptoms) or "none"), highlight=False)
    causes = Table(title=f"Root causes ({d.backend}, {d.program_version})", title_justify="left")
    for col in ("#", "cause", "confidence", "rationale"):
        causes.add_column(col, overflow="fold")
    for i, c in enumerate(d.causes, start=1):
        causes.add_row(str(i), c.cause.value, f"{c.confidence:.2f}", c.rationale)
    console.print(causes)
    cands = Table(title="Candidate patches", title_justify="left")
    for col in ("#", "family", "patch", "cost", "score", "cites"):
        cands.add_column(col, overflow="fold")
    for i, c in enumerate(report.candidates, start=1):
        cands.add_row(str(i), c.family.value, c.patch.summary(), c.compute_cost, f"{c.score:.2f}", ", ".join(c.cites))
    console.print(cands)
    console.print("cited cases: " + (", ".join(d.cited_cases) or "none"), highlight=False)
    console.print("cited rules: " + (", ".join(d.cited_rules) or "none"), highlight=False)
    for path in written:
        console.print(f"wrote {path}", highlight=False)
    for w in report.warnings:
        console.print(f"[yellow]warning:[/] {w}", highlight=False)
