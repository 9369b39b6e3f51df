"""The case itself, and the machinery that produces one. Imports nothing else of Remedy's.

Rooms, following the data flow:

- this package: the case model (``model``), its vocabulary (``vocab``), the store of record
  (``store``), case import/export (``io``), the error tree (``errors``), success definitions
  (``success``), the algorithm registry (``algos``) and the safe YAML loader (``yamlfile``);
- ``evidence``: run directory -> rollouts and training logs -> features -> signature;
- ``patches``: patch spec, fit check, sandbox and fuzzing of patch code, applying a patch;
- ``verify``: fine-tuning arms, executors, statistics, verification, fault scenarios.

This module is the face users import from (``from remedy.cases import Case, Patch``).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .errors import *  # noqa: F403
from .errors import __all__ as _errors_all

if TYPE_CHECKING:
    from .model import (
        SCHEMA_VERSION,
        ActionSpaceType,
        Case,
        Cause,
        Diagnosis,
        Effect,
        EnvTraits,
        EpisodeSummary,
        Evidence,
        LiteratureEffect,
        Provenance,
        RemedyFamily,
        RewardDensity,
        RootCause,
        Signature,
        Source,
        Status,
        Subject,
        Verification,
        new_case_id,
    )
    from .patches import Patch
    from .success import SuccessSpec, is_success, parse_success

__all__ = [
    *_errors_all,
    "SCHEMA_VERSION",
    "ActionSpaceType",
    "Case",
    "Cause",
    "Diagnosis",
    "Effect",
    "EnvTraits",
    "EpisodeSummary",
    "Evidence",
    "LiteratureEffect",
    "Provenance",
    "RemedyFamily",
    "RewardDensity",
    "RootCause",
    "Signature",
    "Source",
    "Status",
    "Subject",
    "Verification",
    "new_case_id",
    "Patch",
    "SuccessSpec",
    "is_success",
    "parse_success",
]

#: public name -> the submodule defining it. Loaded on first use (PEP 562): ``remedy.cases.errors``
#: is imported by every command, ``--help`` included, and must not pull in pydantic and numpy.
_WHERE = {
    **dict.fromkeys(("Patch",), "patches"),
    **dict.fromkeys(("SuccessSpec", "is_success", "parse_success"), "success"),
}


def __getattr__(name: str) -> Any:
    if name in __all__ and name not in _errors_all:
        value = getattr(import_module(f".{_WHERE.get(name, 'model')}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
