"""`remedy patch check`: is a patch file safe and fit to use on an env (and algorithm)?"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from remedy.cases.errors import ValidationError

from .common import JsonOption, console, print_json

__all__ = ["check"]


def _env_kwargs(text: str | None) -> dict:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as ex:
        raise ValidationError(
            f"--env-kwargs is not valid JSON ({ex.msg} at column {ex.colno}); e.g. '{{\"continuous\": true}}'"
        ) from None
    if not isinstance(value, dict):
        raise ValidationError("--env-kwargs must be a JSON object, e.g. '{\"continuous\": true}'")
    return value


def check(
    patch_file: Annotated[Path, typer.Argument(help="Patch file (.yaml, .yml or .json).", resolve_path=True)],
    env: Annotated[str, typer.Option("--env", help="Gymnasium env id the patch is for.")],
    env_kwargs: Annotated[str | None, typer.Option("--env-kwargs", help="Env kwargs as a JSON object.")] = None,
    algo: Annotated[
        str | None, typer.Option("--algo", help="Algorithm (PPO, SAC, DQN, ...) to check hyperparameters against.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Check a patch: fit to the env/algorithm, sandbox rules, and a fuzz run of its code. Exit 1 if rejected."""
    from remedy.cases.patches.check import check_patch
    from remedy.cases.patches.io import load_patch

    kwargs = _env_kwargs(env_kwargs)
    report = check_patch(load_patch(patch_file), env, kwargs, algo)
    if as_json:
        print_json(report.to_dict())
    elif report.ok:
        figures = (
            f"{report.fuzz.calls} fuzz calls, slowest {report.fuzz.max_call_ms:.2f} ms"
            if report.fuzz
            else "no code to fuzz"
        )
        console.print(f"[green]accepted[/] ({figures})", highlight=False)
    else:
        typer.echo(f"rejected: {report.rule}: {report.message}")
    if not report.ok:
        raise typer.Exit(1)
