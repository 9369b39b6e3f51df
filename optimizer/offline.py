"""The offline backend: tune :class:`OfflineSettings` against verified outcomes.

The search is Optuna's TPE sampler, seeded (``TPESampler(seed=...)``) and run sequentially in
one process, so the same examples and seed give the same trials and the same result. TPE was
chosen over a hand-written random or coordinate search because the knobs interact (a lower
``sim_floor`` lets more neighbours vote, which moves the best ``w_prior``) and TPE models
that from the trials it has seen; the first trial is always the settings in force, so the best
trial on train is never worse than them on train (ties keep them).

The objective is the mean :func:`~remedy.optimizer.metric.score_prediction` of the real
:class:`~remedy.retrieval.offline.OfflineDiagnoser` over the train examples. Each example is
diagnosed as a new failure would be: retrieval against the KB's *other* groups only
(leave-group-out: its own scenario's or run's cases, and the bundled examples that mirror its
scenario, are excluded). Retrieval (the embedding and the hybrid search) is the costly part, so
it runs once per example for :data:`K_MAX` neighbours (past failures with their attempts, as a
diagnosis retrieves: :mod:`remedy.retrieval.neighbours`; :func:`prepare`); a trial only re-runs
the vote, whose ``k`` and ``min_similarity`` then cut that list as they would a fresh search.

Only knobs that can change the ranking of causes or families on a first-round diagnosis are
searched (:data:`SPACE`); the others (``w_rules``: the KB's contexts here hold no rules yet;
``unknown_mass``: confidences only; the tried penalties: first rounds have tried nothing;
``max_*``: truncation; ``text_sim_floor``: descriptions only) keep the values in force.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from remedy.cases.errors import OptimizeError
from remedy.cases.model import RemedyFamily, RootCause
from remedy.retrieval.diagnosis import CaseRetriever, DiagnosisContext, RetrievedCase
from remedy.retrieval.neighbours import by_patient, pool_size
from remedy.retrieval.offline import OfflineDiagnoser, OfflineSettings

from .dataset import Example
from .metric import score_prediction

__all__ = ["K_MAX", "SPACE", "Prepared", "OfflineTuning", "prepare", "predict", "evaluate", "tune_offline"]

#: neighbours (past failures) retrieved once per example; the largest ``k`` a trial may pick
K_MAX = 30
#: how a case's outcome credits causes (``OfflineSettings.cause_credit``): searched as a category
CAUSE_CREDITS = ("patch", "diagnosis")

#: searched knobs: name -> (low, high, log scale); ``k`` is an integer in [1, K_MAX]
SPACE: dict[str, tuple[float, float, bool]] = {
    "w_similarity": (0.0, 3.0, False),
    "w_effect": (0.0, 3.0, False),
    "w_prior": (0.0, 2.0, False),
    "min_similarity": (0.0, 0.9, False),
    "example_weight": (0.0, 1.0, False),
    "unverified_weight": (0.0, 0.5, False),
    "against_cause_weight": (0.0, 1.5, False),
    "cause_link_floor": (0.0, 1.0, False),
    "sim_floor": (0.0, 0.9, False),
    "sim_power": (0.25, 4.0, True),
    "other_env_weight": (0.0, 1.5, False),
    "imported_weight": (0.0, 1.0, False),
    "contradiction_weight": (0.0, 2.0, False),
}


@dataclass(frozen=True)
class Prepared:
    """An example with its diagnosis context, retrieval done (leave-group-out)."""

    example: Example
    context: DiagnosisContext


@dataclass(frozen=True)
class OfflineTuning:
    """The outcome of a tuning run on the train split."""

    settings: OfflineSettings  # the best trial's settings (the start settings on a tie)
    start_score: float  # train score of the settings in force
    train_score: float  # train score of ``settings``
    trials: int
    best_trial: int  # 0: the start settings stayed best


def prepare(
    examples: Sequence[Example],
    retriever: CaseRetriever | None,
    group_ids: Mapping[str, Iterable[str]],
    *,
    k_max: int = K_MAX,
    mirrors: Mapping[str, Iterable[str]] | None = None,
) -> list[Prepared]:
    """Retrieve once per example, excluding its own group (``group_ids[group]``: every KB case id of that
    group) and the example cases that mirror its scenario (``mirrors[group]``); None: no retrieval (cold)."""
    out = []
    for ex in examples:
        cases: list[RetrievedCase] = []
        if retriever is not None and k_max > 0:
            hidden = {*group_ids.get(ex.group, ()), *ex.case_ids, *((mirrors or {}).get(ex.group, ()))}
            scenario = ex.group.removeprefix("scenario:") if ex.group.startswith("scenario:") else None
            cases = retriever.similar(
                ex.signature,
                pool_size(k_max),
                action_space=ex.subject.traits.action_space.value,
                exclude_scenario=scenario,
                exclude_ids=sorted(hidden),
            )
            cases = by_patient(cases, k_max)  # as a diagnosis retrieves: past failures with their attempts
        out.append(Prepared(ex, DiagnosisContext(subject=ex.subject, signature=ex.signature, cases=tuple(cases))))
    return out


def predict(settings: OfflineSettings, ctx: DiagnosisContext) -> tuple[list[RootCause], list[RemedyFamily]]:
    """The ranked causes and candidate families the offline diagnoser gives ``ctx`` under ``settings``."""
    report = OfflineDiagnoser(settings).diagnose(ctx)
    return report.diagnosis.root_causes, [c.family for c in report.candidates]


def evaluate(settings: OfflineSettings, prepared: Sequence[Prepared]) -> float:
    """Mean metric score of ``settings`` over the prepared examples (0 when there are none)."""
    if not prepared:
        return 0.0
    scores = [score_prediction(p.example, *predict(settings, p.context)).score for p in prepared]
    return math.fsum(scores) / len(scores)


def tune_offline(
    train: Sequence[Prepared],
    *,
    start: OfflineSettings | None = None,
    trials: int = 100,
    seed: int = 0,
    progress: Callable[[int, int, float], None] | None = None,
) -> OfflineTuning:
    """Search :data:`SPACE` (and ``k``) with seeded TPE for the best mean score on ``train``.

    Trial 0 is ``start`` (default: the built-in defaults); ``progress(done, total, best)`` after each trial.
    """
    if trials < 1:
        raise OptimizeError(f"--trials must be at least 1, got {trials}")
    if not train:
        raise OptimizeError("no train examples to tune on")
    import optuna  # heavy import, only for a tuning run

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    start = start or OfflineSettings()
    k_high = max(K_MAX, start.k)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    first = {"k": max(1, start.k), "cause_credit": start.cause_credit}
    study.enqueue_trial({**first, **{n: _clip(getattr(start, n), n) for n in SPACE}})

    def objective(trial: optuna.Trial) -> float:
        params: dict[str, Any] = {"k": trial.suggest_int("k", 1, k_high)}
        params["cause_credit"] = trial.suggest_categorical("cause_credit", CAUSE_CREDITS)
        for name, (low, high, log) in SPACE.items():
            params[name] = trial.suggest_float(name, low, high, log=log)
        return evaluate(start.model_copy(update=params), train)

    def tick(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if progress is not None:
            progress(trial.number + 1, trials, study.best_value)

    study.optimize(objective, n_trials=trials, callbacks=[tick])
    best, start_score = study.best_trial, evaluate(start, train)  # trial 0 may hold a clipped copy of start
    if best.value is None or best.value <= start_score:
        return OfflineTuning(start, start_score, start_score, len(study.trials), 0)
    chosen = OfflineSettings.model_validate({**start.model_dump(), **best.params})
    return OfflineTuning(chosen, start_score, float(best.value), len(study.trials), best.number)


def _clip(value: float, name: str) -> float:
    """A start value inside the searched range (Optuna refuses an enqueued value outside it)."""
    low, high, _ = SPACE[name]
    return min(high, max(low, float(value)))
