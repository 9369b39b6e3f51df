"""The remedy ranker's read side: P(confirmed fix | failure, remedy), and reordering a diagnosis with it.

The offline vote (:mod:`remedy.retrieval.offline`) counts wins and lets failures only subtract. The
ranker is the learner that uses every outcome: a regularized logistic model fitted on every measured
attempt (``remedy.optimizer.ranker`` fits it; ``remedy optimize --backend ranker`` versions and
promotes it) over the features of :func:`attempt_features`:

- the failure: the signature's numeric features (signed ``log1p``), its symptom tags, the env's
  traits (action space, reward density, observation size) and the algorithm;
- the remedy: its patch family, its part kinds and numeric parameters (signed ``log1p``), the root
  cause it stands for and the vote's confidence and rank for that cause;
- interactions (family x tag, family x algorithm, family x action space, cause x tag), so what
  works can depend on the failure, not only on how often a family works anywhere.

A fitted ranker is plain JSON (feature names, centring, scales, coefficients): no pickle, and
:class:`RemedyRanker` validates sizes and finiteness when a stored version is read, because a
model file is untrusted input like any other.

:func:`rerank` orders a report's candidates by their probability and its causes by the best
probability among the candidates that address them (causes no candidate addresses follow, in
the vote's order). The vote's own scores stay in the rationales; ties keep the vote's order.

:func:`family_outcomes` counts measured attempts by patch family at their final verdict (attempts,
confirmed improved, fixed), the same reading of outcomes the fit uses; a fitted ranker keeps those
counts over its training attempts in ``meta["families"]`` (:meth:`RemedyRanker.experience`), and the
LLM diagnoser shows them beside the ranked remedies (:mod:`remedy.retrieval.llm_io`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, ValidationError, model_validator

from remedy.cases.model import (
    Case,
    Cause,
    RemedyFamily,
    RootCause,
    Signature,
    Source,
    Stage,
    Status,
    Subject,
    patch_family,
)
from remedy.cases.outcomes import final_verdicts
from remedy.cases.patches.spec import Patch

from .diagnosis import DiagnosisReport
from .priors import PRIORS

__all__ = [
    "RemedyRanker",
    "Outcomes",
    "attempt_features",
    "family_causes",
    "cause_for",
    "rerank",
    "final_status",
    "count_outcomes",
    "family_outcomes",
    "MAX_FEATURES",
]

#: most features a stored ranker may carry (a bound on what a version read from the KB can allocate)
MAX_FEATURES = 50_000


@cache
def family_causes() -> dict[RemedyFamily, frozenset[RootCause]]:
    """Which root causes each patch family addresses, read off the prior rulebook's templates."""
    out: dict[RemedyFamily, set[RootCause]] = defaultdict(set)
    for rule in PRIORS:
        for tmpl in rule.templates:
            out[tmpl.family].update(cause for cause, _ in rule.causes)
    return {f: frozenset(cs) for f, cs in out.items()}


def cause_for(family: RemedyFamily, ranked: list[RootCause]) -> RootCause | None:
    """The cause an attempt of ``family`` stands for: the best-ranked of ``ranked`` it addresses, else the top one."""
    ranked = [c for c in ranked if c != RootCause.unknown]
    addressed = family_causes().get(family, frozenset())
    return next((c for c in ranked if c in addressed), ranked[0] if ranked else None)


def _slog(x: float) -> float:
    """Signed log1p: keeps the order, tames returns of -7,000 next to rates in [0, 1]."""
    return math.copysign(math.log1p(abs(x)), x) if math.isfinite(x) else 0.0


def _patch_params(patch: Patch) -> dict[str, float]:
    out: dict[str, float] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, bool):
            out[prefix] = float(value)
        elif isinstance(value, int | float):
            out[prefix] = _slog(float(value))
        elif isinstance(value, Mapping):
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)

    for part in patch.parts:
        data = part.model_dump(mode="json")
        out[f"kind={data.get('kind')}"] = 1.0
        for k, v in data.items():
            if k != "kind":
                walk(f"param:{data.get('kind')}.{k}", v)
    return out


