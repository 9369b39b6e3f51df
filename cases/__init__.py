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

from .errors import *  # noqa: F403
from .errors import __all__ as _errors_all
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
