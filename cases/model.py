"""The case: one diagnose-fix-verify episode, as frozen pydantic models.

Every attempt becomes a case, failed ones too. The parts follow the data flow of docs/architecture.md:
subject, evidence, signature, diagnosis, patch, verification, provenance.
Example cases (``source == "example"``) carry no verification; any effect they
mention is a :class:`LiteratureEffect` that names its source.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .patches.spec import Patch

__all__ = [
    "SCHEMA_VERSION",
    "FrozenModel",
    "RootCause",
    "RemedyFamily",
    "ActionSpaceType",
    "RewardDensity",
    "Status",
    "Stage",
    "Source",
    "EnvTraits",
    "Subject",
    "EpisodeSummary",
    "Evidence",
    "Signature",
    "Cause",
    "Diagnosis",
    "Effect",
    "RaceStage",
    "Verification",
    "LiteratureEffect",
    "Provenance",
    "Case",
    "new_case_id",
    "CASE_ID_PATTERN",
    "patch_family",
]

#: what a case id may hold: every id Remedy makes (``c-`` + hex) and every shipped one fits
CASE_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")

#: Version of the case model's JSON shape; bump with a migration in the store.
SCHEMA_VERSION = 1


class RootCause(StrEnum):
    """Root-cause taxonomy. Extend with care, never rename; each member's description, phrases and remedy
    families are its entry in ``remedy.retrieval.taxonomy`` (``tests/retrieval/test_taxonomy.py``)."""

    reward_misspecification = "reward_misspecification"
    sparse_reward = "sparse_reward"
    reward_hacking = "reward_hacking"
    insufficient_exploration = "insufficient_exploration"
    premature_convergence = "premature_convergence"
    undertraining = "undertraining"
    unstable_optimization = "unstable_optimization"
    observation_scaling = "observation_scaling"
    action_jitter = "action_jitter"
    safety_violation = "safety_violation"
    time_limit_misconfiguration = "time_limit_misconfiguration"
    generalization_gap = "generalization_gap"
    unknown = "unknown"


class RemedyFamily(StrEnum):
    """Families of patches; one per patch-part ``kind``."""

    reward_shaping = "reward_shaping"
    action_smoothness = "action_smoothness"
    action_magnitude = "action_magnitude"
    hyperparameters = "hyperparameters"
    normalization = "normalization"
    time_limit = "time_limit"
    frame_stack = "frame_stack"
    action_repeat = "action_repeat"
    exploration_bonus = "exploration_bonus"
    curriculum = "curriculum"
    safety_constraint = "safety_constraint"
    training_budget = "training_budget"


class ActionSpaceType(StrEnum):
    """Whether the env's actions are discrete or continuous."""

    discrete = "discrete"
    continuous = "continuous"


class RewardDensity(StrEnum):
    """Whether the env pays reward most steps (dense) or rarely (sparse)."""

    dense = "dense"
    sparse = "sparse"


class Status(StrEnum):
    """Outcome of a verification (docs/verification.md)."""

    improved = "improved"
    no_effect = "no_effect"
    worse = "worse"
    reward_hacking = "reward_hacking"
    failed = "failed"
    #: not enough evidence for a verdict: fewer than 2 training seeds in a trained arm, or a
    #: screen that cleared but was not (yet) confirmed on fresh seeds; the reason says which
    inconclusive = "inconclusive"
    #: dropped at stage 1 of a race (cases.verify.racing): measured on a share of the budget and few
    #: seeds only, so no verdict — never a ``no_effect`` measured at the full budget
    stopped_early = "stopped_early"


class Stage(StrEnum):
    """Which measurement a verification is: a screen, or the confirmation of a screen on fresh seeds."""

    screen = "screen"  # only a confirmation may end ``improved``
    confirm = "confirm"
    #: stage 1 of a race: a share of the budget on few seeds, to drop candidates that cannot win
    race = "race"


class Source(StrEnum):
    """Where a case came from."""

    example = "example"  # hand-written from the literature; no measurements of ours
    verified = "verified"  # produced by `remedy verify` / `remedy fix`
    bench = "bench"  # produced by `remedy bench run` on a fault scenario
    imported = "imported"  # came from another team's export


