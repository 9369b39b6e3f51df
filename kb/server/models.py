"""Request and response bodies of the HTTP API (pydantic), shared with the CLI's ``--json`` shapes.

``Hit`` is what ``remedy query --json`` prints for each case; ``StatsOut`` what
``remedy kb stats --json`` prints; a case is the case model's own JSON.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from remedy.cases.model import Signature, Subject
from remedy.miners.model import Rule

__all__ = [
    "Health",
    "QueryIn",
    "SimilarIn",
    "Hit",
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
]

Mode = Literal["hybrid", "vector", "text"]
Space = Literal["discrete", "continuous"]
DiagnoserName = Literal["offline", "llm", "auto"]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt filter is an error, not a silent no-op


class Health(BaseModel):
    """``GET /health``: the service is up; its Remedy version."""

    status: Literal["ok"] = "ok"
    version: str


class ErrorOut(BaseModel):
    """Every error response: the one-line message, the error class, and per-record problems for imports."""

    detail: str
    error: str
    problems: list[dict[str, Any]] = Field(default_factory=list)


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


class SimilarIn(_Filters):
    """``POST /v1/similar``: the cases nearest to a failure signature."""

    signature: Signature


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
    patch: dict[str, Any]
    effect: dict[str, Any] | None
    literature: dict[str, Any] | None
    case: dict[str, Any] | None = None


class ImportProblem(BaseModel):
    """A record that was refused: its 1-based line (JSONL) or array index + 1, and why."""

    line: int
    message: str


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
    subject: Subject | None = None
    signature: Signature | None = None
    describe: str | None = Field(
        None, min_length=1, max_length=4000, description="The failure in words (what `--describe` takes)."
    )
    env: str | None = Field(None, max_length=200, description="With describe: the env id, if known.")
    algo: str | None = Field(None, max_length=100, description="With describe: the algorithm, if known.")
    action_space: Space | None = Field(None, description="With describe: the action space, if known.")
    tags: list[str] | None = Field(
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


class MineOut(BaseModel):
    """``POST /v1/mine``: the shape of `remedy mine --json`: the kept rules and what storing them changed."""

    attempts: int = Field(description="Measured attempts at their final verdict (what support counts).")
    tested: int = Field(description="Candidate rules tested (the Benjamini–Hochberg family).")
    rules: list[Rule]
    new: list[str] = Field(description="Ids stored as new proposed rules.")
    updated: list[str] = Field(description="Ids whose evidence was updated (status and reviews kept).")
    flagged: dict[str, str] = Field(description="Ids flagged by this run, with how the evidence turned.")


class VerifyJobIn(_In):
    """``POST /v1/jobs/verify``: fine-tune treatment vs control on an uploaded run, store the case."""

    run_id: str = Field(..., max_length=40)
    patch: dict[str, Any] = Field(..., description="A patch: one part or {'parts': [...]}, as in a patch file.")
    seeds: int = Field(3, ge=1, le=20)
    budget: int | None = Field(None, ge=1, le=50_000_000, description="Env steps per arm (default 20% of train_steps).")
    episodes: int = Field(20, ge=1, le=500)
    n_envs: int = Field(8, ge=1, le=64)
    force: bool = False


class FixJobIn(_In):
    """``POST /v1/jobs/fix``: the closed loop on an uploaded run; every attempt is stored."""

    run_id: str = Field(..., max_length=40)
    rounds: int = Field(3, ge=1, le=20)
    candidates: int = Field(2, ge=1, le=10)
    seeds: int = Field(3, ge=1, le=20)
    #: training seeds per arm of a confirmation on fresh seeds (``remedy fix --confirm-seeds``)
    confirm_seeds: int = Field(8, ge=2, le=40)
    #: two-sided level at which a screen passes (``remedy fix --screen-confidence``)
    screen_confidence: float = Field(0.8, ge=0.5, le=0.99)
    budget: int | None = Field(None, ge=1, le=50_000_000)
    diagnoser: DiagnoserName = "offline"
    #: race each round's candidates (stage 1 on ``race_fraction`` of the budget and ``race_seeds`` seeds)
    race: bool = True
    race_fraction: float = Field(1 / 3, gt=0, lt=1)
    race_seeds: int = Field(2, ge=2, le=20)


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
