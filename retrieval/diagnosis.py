"""Diagnosis: what every backend takes in, what it hands back, and how one is chosen by name.

A :class:`Diagnoser` turns a :class:`DiagnosisContext` (the subject, its failure
signature, a few failure episodes, the reward code, similar past cases with
their verified effects, matching rules, and what a fix loop already tried)
into a :class:`DiagnosisReport`: ranked root causes from the taxonomy and
ranked, typed candidate patches ready for ``remedy verify``.

Backends register a factory under a name (``offline``, ``llm``, ``auto``);
``get_diagnoser(name, **params)`` builds one, and nothing outside this registry switches on the
name: a caller asks the backend what it needs (:func:`preflight`, :func:`needs_lm`,
:func:`program_kind`). This module imports ``cases``
only: retrieval reaches it through the :class:`CaseRetriever` protocol.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import Field

from remedy.cases.errors import AlgorithmError, DiagnosisError, PatchRejectedError
from remedy.cases.model import (
    Case,
    Diagnosis,
    EpisodeSummary,
    FrozenModel,
    RemedyFamily,
    RootCause,
    Signature,
    Status,
    Subject,
    patch_family,
)
from remedy.cases.patches.spec import ExplorationBonus, Hyperparameters, Patch, PatchPart
from remedy.cases.verify.budgets import LearnedBudget

__all__ = [
    "ComputeCost",
    "CandidatePatch",
    "DiagnosisReport",
    "SymptomReading",
    "CauseReading",
    "FamilyProposal",
    "UNSPECIFIED",
    "RetrievedCase",
    "Attempt",
    "RuleLike",
    "DiagnosisContext",
    "Diagnoser",
    "CaseRetriever",
    "patch_family",
    "fits_subject",
    "without_noops",
    "register_diagnoser",
    "get_diagnoser",
    "diagnoser_names",
    "preflight",
    "needs_lm",
    "program_kind",
]

ComputeCost = Literal["low", "medium", "high"]

#: env id / algorithm of a subject known only from a description that did not name it.
UNSPECIFIED = "unspecified"


class CandidatePatch(FrozenModel):
    """One proposed fix: a typed patch plus why, what it should do, and what it may break."""

    patch: Patch
    family: RemedyFamily
    rationale: str = ""
    expected_effect: str = ""
    side_effects: str = ""
    compute_cost: ComputeCost = "low"
    cites: list[str] = Field(default_factory=list)
    score: float = 0.0  # the backend's ranking score (offline: summed votes); for display and tuning
    #: the fine-tuning budget to verify it at, learned from similar confirmed fixes (None: the default rule)
    budget: LearnedBudget | None = None


class SymptomReading(FrozenModel):
    """A symptom tag read off a description: how strongly (cosine) and from which clause, or set by the user."""

    tag: str
    similarity: float | None = None  # None when the user set the tag (--tags)
    clause: str = ""


class CauseReading(FrozenModel):
    """A root cause a description states outright ("the learning rate is far too high"): how strongly
    (cosine) and from which clause. Only facts no symptom tag carries are read this way."""

    cause: RootCause
    similarity: float
    clause: str = ""


class FamilyProposal(FrozenModel):
    """A remedy family in the vote's ranking, with the best patch of it that fits the subject.

    ``example`` is None when the family is advised but no concrete patch could be built for the
    subject (reward code or a curriculum for an env the description did not name, say).
    """

    family: RemedyFamily
    score: float
    example: Patch | None = None
    cites: list[str] = Field(default_factory=list)


class DiagnosisReport(FrozenModel):
    """The answer of one diagnosis: signature, ranked causes, ranked candidates, warnings.

    A diagnosis from a description also fills ``reading`` (the tags the text was read as),
    ``stated`` (causes the text states outright) and ``families`` (every remedy family the vote
    ranks, including those no concrete patch could be built for).
    """

    signature: Signature
    diagnosis: Diagnosis
    candidates: list[CandidatePatch] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    reading: list[SymptomReading] = Field(default_factory=list)
    stated: list[CauseReading] = Field(default_factory=list)
    families: list[FamilyProposal] = Field(default_factory=list)

    @property
    def top_cause(self) -> RootCause:
        """The most likely root cause (``unknown`` when there is none)."""
        return self.diagnosis.causes[0].cause if self.diagnosis.causes else RootCause.unknown


@dataclass(frozen=True)
class RetrievedCase:
    """A past case and how similar its signature is to the one being diagnosed (0..1)."""

    case: Case
    similarity: float


class Attempt(FrozenModel):
    """A patch already tried in this fix loop, and what verification said about it."""

    patch: Patch
    status: str  # a Status value, or "failed"
    effect: float | None = None
    case_id: str | None = None

    @property
    def failed(self) -> bool:
        """True when the attempt did not produce a verified improvement."""
        return self.status != Status.improved.value

    def summary(self) -> str:
        """One line: patch, status and effect."""
        eff = "" if self.effect is None else f", effect {self.effect:+.3g}"
        return f"{self.patch.summary()} -> {self.status}{eff}"

    @classmethod
    def from_case(cls, case: Case) -> Attempt:
        """The attempt recorded by a stored case (status ``unverified`` when it has none)."""
        return cls(patch=case.patch, status=case.status, effect=case.effect_value, case_id=case.case_id)


@runtime_checkable
class RuleLike(Protocol):
    """What a diagnoser needs of a (mined, accepted) rule that matched the signature.

    ``recommendation`` may carry ``cause`` / ``root_cause``, ``family``, ``patch``
    and ``confidence`` attributes (or dict keys); absent ones are ignored.
    """

    @property
    def id(self) -> str: ...

    @property
    def conditions(self) -> Sequence[Any]: ...

    @property
    def recommendation(self) -> Any: ...


@dataclass(frozen=True)
class DiagnosisContext:
    """Everything a backend may look at; built by ``remedy.kb.diagnose``."""

    subject: Subject
    signature: Signature
    failure_episodes: tuple[EpisodeSummary, ...] = ()
    reward_code: str = ""
    cases: tuple[RetrievedCase, ...] = ()
    rules: tuple[Any, ...] = ()  # RuleLike
    tried: tuple[Attempt, ...] = ()
    env_description: str = ""
    constraints: tuple[
        str, ...
    ] = ()  # declared safety constraints: expressions over obs/action/info, TRUE WHEN VIOLATED
    notes: tuple[str, ...] = field(default_factory=tuple)  # warnings gathered while building the context
    # a context read from words (``remedy diagnose --describe``): the user's text, and the tags read off it;
    # its signature then has no measured features and the subject may be UNSPECIFIED
    description: str = ""
    reading: tuple[SymptomReading, ...] = ()
    stated: tuple[CauseReading, ...] = ()  # causes the text states outright (``SymptomReader.read_causes``)


class Diagnoser(Protocol):
    """A diagnosis backend: context in, report out. Same context, same report (deterministic backends).

    Callers never test a backend's name; they ask it (through :func:`preflight`, :func:`needs_lm` and
    :func:`program_kind`, which read these optional members, so a backend with ``diagnose`` alone is
    a complete one):

    - ``preflight()``: raise the one clear error now if the backend cannot run (an LM backend without
      a configured LM), before any rollout or upload;
    - ``needs_lm``: True when every diagnosis calls a language model;
    - ``program_kind``: the kind of stored program versions it runs (``remedy optimize`` writes them,
      the KB activates one; ``None``: it runs none).
    """

    name: str

    def diagnose(self, ctx: DiagnosisContext) -> DiagnosisReport: ...


class CaseRetriever(Protocol):
    """Finds similar past cases; the KB facade satisfies it through an adapter in ``remedy.kb``."""

    def similar(
        self,
        signature: Signature,
        k: int,
        *,
        action_space: str | None = None,
        exclude_scenario: str | None = None,
        exclude_ids: Iterable[str] = (),
    ) -> list[RetrievedCase]: ...


def fits_subject(patch: Patch, subject: Subject) -> tuple[bool, str]:
    """Whether ``patch`` fits the subject's traits and algorithm (:func:`remedy.cases.patches.check.check_fit`).

    Returns ``(ok, reason)``; an algorithm that cannot be inspected holds the patch to the env traits only.
    """
    from remedy.cases.patches.check import check_fit  # imports gymnasium: only when a patch is held to a subject

    try:
        try:
            check_fit(patch, subject.traits, subject.algo)
        except AlgorithmError:
            check_fit(patch, subject.traits, None)
    except PatchRejectedError as ex:
        return False, f"{ex.rule}: {ex}" if ex.rule else str(ex)
    return True, ""


def _same(a: Any, b: Any) -> bool:
    numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (a, b))
    return math.isclose(float(a), float(b), rel_tol=1e-9) if numbers else a == b


def without_noops(patch: Patch, subject: Subject) -> Patch | None:
    """``patch`` without the settings ``subject`` already trains with; None when nothing is left.

    A past case's ``gamma=0.99`` fixed a failure trained at 0.5; offered to a run already at 0.99 it changes
    nothing, and verifying it spends a whole attempt on a do-nothing patch. A hyperparameter equal to the run's
    own value (or, when the run does not set it, to the algorithm's constructor default) is dropped, and so is an
    exploration part that only sets the run's own ``ent_coef``. Other parts always change something."""
    from remedy.cases.algos import constructor_defaults  # imports SB3: only when a patch is held to a subject

    try:
        defaults = constructor_defaults(subject.algo)
    except (AlgorithmError, ImportError):
        defaults = {}
    missing = object()

    def current(name: str) -> Any:
        return subject.hyperparams.get(name, defaults.get(name, missing))

    parts: list[PatchPart] = []
    dropped = False
    for part in patch.parts:
        if isinstance(part, Hyperparameters):
            kept = {k: v for k, v in part.changes.items() if not _same(v, current(k))}
            dropped |= len(kept) < len(part.changes)
            if kept:
                parts.append(part if len(kept) == len(part.changes) else part.model_copy(update={"changes": kept}))
            continue
        if isinstance(part, ExplorationBonus) and not part.count_bonus and _same(part.ent_coef, current("ent_coef")):
            dropped = True
            continue
        parts.append(part)
    if not dropped:
        return patch
    return Patch(parts=parts) if parts else None


# ---- registry -------------------------------------------------------------------------------

_FACTORIES: dict[str, Callable[..., Diagnoser]] = {}
_BUILTIN = {
    "offline": "remedy.retrieval.offline",
    "llm": "remedy.retrieval.llm",
    "auto": "remedy.retrieval.llm",
}


def register_diagnoser(name: str, factory: Callable[..., Diagnoser]) -> None:
    """Make ``get_diagnoser(name)`` build a backend with ``factory(**params)``."""
    _FACTORIES[name] = factory


def diagnoser_names() -> list[str]:
    """Names of the registered backends (built-ins included)."""
    return sorted(set(_FACTORIES) | set(_BUILTIN))


def preflight(backend: Diagnoser) -> None:
    """Fail now, with the backend's own error, when ``backend`` cannot run (see :class:`Diagnoser`)."""
    check = getattr(backend, "preflight", None)
    if check is not None:
        check()


def needs_lm(backend: Diagnoser) -> bool:
    """Whether every diagnosis by ``backend`` calls a language model."""
    return bool(getattr(backend, "needs_lm", False))


def program_kind(backend: Diagnoser) -> str | None:
    """The kind of stored program versions ``backend`` runs (``offline``, ``llm``), or None."""
    return getattr(backend, "program_kind", None)


def get_diagnoser(name: str, **params: Any) -> Diagnoser:
    """Build the backend registered under ``name`` with its constructor ``params``."""
    if name not in _FACTORIES and name in _BUILTIN:
        importlib.import_module(_BUILTIN[name])  # registers itself on import
    factory = _FACTORIES.get(name)
    if factory is None:
        raise DiagnosisError(f"unknown diagnoser '{name}'; choose one of {', '.join(diagnoser_names())}")
    return factory(**params)
