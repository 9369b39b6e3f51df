"""Ranking root causes for a failure described in words: a small calibrated model over the vote's evidence.

The offline vote (:mod:`remedy.retrieval.offline`) adds up priors on the tags read, stated causes
and retrieved cases; its ranking is a sum of hand-set weights. Tuning those weights and the reader's
phrasings on the dev split of ``bench/data/describe_reports.jsonl`` kept improving dev and not the
held-out splits. This module is the alternative that was tried instead: a logistic model over a
handful of general features of each candidate cause (:func:`cause_features`), fitted on described
failures and the causes their threads settled on:

- the vote's share for the cause (its confidence, its share of the top score, and its rank);
- how strongly the text states it outright (the cause's phrases in :mod:`remedy.retrieval.taxonomy`);
- how much the families the vote favours address it (the cause's families in the taxonomy);
- how close the text is to the cause's one-line description in the taxonomy, against the
  other causes;
- how common the cause is among failure reports (a smoothed log frequency).

Few features and an L2 penalty, judged by leave-one-out on dev (``bench/describe_cv.py``), never by
the dev score it was fitted on. Measured there (53 dev reports), no feature set or penalty beat the
vote's own order (top-1 51%), so no ranker ships: ``remedy diagnose --describe`` keeps the vote's
order, and ``diagnose_description(..., ranker=fit_ranker(...))`` is how the bench scores it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ConfigDict

from remedy.cases.model import Cause, RootCause

from .reading import reading_units
from .taxonomy import CAUSE_TEXT, DIAGNOSABLE, FAMILY_CAUSES

if TYPE_CHECKING:
    from .diagnosis import DiagnosisReport
    from .embedder import Embedder

__all__ = [
    "CAUSES",
    "CAUSE_TEXT",
    "FAMILY_CAUSES",
    "FEATURES",
    "Evidence",
    "CauseRanker",
    "cause_features",
    "evidence_from_report",
    "fit_ranker",
    "rerank_report",
]

#: every root cause a description can be diagnosed with (``unknown`` is not a diagnosis).
CAUSES: tuple[str, ...] = DIAGNOSABLE

#: names of the features :func:`cause_features` returns, in order.
FEATURES: tuple[str, ...] = (
    "vote_confidence",
    "vote_share_of_top",
    "vote_reciprocal_rank",
    "stated",
    "family_support",
    "text_similarity",
    "log_frequency",
)


class Evidence(BaseModel):
    """What the ranker looks at for one description: the reading and the vote, as plain values."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tags: list[str] = []
    stated: list[tuple[str, float]] = []
    cause_scores: dict[str, float] = {}
    family_scores: dict[str, float] = {}
    text_similarity: dict[str, float] = {}

    def vote_ranking(self) -> list[str]:
        """The vote's own order of causes (its confidences, best first)."""
        return [c for c, _ in sorted(self.cause_scores.items(), key=lambda kv: (-kv[1], kv[0]))]


def cause_features(ev: Evidence, cause: str, log_freq: dict[str, float]) -> np.ndarray:
    """The feature vector of ``cause`` for description evidence ``ev`` (order: :data:`FEATURES`)."""
    scores = ev.cause_scores
    top = max(scores.values(), default=0.0)
    order = ev.vote_ranking()
    rank = order.index(cause) + 1 if cause in order else 0
    fam_top = max(ev.family_scores.values(), default=0.0)
    support = sum(s for f, s in ev.family_scores.items() if cause in FAMILY_CAUSES.get(f, ()))
    sims = ev.text_similarity
    mean_sim = sum(sims.values()) / len(sims) if sims else 0.0
    return np.array(
        [
            scores.get(cause, 0.0),
            scores.get(cause, 0.0) / top if top > 0 else 0.0,
            1.0 / rank if rank else 0.0,
            dict(ev.stated).get(cause, 0.0),
            support / fam_top if fam_top > 0 else 0.0,
            sims.get(cause, mean_sim) - mean_sim,
            log_freq.get(cause, min(log_freq.values(), default=0.0)),
        ]
    )


