"""Fitting the remedy ranker on every measured attempt, wins and failures alike.

One row per attempt (a screen with its confirmations folded in, at its final verdict:
:func:`remedy.cases.outcomes.final_verdicts`), described by what the diagnoser saw when it proposed
the patch (the screen's subject, signature and diagnosis) and the patch itself
(:func:`remedy.retrieval.remedy_ranker.attempt_features`). The label is **a confirmed fix**:
``improved`` from a confirmation on fresh seeds (a screen that says ``improved`` without one is
``inconclusive``). ``label="fixed"`` uses ``verification.fixed`` instead (the agent now meets its
success definition; :mod:`remedy.cases.verify.fixed`); attempts never judged for it (older records)
count as not fixed.

Every outcome counts, each with an explicit weight (:class:`RankerSettings`):

- ``improved``, ``no_effect``, ``worse``, ``reward_hacking`` and ``failed`` (a crashed or refused
  patch: it did not end in a fix) are full-weight rows;
- ``inconclusive`` (a screen that did not clear, or cleared and was never confirmed) is a negative
  at weight 0.5: the attempt did not end in a confirmed fix, but on a few seeds;
- ``stopped_early`` (a race stopped it on a share of the budget) is a negative at weight 0.25: the
  least evidence of all, and earlier racing rules dropped real slow-acting fixes (docs/verification.md).

The model is scikit-learn's L2 logistic regression on standardized features; its strength ``C`` is
chosen by grouped cross-validation (``GroupKFold`` by scenario or run, so a patient's attempts are
never on both sides) on weighted log loss, which is what keeps the probabilities calibrated; the
out-of-fold Brier score and log loss sit next to the base rate's in ``meta``. The fit is
deterministic for a given seed. With no positive (or no negative) row there is nothing to learn:
the ranker is the smoothed base rate (all coefficients 0), which leaves the vote's order unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from pydantic import ValidationError

from remedy.cases.errors import OptimizeError
from remedy.cases.model import Case, RemedyFamily, Source, Status
from remedy.cases.outcomes import final_verdicts
from remedy.cases.store import CaseStore
from remedy.retrieval.diagnosis import patch_family
from remedy.retrieval.offline import OfflineDiagnoser, OfflineSettings
from remedy.retrieval.remedy_ranker import (
    Outcomes,
    RemedyRanker,
    attempt_features,
    cause_for,
    count_outcomes,
    final_status,
)

from .dataset import example_group
from .metric import score_prediction
from .offline import Prepared
from .versions import ProgramStore

__all__ = [
    "AttemptRow",
    "RankerSettings",
    "attempt_rows",
    "fit_ranker",
    "active_ranker",
    "evaluate_ranked",
    "RANKER_OPTIMIZER",
]

#: the optimizer name stored with ranker versions
RANKER_OPTIMIZER = "logistic-l2"


@dataclass(frozen=True)
class RankerSettings:
    """How outcomes become rows, and the search over the regularization strength."""

    label: str = "improved"  # or "fixed"
    inconclusive_weight: float = 0.5
    stopped_early_weight: float = 0.25
    cs: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3, 1.0)
    folds: int = 5
    seed: int = 0

    def weight(self, status: str) -> float:
        """The row weight of an attempt with this final status."""
        if status == Status.inconclusive.value:
            return self.inconclusive_weight
        if status == Status.stopped_early.value:
            return self.stopped_early_weight
        return 1.0


@dataclass(frozen=True)
class AttemptRow:
    """One measured attempt as a training row."""

    case_id: str  # the case carrying the final verdict
    group: str  # scenario or run: the unit of grouped validation
    status: str  # final status (``improved`` only from a confirmation)
    fixed: bool  # verification.fixed (False when never judged)
    features: dict[str, float] = field(repr=False)
    family: str = ""  # the patch family (a RemedyFamily value)

    def positive(self, label: str) -> bool:
        """Whether this row is a positive under ``label`` (``improved`` or ``fixed``)."""
        return self.fixed if label == "fixed" else self.status == Status.improved.value


def attempt_rows(cases: Iterable[Case]) -> list[AttemptRow]:
    """Every measured attempt among ``cases`` (bundled examples and unverified cases skipped), in order."""
    measured = [c for c in cases if c.verification is not None and c.source != Source.example]
    rows = []
    for screen, final in final_verdicts(measured):
        v = final.verification
        assert v is not None  # measured only
        status = final_status(final)
        family = patch_family(screen.patch)
        vote = list(screen.diagnosis.causes) if screen.diagnosis else []
        ranked = [c.cause for c in vote]
        cause = cause_for(family, ranked)
        rank = ranked.index(cause) + 1 if cause in ranked else 0
        conf = vote[rank - 1].confidence if rank else 0.0
        x = attempt_features(screen.subject, screen.signature, screen.patch, family, cause, conf, rank)
        rows.append(AttemptRow(final.case_id, example_group(screen), status, bool(v.fixed), x, family.value))
    return rows


def fit_ranker(rows: Sequence[AttemptRow], settings: RankerSettings | None = None) -> RemedyRanker:
    """Fit the ranker on ``rows`` (see the module docstring); deterministic for ``settings.seed``."""
    from sklearn.feature_extraction import DictVectorizer  # scikit-learn only when fitting

    s = settings or RankerSettings()
    y = np.array([r.positive(s.label) for r in rows], dtype=int)
    w = np.array([s.weight(r.status) for r in rows], dtype=float)
    keep = w > 0
    rows, y, w = [r for r, k in zip(rows, keep) if k], y[keep], w[keep]
    meta = _counts(rows, y, s)
    if len(set(y.tolist())) < 2:
        return _base_rate(y, w, s, meta)
    vec = DictVectorizer(sparse=False, sort=True)
    x = vec.fit_transform([r.features for r in rows])
    center, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale < 1e-9] = 1.0
    z = (x - center) / scale
    groups = np.array([r.group for r in rows])
    c, oof = _choose_c(z, y, w, groups, s)
    model = _logistic(c, s.seed).fit(z, y, sample_weight=w)
    meta.update({"C": c, **oof})
    return RemedyRanker(
        names=list(vec.get_feature_names_out()),
        center=center.tolist(),
        scale=scale.tolist(),
        coef=model.coef_[0].tolist(),
        intercept=float(model.intercept_[0]),
        label=s.label,
        meta=meta,
    )


def active_ranker(store: CaseStore) -> RemedyRanker | None:
    """The KB's active ranker (``remedy optimize --backend ranker``), or None: the vote's own order."""
    version = ProgramStore(store).active("ranker")
    if version is None or version.parameters is None:
        return None
    try:  # a stored model is untrusted input too: validated, never unpickled
        return RemedyRanker.model_validate({**version.parameters, "version": version.id})
    except ValidationError as err:
        raise OptimizeError(
            f"the active ranker version {version.id} is malformed ({err.error_count()} problem(s)); "
            "undo it with `remedy programs rollback --backend ranker`"
        ) from None


def evaluate_ranked(settings: OfflineSettings, ranker: RemedyRanker | None, prepared: Sequence[Prepared]) -> float:
    """Mean metric score of the offline diagnoser under ``settings``, reordered by ``ranker`` (None: the vote alone)."""
    if not prepared:
        return 0.0
    diagnoser = OfflineDiagnoser(settings, ranker=ranker)
    scores = []
    for p in prepared:
        report = diagnoser.diagnose(p.context)
        families = [c.family for c in report.candidates]
        scores.append(score_prediction(p.example, report.diagnosis.root_causes, families).score)
    return math.fsum(scores) / len(scores)


def _logistic(c: float, seed: int):
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=c, solver="newton-cholesky", max_iter=200, random_state=seed)


def _counts(rows: Sequence[AttemptRow], y: np.ndarray, s: RankerSettings) -> dict:
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    return {
        "label": s.label,
        "rows": len(rows),
        "positives": int(y.sum()),
        "fixed_positives": sum(r.fixed for r in rows),
        "groups": len({r.group for r in rows}),
        "statuses": dict(sorted(statuses.items())),
        # the experience behind the fit, by family: the LLM diagnoser shows it beside the ranked remedies
        "families": {
            f.value: o.model_dump() for f, o in sorted(_family_counts(rows).items(), key=lambda fo: fo[0].value)
        },
        "weights": {"inconclusive": s.inconclusive_weight, "stopped_early": s.stopped_early_weight, "other": 1.0},
        "seed": s.seed,
    }


def _family_counts(rows: Sequence[AttemptRow]) -> dict[RemedyFamily, Outcomes]:
    known = {f.value for f in RemedyFamily}
    return count_outcomes((RemedyFamily(r.family), r.status, r.fixed) for r in rows if r.family in known)


def _base_rate(y: np.ndarray, w: np.ndarray, s: RankerSettings, meta: dict) -> RemedyRanker:
    """The smoothed base rate as a ranker: every remedy alike, so the vote's order stands."""
    p = (float((w * y).sum()) + 0.5) / (float(w.sum()) + 1.0)
    meta["C"] = None
    return RemedyRanker(
        names=[], center=[], scale=[], coef=[], intercept=math.log(p / (1 - p)), label=s.label, meta=meta
    )