def attempt_features(
    subject: Subject,
    signature: Signature,
    patch: Patch,
    family: RemedyFamily,
    cause: RootCause | None,
    cause_confidence: float = 0.0,
    cause_rank: int = 0,
) -> dict[str, float]:
    """The feature dict of one remedy for one failure (names as in the module docstring)."""
    t = subject.traits
    fam, algo, space = family.value, subject.algo, t.action_space.value
    cname = cause.value if cause is not None else "none"
    x: dict[str, float] = {f"f:{k}": _slog(float(v)) for k, v in signature.features.items()}
    x.update({f"tag={s}": 1.0 for s in signature.symptoms})
    x.update({f"algo={algo}": 1.0, f"space={space}": 1.0, f"density={t.reward_density.value}": 1.0})
    x["obs_dim"] = _slog(float(t.obs_dim or 0))
    x.update({f"family={fam}": 1.0, f"cause={cname}": 1.0, f"family={fam}&algo={algo}": 1.0})
    x[f"family={fam}&space={space}"] = 1.0
    x["cause_confidence"] = float(cause_confidence)
    x["cause_reciprocal_rank"] = 1.0 / cause_rank if cause_rank > 0 else 0.0
    for s in signature.symptoms:
        x[f"family={fam}&tag={s}"] = 1.0
        x[f"cause={cname}&tag={s}"] = 1.0
    x.update(_patch_params(patch))
    return x


def final_status(verdict: Case) -> str:
    """An attempt's final status as the ranker learns it: ``improved`` only from a confirmation on fresh
    seeds (a screen that says ``improved`` without one is ``inconclusive``); ``verdict`` must be measured."""
    v = verdict.verification
    if v is None:
        raise ValueError(f"case {verdict.case_id} has no verification")
    if v.status == Status.improved and v.stage != Stage.confirm:
        return Status.inconclusive.value
    return v.status.value


class Outcomes(BaseModel):
    """How the measured attempts of one remedy family ended (each attempt once, at its final verdict)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    attempts: NonNegativeInt = 0
    improved: NonNegativeInt = 0  # confirmed on fresh seeds (the ranker's positive label)
    fixed: NonNegativeInt = 0  # the agent then met its success definition (``verification.fixed``)

    def text(self) -> str:
        """``3 attempts, 1 confirmed improved, 0 fixed``."""
        return f"{self.attempts} attempt{'s' if self.attempts != 1 else ''}, {self.improved} confirmed improved, {self.fixed} fixed"


def count_outcomes(attempts: Iterable[tuple[RemedyFamily, str, bool]]) -> dict[RemedyFamily, Outcomes]:
    """``(family, final status, fixed)`` per attempt, counted by family (families in first-seen order)."""
    counts: dict[RemedyFamily, list[int]] = {}
    for family, status, fixed in attempts:
        n = counts.setdefault(family, [0, 0, 0])
        n[0] += 1
        n[1] += status == Status.improved.value
        n[2] += bool(fixed)
    return {f: Outcomes(attempts=a, improved=i, fixed=x) for f, (a, i, x) in counts.items()}


def family_outcomes(cases: Iterable[Case]) -> dict[RemedyFamily, Outcomes]:
    """The measured attempts among ``cases`` (bundled examples and unverified cases skipped) by patch family."""
    measured = [c for c in cases if c.verification is not None and c.source != Source.example]
    return count_outcomes(
        (patch_family(screen.patch), final_status(final), bool(final.verification and final.verification.fixed))
        for screen, final in final_verdicts(measured)
    )


class RemedyRanker(BaseModel):
    """A fitted ranker as stored in the KB: ``P = sigmoid(coef . (x - center) / scale + intercept)``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    names: list[str] = Field(max_length=MAX_FEATURES)
    center: list[float] = Field(max_length=MAX_FEATURES)
    scale: list[float] = Field(max_length=MAX_FEATURES)
    coef: list[float] = Field(max_length=MAX_FEATURES)
    intercept: float = Field(allow_inf_nan=False)
    label: str = "improved"  # what a positive was: a confirmed ``improved``, or ``fixed``
    #: the stored version's id once it is one (set when read back from the KB)
    version: str | None = None
    #: how it was fitted and validated (sizes, weights of each outcome, chosen C, out-of-fold scores)
    meta: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> RemedyRanker:
        n = len(self.names)
        if not (len(self.center) == len(self.scale) == len(self.coef) == n):
            raise ValueError(f"ranker arrays differ in length ({n} names)")
        values = [*self.center, *self.scale, *self.coef]
        if not all(math.isfinite(v) for v in values) or any(s <= 0 for s in self.scale):
            raise ValueError("ranker values must be finite and scales positive")
        return self

    def experience(self) -> dict[RemedyFamily, Outcomes]:
        """The outcomes of the attempts it was fitted on, by family (empty for versions stored without them)."""
        raw = self.meta.get("families")
        if not isinstance(raw, Mapping):
            return {}
        out = {}
        for name, counts in raw.items():
            try:  # meta is untrusted input like the rest of a stored version: a bad entry is skipped
                out[RemedyFamily(name)] = Outcomes.model_validate(counts)
            except (ValueError, ValidationError):
                continue
        return out

    def _index(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.names)}

    def probability(self, features: Mapping[str, float]) -> float:
        """P(confirmed fix) for one feature dict; features the ranker never saw count nothing."""
        index, coef = self._index(), np.asarray(self.coef)
        x = (-np.asarray(self.center)) / np.asarray(self.scale)  # every absent feature sits at 0
        for name, value in features.items():
            if (i := index.get(name)) is not None:
                x[i] = (value - self.center[i]) / self.scale[i]
        z = float(x @ coef) + self.intercept
        return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, z))))