class CauseRanker:
    """A fitted logistic ranker: ``P(cause is right | features)``, causes ranked by it."""

    #: inverse L2 strength (scikit-learn's default; 0.1 and 10 scored no better in leave-one-out on dev).
    DEFAULT_C = 1.0

    def __init__(self, coef: Sequence[float], intercept: float, log_freq: dict[str, float]) -> None:
        if len(coef) != len(FEATURES):
            raise ValueError(f"a cause ranker needs {len(FEATURES)} coefficients, got {len(coef)}")
        self.coef, self.intercept, self.log_freq = np.asarray(coef, dtype=float), float(intercept), dict(log_freq)

    def probabilities(self, ev: Evidence) -> dict[str, float]:
        """Each cause's probability of being one the thread would settle on."""
        out = {}
        for cause in CAUSES:
            z = float(cause_features(ev, cause, self.log_freq) @ self.coef) + self.intercept
            out[cause] = 1.0 / (1.0 + math.exp(-z))
        return out

    def rank(self, ev: Evidence) -> list[str]:
        """Causes best first; ties keep the vote's order, then the name."""
        probs = self.probabilities(ev)
        vote = {c: i for i, c in enumerate(ev.vote_ranking())}
        return sorted(CAUSES, key=lambda c: (-round(probs[c], 9), vote.get(c, len(vote)), c))

    def as_dict(self) -> dict:
        """The fitted values (coefficients, intercept, cause frequencies), for reports."""
        return {
            "coef": [round(float(x), 6) for x in self.coef],
            "intercept": round(self.intercept, 6),
            "log_freq": {c: round(v, 6) for c, v in sorted(self.log_freq.items())},
        }


def log_frequencies(labels: Sequence[Sequence[str]]) -> dict[str, float]:
    """Smoothed log frequency of each cause among report labels (add-one over every cause)."""
    counts = Counter(c for causes in labels for c in set(causes))
    total = sum(counts.values()) + len(CAUSES)
    return {c: math.log((counts.get(c, 0) + 1) / total) for c in CAUSES}


def fit_ranker(evidence: Sequence[Evidence], labels: Sequence[Sequence[str]], c: float = CauseRanker.DEFAULT_C):
    """Fit a :class:`CauseRanker` on described failures and the causes their threads settled on (seeded, deterministic).

    Needs scikit-learn (a bench-time dependency; using a fitted ranker does not).
    """
    from sklearn.linear_model import LogisticRegression

    log_freq = log_frequencies(labels)
    x = np.array([cause_features(ev, cause, log_freq) for ev in evidence for cause in CAUSES])
    y = np.array([cause in causes for causes in labels for cause in CAUSES], dtype=int)
    model = LogisticRegression(C=c, max_iter=1000, random_state=0).fit(x, y)
    return CauseRanker(model.coef_[0], float(model.intercept_[0]), log_freq)


def evidence_from_report(report: DiagnosisReport, embedder: Embedder, text: str) -> Evidence:
    """The ranker's evidence for ``text``: the report's reading and vote, and the text-to-cause similarities."""
    units = reading_units(text) or [text]
    vecs = embedder.encode(units)
    causes = embedder.encode([CAUSE_TEXT[c] for c in CAUSES])
    best = (vecs @ causes.T).max(axis=0)
    return Evidence(
        tags=[r.tag for r in report.reading],
        stated=[(s.cause.value, float(s.similarity)) for s in report.stated],
        cause_scores={
            c.cause.value: float(c.confidence) for c in report.diagnosis.causes if c.cause != RootCause.unknown
        },
        family_scores={f.family.value: float(f.score) for f in report.families},
        text_similarity={c: round(float(s), 6) for c, s in zip(CAUSES, best)},
    )


def rerank_report(report: DiagnosisReport, ranker: CauseRanker, ev: Evidence, max_causes: int = 5) -> DiagnosisReport:
    """``report`` with its causes in the ranker's order, confidences its probabilities.

    A cause the vote had keeps its rationale; one the ranker adds says where it came from.
    """
    probs = ranker.probabilities(ev)
    why = {c.cause.value: c.rationale for c in report.diagnosis.causes}
    causes = [
        Cause(
            cause=RootCause(c),
            confidence=round(probs[c], 4),
            rationale=why.get(c) or "ranked by the description model (how common it is, how close the text is)",
        )
        for c in ranker.rank(ev)[:max_causes]
    ]
    diagnosis = report.diagnosis.model_copy(update={"causes": causes})
    return report.model_copy(update={"diagnosis": diagnosis})