def _choose_c(z: np.ndarray, y: np.ndarray, w: np.ndarray, groups: np.ndarray, s: RankerSettings):
    """The C with the lowest out-of-fold weighted log loss (grouped folds), and its out-of-fold scores."""
    from sklearn.model_selection import GroupKFold

    n_groups = len(set(groups.tolist()))
    if n_groups < 2:
        return s.cs[len(s.cs) // 2], {"oof": None}
    folds = list(GroupKFold(n_splits=min(s.folds, n_groups)).split(z, y, groups))
    best: tuple[float, float, np.ndarray] | None = None
    for c in s.cs:
        oof = np.full(len(y), float((w * y).sum() / w.sum()))
        for tr, te in folds:
            if len(set(y[tr].tolist())) == 2:
                oof[te] = _logistic(c, s.seed).fit(z[tr], y[tr], sample_weight=w[tr]).predict_proba(z[te])[:, 1]
        loss = _log_loss(y, oof, w)
        if best is None or loss < best[1] - 1e-12:
            best = (c, loss, oof)
    assert best is not None
    c, loss, oof = best
    base = float((w * y).sum() / w.sum())
    return c, {
        "oof_log_loss": round(loss, 5),
        "oof_brier": round(float(np.average((oof - y) ** 2, weights=w)), 5),
        "base_log_loss": round(_log_loss(y, np.full(len(y), base), w), 5),
        "base_brier": round(float(np.average((base - y) ** 2, weights=w)), 5),
        "folds": len(folds),
    }


def _log_loss(y: np.ndarray, p: np.ndarray, w: np.ndarray) -> float:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return float(-np.average(y * np.log(p) + (1 - y) * np.log(1 - p), weights=w))
