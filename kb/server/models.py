"""Request and response bodies of the HTTP API (pydantic), shared with the CLI's ``--json`` shapes.

``Hit`` is what ``remedy query --json`` prints for each case; ``StatsOut`` what
``remedy kb stats --json`` prints; a case is the case model's own JSON.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from remedy.cases.errors import ValidationError
from remedy.cases.model import LiteratureEffect, Signature, Subject
from remedy.kb.facade import KBStats, MineReport
from remedy.kb.settings import DiagnoserName, FixSettings, VerifySettings

__all__ = [
    "Health",
    "QueryIn",
    "SimilarIn",
    "CaseSimilarIn",
    "Hit",
    "HitPatch",
    "HitEffect",
    "ImportOut",
    "ImportProblem",
    "StatsOut",
    "StoreStatsOut",
    "RunOut",
    "DiagnoseIn",
    "ReviewIn",
    "RejectIn",
    "MineIn",
    "MineOut",
    "VerifyJobIn",
    "FixJobIn",
    "JobOut",
    "JobProgressOut",
    "ErrorOut",
    "SignatureIn",
    "SubjectIn",
    "RequestBodyError",
    "MAX_TEXT",
]

#: longest free text in a request (a description, a summary, a note)
MAX_TEXT = 4_000
#: longest id or name (env ids, algorithms, tags, feature names)
MAX_NAME = 200
#: most bytes of a free-form JSON object in a request (env kwargs, hyperparameters, a patch)
MAX_OBJECT_BYTES = 64 * 1024
Name = Annotated[str, StringConstraints(max_length=MAX_NAME)]


class RequestBodyError(ValidationError):
    """The request body is not usable JSON: nested too deeply, not UTF-8, or text with lone surrogates."""


Mode = Literal["hybrid", "vector", "text"]
Space = Literal["discrete", "continuous"]


#: one folder name of a fix job's ``out``
_OUT_PART = re.compile(r"[A-Za-z0-9._-]{1,64}")


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt filter is an error, not a silent no-op


def _small_object(v: dict[str, Any]) -> dict[str, Any]:
    """A free-form object no larger than :data:`MAX_OBJECT_BYTES` as JSON (and encodable as UTF-8)."""
    try:
        size = len(json.dumps(v, default=str).encode())
    except (ValueError, RecursionError) as err:
        raise ValueError(f"not plain JSON ({type(err).__name__})") from None
    if size > MAX_OBJECT_BYTES:
        raise ValueError(f"{size:,} bytes as JSON; at most {MAX_OBJECT_BYTES:,}")
    return v


class SignatureIn(Signature):
    """A failure signature as a request sends it: bounded summary, feature and symptom counts."""

    features: dict[Name, float] = Field(default_factory=dict, max_length=500)
    symptoms: list[Name] = Field(default_factory=list, max_length=64)
    summary: str = Field(..., max_length=MAX_TEXT)


class SubjectIn(Subject):
    """The agent's subject as a request sends it: bounded ids, texts and parameter objects."""

    env_id: str = Field(..., max_length=MAX_NAME)
    env_kwargs: dict[Name, Any] = Field(default_factory=dict, max_length=100)
    algo: str = Field(..., max_length=MAX_NAME)
    hyperparams: dict[Name, Any] = Field(default_factory=dict, max_length=200)
    checkpoint_sha256: str | None = Field(None, max_length=128)
    reward_ref: str | None = Field(None, max_length=MAX_TEXT)
    success: str = Field("", max_length=MAX_TEXT)

    @field_validator("env_kwargs", "hyperparams")
    @classmethod
    def _small(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _small_object(v)


class Health(BaseModel):
    """``GET /health``: the service is up; its Remedy version."""

    status: Literal["ok"] = "ok"
    version: str


class _Filters(_In):
    k: int = Field(10, ge=1, le=200, description="How many cases.")
    env: str | None = Field(None, max_length=200, description="Only cases on this env id.")
    action_space: Space | None = None
    algo: str | None = Field(None, max_length=100, description="Only this algorithm (case-insensitive).")
    only_improved: bool = False
    min_effect: float | None = Field(None, description="Only measured effects >= this.")
    mode: Mode = "hybrid"
    full: bool = Field(False, description="Also return each full case (what the CLI renders tables from).")

    @field_validator("min_effect")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    def search_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``KnowledgeBase.similar``."""
        return {
            "k": self.k,
            "env_id": self.env,
            "action_space": self.action_space,
            "algo": self.algo,
            "only_improved": self.only_improved,
            "min_effect": self.min_effect,
            "mode": self.mode,
        }


class QueryIn(_Filters):
    """``POST /v1/query``: what fixed failures described by ``text`` (the filters of `remedy query`)."""

    text: str = Field(..., min_length=1, max_length=4000, description="The failure, in words.")


class CaseSimilarIn(_Filters):
    """``POST /v1/cases/{id}/similar``: the cases nearest to a stored case (itself excluded)."""


class SimilarIn(_Filters):
    """``POST /v1/similar``: the cases nearest to a failure signature."""

    signature: SignatureIn


class HitPatch(BaseModel):
    """A hit's patch: its one-line summary and each part as a patch file holds it."""

    summary: str
    parts: list[dict[str, Any]]  # kind-specific fields: the patch kinds' own models validate them


class HitEffect(BaseModel):
    """A hit's measured effect: treatment minus control on ``metric``, with its 95% interval."""

    diff: float
    ci_low: float
    ci_high: float
    metric: str


class Hit(BaseModel):
    """One similar case: the shape of ``remedy query --json``, plus the full case when asked for."""

    rank: int
    case_id: str
    similarity: float
    env_id: str
    algo: str
    action_space: str
    source: str
    status: str
    symptoms: list[str]
    summary: str
    root_causes: list[str]
    patch: HitPatch
    effect: HitEffect | None
    literature: LiteratureEffect | None
    case: dict[str, Any] | None = None  # the case's own JSON (NaN features as strings), parsed by the client


class ImportProblem(BaseModel):
    """A record that was refused: its 1-based line (JSONL) or array index + 1, and why."""

    line: int
    message: str


class ErrorOut(BaseModel):
    """Every error response: the one-line message, the error class, and per-record problems for imports."""

    detail: str
    error: str
    problems: list[ImportProblem] = Field(default_factory=list)


class ImportOut(BaseModel):
    """``POST /v1/cases/import``: counts, as `remedy kb import` prints them."""

    read: int
    added: int
    unchanged: int
    skipped: int
    problems: list[ImportProblem] = Field(default_factory=list)


class StoreStatsOut(BaseModel):
    """Case counts overall and by source, status, env and root cause."""

    total: int
    by_source: dict[str, int]
    by_status: dict[str, int]
    by_env: dict[str, int]
    by_root_cause: dict[str, int]


class StatsOut(BaseModel):
    """``GET /v1/stats``: the shape of ``remedy kb stats --json``."""

    path: str
    store: StoreStatsOut
    schema_version: int
    index_rows: int | None
    embedder: str
    index_problem: str = ""
    index_missing: int = Field(0, description="With index: stored ids without an index row.")
    index_extra: int = Field(0, description="With index: index rows without a stored case.")
    index_duplicates: int = Field(0, description="With index: ids with several index rows.")

    @classmethod
    def of(cls, stats: KBStats) -> StatsOut:
        """The API view of a KB's stats (every field of ``remedy kb stats --json``)."""
        return cls(**{**stats.__dict__, "path": str(stats.path), "store": StoreStatsOut(**stats.store.__dict__)})


class RunOut(BaseModel):
    """``POST /v1/runs``: an uploaded run directory, referred to by ``run_id`` afterwards."""

    run_id: str
    env_id: str
    algo: str


class DiagnoseIn(_In):
    """``POST /v1/diagnose``: exactly one of an uploaded run (``run_id``), a signature with its subject,
    or a failure described in words (``describe``, with the optional ``env``, ``algo``,
    ``action_space`` and ``tags`` of `remedy diagnose --describe`)."""

    run_id: str | None = Field(None, max_length=40)
    subject: SubjectIn | None = None
    signature: SignatureIn | None = None
    describe: str | None = Field(
        None, min_length=1, max_length=4000, description="The failure in words (what `--describe` takes)."
    )
    env: str | None = Field(None, max_length=200, description="With describe: the env id, if known.")
    algo: str | None = Field(None, max_length=100, description="With describe: the algorithm, if known.")
    action_space: Space | None = Field(None, description="With describe: the action space, if known.")
    tags: list[Name] | None = Field(
        None,
        max_length=32,
        description="With describe: symptom tags to use instead of reading them off the text.",
    )
    diagnoser: DiagnoserName = "offline"
    k: int = Field(10, ge=0, le=200, description="Similar cases to retrieve.")
    episodes: int = Field(20, ge=1, le=500, description="Evaluation episodes for a run's signature.")
    seed: int = Field(0, ge=0, le=2**31 - 1)


class ReviewIn(_In):
    """``POST /v1/rules/{id}/accept``: an optional note. The reviewer is the token's name, never sent."""

    note: str = Field("", max_length=4000, description="Why (kept with the rule).")


class RejectIn(_In):
    """``POST /v1/rules/{id}/reject``: why the rule is wrong or useless (required)."""

    note: str = Field(..., max_length=4000, description="Why the rule is wrong or useless (kept with the rule).")

    @field_validator("note")
    @classmethod
    def _said(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("say why the rule is rejected (kept with the rule for later readers)")
        return v


class MineIn(_In):
    """``POST /v1/mine``: the parameters of `remedy mine`."""

    min_support: int = Field(3, ge=1, le=10_000, description="Fewest matching attempts per rule.")
    fdr: float = Field(0.1, gt=0, le=1, description="False-discovery rate (Benjamini–Hochberg) to keep a rule.")
    max_conditions: int = Field(2, ge=1, le=3, description="Most conditions in one rule.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of the bootstrap intervals.")


class MineOut(MineReport):
    """``POST /v1/mine``: the shape of `remedy mine --json`: the kept rules and what storing them changed
    (what ``KnowledgeBase.mine`` returns)."""


class VerifyJobIn(VerifySettings):
    """``POST /v1/jobs/verify``: screen a patch on an uploaded run and confirm a screen that clears, as
    `remedy verify` does (the same settings, :class:`~remedy.kb.settings.VerifySettings`); store the cases."""

    run_id: str = Field(..., max_length=40)
    patch: dict[Name, Any] = Field(
        ..., max_length=50, description="A patch: one part or {'parts': [...]}, as in a patch file."
    )

    @field_validator("patch")
    @classmethod
    def _small(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _small_object(v)


class FixJobIn(FixSettings):
    """``POST /v1/jobs/fix``: the closed loop on an uploaded run with every option of `remedy fix`
    (:class:`~remedy.kb.settings.FixSettings`); every attempt is stored. ``out`` names a folder under the
    service's ``<kb>/fixes/`` (the service writes the winning patch and the fixed agent there and returns
    their paths)."""

    run_id: str = Field(..., max_length=40)
    out: str | None = Field(
        None, max_length=100, description="A folder under the service's <kb>/fixes/ (letters, digits, . _ - /)."
    )

    @field_validator("out")
    @classmethod
    def _inside(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parts = v.split("/")
        if not all(p and p not in (".", "..") and _OUT_PART.fullmatch(p) for p in parts):
            raise ValueError(
                "with --server, --out names a folder under the service's <kb>/fixes/ (e.g. my-run); "
                "the service writes there and prints the path"
            )
        return v


class JobProgressOut(BaseModel):
    """The last progress message of a job, and ``done`` of ``total`` steps when counted."""

    message: str
    done: int
    total: int


class JobOut(BaseModel):
    """A job: ``queued``, ``running``, ``done``, ``failed`` or ``cancelled``, with progress and result."""

    job_id: str
    kind: str
    state: Literal["queued", "running", "done", "failed", "cancelled"]
    params: dict[str, Any]
    owner: str | None
    progress: JobProgressOut
    result: Any = None
    error: str | None = None
    cancel_requested: bool
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
