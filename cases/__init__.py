"""The case itself: data model, store of record, evidence, signatures, patches,
sandbox, verification and fault scenarios. Imports nothing else of Remedy's."""

from .errors import *  # noqa: F401,F403
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
