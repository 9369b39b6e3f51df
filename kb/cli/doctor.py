"""`remedy doctor`: sandbox capabilities, embedding model and versions."""

from __future__ import annotations

from dataclasses import asdict

from rich.table import Table

from .common import JsonOption, console, print_json

__all__ = ["doctor_cmd"]


def doctor_cmd(as_json: JsonOption = False) -> None:
    """Report what the sandbox can enforce here (network namespace, rlimits), the embedding model and versions."""
    from remedy.kb.doctor import run_doctor

    report = run_doctor()
    if as_json:
        print_json({**asdict(report), "problems": report.problems})
        return
    t = Table(show_header=False, title="remedy doctor", title_justify="left")
    t.add_column("what")
    t.add_column("state")
    yes = lambda ok: "[green]yes[/]" if ok else "[red]no[/]"  # noqa: E731
    t.add_row("worker network isolation", yes(report.network_isolation))
    for name, ok in report.rlimits.items():
        t.add_row(f"worker {name} limit", yes(ok))
    t.add_row("worker environment", ", ".join(report.worker_env))
    t.add_row(
        "embedding model",
        f"{report.embedding_model} ({report.embedding_dim} dims) "
        f"{report.embedding_model_path or '[red]not installed[/]'}",
    )
    t.add_row("python", report.python)
    for dist, version in report.versions.items():
        t.add_row(dist, version)
    console.print(t)
    for line in report.problems:
        console.print(f"[yellow]warning:[/] {line}", highlight=False, soft_wrap=True)