def rerank(report: DiagnosisReport, ranker: RemedyRanker, subject: Subject, causes: str = "blend") -> DiagnosisReport:
    """``report`` with candidates ordered by the ranker's P(confirmed fix), and causes reordered.

    ``causes="blend"`` (the default): each cause's vote confidence times its best candidate's
    probability relative to the mean of those (a cause no candidate addresses keeps factor 1);
    ``"ranker"``: by the best candidate's probability alone (learning curve: it lost to the vote).
    """
    vote = report.diagnosis.causes
    ranked = [c.cause for c in vote]
    conf = {c.cause: c.confidence for c in vote}
    best: dict[RootCause, float] = {}
    scored = []
    for position, cand in enumerate(report.candidates):
        cause = cause_for(cand.family, ranked)
        rank = ranked.index(cause) + 1 if cause in ranked else 0
        confidence = conf.get(cause, 0.0) if cause is not None else 0.0
        x = attempt_features(subject, report.signature, cand.patch, cand.family, cause, confidence, rank)
        p = ranker.probability(x)
        if cause is not None:
            best[cause] = max(best.get(cause, 0.0), p)
        note = f" [ranker: P(confirmed fix) {p:.3f}, vote score {cand.score:.3f}]"
        scored.append(
            (-round(p, 9), position, cand.model_copy(update={"score": round(p, 4), "rationale": cand.rationale + note}))
        )
    candidates = [c for _, _, c in sorted(scored, key=lambda s: s[:2])]
    order = sorted(range(len(vote)), key=lambda i: (-round(_cause_score(vote[i], best, causes), 9), i))
    ordered = [_noted(vote[i], best.get(vote[i].cause)) for i in order]
    tag = f"+ranker:{ranker.version or 'unsaved'}"
    diagnosis = report.diagnosis.model_copy(
        update={"causes": ordered, "program_version": f"{report.diagnosis.program_version}{tag}"}
    )
    return report.model_copy(update={"diagnosis": diagnosis, "candidates": candidates})


def _cause_score(cause: Cause, best: dict[RootCause, float], mode: str) -> float:
    if mode == "ranker":
        return best.get(cause.cause, -1.0)
    mean = sum(best.values()) / len(best) if best else 1.0
    return cause.confidence * (best[cause.cause] / mean if cause.cause in best and mean > 0 else 1.0)


def _noted(cause: Cause, p: float | None) -> Cause:
    if p is None:
        return cause
    return cause.model_copy(update={"rationale": f"{cause.rationale}; ranker: best remedy P(confirmed fix) {p:.3f}"})