class FrozenModel(BaseModel):
    """Base of Remedy's domain values: immutable, unknown fields refused.

    NaN features are meaningful ("not measurable"); they survive JSON round trips as strings.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")


class EnvTraits(FrozenModel):
    """Coarse facts about the env that retrieval filters on."""

    action_space: ActionSpaceType
    obs_dim: int = Field(ge=0)
    action_dim: int = Field(ge=0, description="number of discrete actions, or the Box dimension")
    reward_density: RewardDensity = RewardDensity.dense


class Subject(FrozenModel):
    """The agent under treatment: env, algorithm, training, and what success means."""

    env_id: str
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    algo: str
    hyperparams: dict[str, Any] = Field(default_factory=dict)
    train_steps: int | None = Field(default=None, ge=0)
    checkpoint_sha256: str | None = None
    reward_ref: str | None = None
    success: str = ""
    traits: EnvTraits

    @field_validator("env_kwargs", "hyperparams")
    @classmethod
    def _finite_numbers(cls, v: dict[str, Any]) -> dict[str, Any]:
        # JSON cannot hold inf/NaN: such a value would come back from the store as a string.
        stack = [("", v)]
        while stack:
            where, node = stack.pop()
            if isinstance(node, float) and not math.isfinite(node):
                raise ValueError(f"non-finite number {node} at '{where}'; use a finite value")
            if isinstance(node, dict):
                stack.extend((f"{where}.{k}" if where else str(k), x) for k, x in node.items())
            elif isinstance(node, (list, tuple)):
                stack.extend((f"{where}.{i}" if where else str(i), x) for i, x in enumerate(node))
        return v


class EpisodeSummary(FrozenModel):
    """One evaluation episode, summarized."""

    seed: int | None = Field(None, ge=0)
    ret: float
    length: int = Field(ge=0)
    termination: str  # "terminated", "truncated", or an env-specific reason
    success: bool | None = None


class Evidence(FrozenModel):
    """What was observed of the agent before treatment (rollouts and logs), summarized."""

    n_episodes: int = Field(ge=0)
    episodes: list[EpisodeSummary] = Field(default_factory=list)
    has_training_logs: bool = False
    notes: str = ""


class Signature(FrozenModel):
    """Failure signature: named numeric features, symptom tags, and a summary for retrieval."""

    features: dict[str, float] = Field(default_factory=dict)
    symptoms: list[str] = Field(default_factory=list)
    summary: str


class Cause(FrozenModel):
    """One ranked root cause with confidence and why."""

    cause: RootCause
    confidence: float = Field(ge=0, le=1)
    rationale: str = ""


class Diagnosis(FrozenModel):
    """Root causes ranked, and what produced them."""

    causes: list[Cause] = Field(default_factory=list)
    backend: str = "human"
    program_version: str | None = None
    cited_cases: list[str] = Field(default_factory=list)
    cited_rules: list[str] = Field(default_factory=list)

    @property
    def root_causes(self) -> list[RootCause]:
        """Causes in rank order, labels only."""
        return [c.cause for c in self.causes]


class Effect(FrozenModel):
    """Treatment minus control on the original task metric, with a bootstrap CI."""

    # Finite only: a NaN effect would compare as neither improved nor worse and print as bare NaN.
    metric: str  # e.g. "return_iqm" or "success_rate"
    treatment: float = Field(allow_inf_nan=False)
    control: float = Field(allow_inf_nan=False)
    diff: float = Field(allow_inf_nan=False)
    ci_low: float = Field(allow_inf_nan=False)
    ci_high: float = Field(allow_inf_nan=False)
    prob_improvement: float | None = Field(None, ge=0, le=1)
    #: exact one-sided permutation p-value of the difference over seed values (treatment above control),
    #: set only where enough arrangements exist to reach the interval's one-sided level; None elsewhere
    p_value: float | None = Field(None, ge=0, le=1)
    confidence_level: float = Field(0.95, gt=0, lt=1)
    #: how the interval was computed: "welch_seeds" (seed-level Welch t), or the first
    #: episode-level "bootstrap" that cases stored before it carry
    method: str = "bootstrap"

    @model_validator(mode="after")
    def _ci_is_ordered(self) -> Effect:
        if self.ci_low > self.ci_high:
            raise ValueError(f"ci_low ({self.ci_low}) must not exceed ci_high ({self.ci_high})")
        return self

    def text(self) -> str:
        """``+0.45 [+0.2, +0.7] success_rate``: the difference, its interval and the metric."""
        return f"{self.diff:+.3g} [{self.ci_low:+.3g}, {self.ci_high:+.3g}] {self.metric}"


class RaceStage(FrozenModel):
    """Stage 1 of a race (cases.verify.racing): one candidate measured on a share of the budget and few seeds."""

    effect: Effect | None = None
    seeds: int = Field(0, ge=0)
    seed_base: int = 0
    #: per-arm fine-tuning steps at stage 1, and the full budget the survivors go on to
    budget_steps: int = Field(default=0, ge=0)
    full_budget_steps: int = Field(default=0, ge=0)
    #: env steps this candidate's stage 1 trained (its treatments, and controls no one had trained yet)
    env_steps: int = Field(default=0, ge=0)
    wall_time_s: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    #: diff / half-width of the CI (None: no effect); candidates are ranked on it, 1 = best
    score: float | None = Field(default=None, allow_inf_nan=False)
    rank: int = Field(default=0, ge=0)
    of: int = Field(default=0, ge=0)
    survived: bool = False
    #: why it was kept or dropped
    rule: str = ""
    controls: list[str] = Field(default_factory=list)


class Verification(FrozenModel):
    """Result of fine-tuning with the patch (treatment) against without (control)."""

    status: Status
    effect: Effect | None = None
    secondary: dict[str, Effect] = Field(default_factory=dict)
    seeds: int = Field(0, ge=0)
    budget_steps: int = Field(default=0, ge=0)
    env_steps: int = Field(default=0, ge=0)
    wall_time_s: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    safety_violations: dict[str, float] = Field(default_factory=dict)
    reason: str = ""
    #: the primary metric per training seed, by arm ("treatment", "control"), in seed order
    per_seed: dict[str, list[float]] = Field(default_factory=dict)
    #: screen or confirmation; cases stored before the distinction were single screens
    stage: Stage = Stage.screen
    #: first training seed (seeds ``seed_base .. seed_base + seeds - 1``) and the arms' evaluation seed
    seed_base: int = 0
    eval_seed: int | None = None
    #: a screen whose primary CI cleared zero (it stays ``inconclusive`` until confirmed)
    passed_screen: bool = False
    #: on a confirmation: the case id of the screen it confirms
    confirms: str | None = None
    #: what was compared: the patch against a control with the same env steps, or (a pure
    #: training-budget patch) more training against the unpatched checkpoint
    comparison: Literal["same_budget_control", "budget_vs_none"] = "same_budget_control"
    #: where ``budget_steps`` came from: "user" (--budget), "kb" (learned from the confirmed fixes in
    #: ``budget_cases``), "scenario" (declared by the fault scenario), "prior" (a fraction of training),
    #: or "patch" (a pure budget patch: its own extra steps); None on cases stored before it was recorded.
    #: A stage-1 (race) case trains a share of its full budget and records the FULL budget's source
    budget_source: Literal["user", "kb", "scenario", "prior", "patch"] | None = None
    budget_cases: list[str] = Field(default_factory=list)
    #: the pre-training trajectory check of a reward-changing patch: "passed", "refused",
    #: "forced" (refused, trained anyway), "undecidable" (nothing to order); None when not run
    preference: Literal["passed", "refused", "forced", "undecidable"] | None = None
    #: keys of the shared control arms this measurement used (cases.verify.controls); empty: its own controls
    controls: list[str] = Field(default_factory=list)
    #: how many of them an earlier verification had trained (reused here at no training cost)
    controls_reused: int = Field(default=0, ge=0)
    #: stage 1 of a race this candidate ran (a survivor's screen, or a ``stopped_early`` case); None: not raced
    race: RaceStage | None = None
    #: training seeds whose arms (both) went on from their stage-1 runs rather than starting from the checkpoint
    resumed_seeds: list[int] = Field(default_factory=list)
    #: the agent now works (cases.verify.fixed): an ``improved`` confirmation whose treatment meets the success
    #: definition or closes the declared share of the patient's gap to it; None: not judged (older records)
    fixed: bool | None = None
    #: share of the gap between the patient's own value and its success threshold the treatment closed
    gap_closed: float | None = Field(default=None, allow_inf_nan=False)


class LiteratureEffect(FrozenModel):
    """An effect reported in the literature; never presented as our measurement."""

    claim: str
    source: str


class Provenance(FrozenModel):
    """Versions and time stamps of what produced the case."""

    remedy_version: str = ""
    versions: dict[str, str] = Field(default_factory=dict)
    lm: str | None = None
    program_version: str | None = None
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))


class Case(FrozenModel):
    """One diagnose-fix-verify episode."""

    case_id: str
    source: Source
    subject: Subject
    evidence: Evidence | None = None
    signature: Signature
    diagnosis: Diagnosis | None = None
    patch: Patch
    verification: Verification | None = None
    literature: LiteratureEffect | None = None
    provenance: Provenance = Field(default_factory=Provenance)
    scenario: str | None = None  # fault-scenario name, so benchmarks can exclude their own cases
    parent_id: str | None = None  # previous round in a fix loop
    tags: list[str] = Field(default_factory=list)

    @field_validator("case_id")
    @classmethod
    def _id_is_simple(cls, v: str) -> str:
        # ids reach file names, URLs, SQL filters and terminals: no control, bidi, path or markup characters
        if not CASE_ID_PATTERN.fullmatch(v) or not v.strip("."):
            raise ValueError(
                f"case_id {ascii(v)[:80]} is not allowed: use 1-128 ASCII letters, digits, '.', '_', ':' or '-' "
                "(not only dots), e.g. 'c-lander-hover-01'"
            )
        return v

    @property
    def status(self) -> str:
        """Verification status, ``literature`` for cited examples, else ``unverified``."""
        if self.verification is not None:
            return self.verification.status.value
        return "literature" if self.literature is not None else "unverified"

    @property
    def effect_value(self) -> float | None:
        """The measured effect difference, if any."""
        v = self.verification
        return v.effect.diff if v is not None and v.effect is not None else None

    @property
    def root_causes(self) -> list[RootCause]:
        """Diagnosed root causes in rank order (empty if undiagnosed)."""
        return self.diagnosis.root_causes if self.diagnosis else []

    def to_json(self) -> str:
        """Canonical JSON text of the case."""
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> Case:
        """Parse and validate a case from JSON text."""
        return cls.model_validate_json(text)


def new_case_id(*parts: Any) -> str:
    """A short, deterministic id from the given parts (same inputs, same id)."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return "c-" + hashlib.sha256(blob).hexdigest()[:16]


def patch_family(patch: Patch) -> RemedyFamily:
    """The family of a patch: that of its first part (families are named after part kinds)."""
    return RemedyFamily(patch.parts[0].kind)
