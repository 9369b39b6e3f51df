"""The miner: recurring "condition → remedy family" rules in measured cases, with false discoveries controlled.

:func:`mine` enumerates conjunctions of 1..``max_conditions`` facts (``miners.facts``) for
each remedy family, keeps those met by at least ``min_support`` attempts of that family, and
scores each candidate:

- **wins**: attempts that ended ``improved`` (only a confirmation on fresh seeds can), and of those
  **fixed**: the agent now works (``verification.fixed``), counted beside the wins, not tested;
- **p-value**: one-sided exact binomial test (``scipy.stats.binomtest``) of the wins against
  :data:`NULL_WIN_RATE`. The null is "patches of this family do nothing under this condition";
  under it an attempt still ends ``improved`` only by a false confirmation, which the loop keeps
  at or below 5% (the confirmation's CI must clear zero on fresh seeds, after a screen that had to
  clear it too). So a rule is evidence that wins come more often than false confirmations would
  produce, not a claim about effect size;
- **q-value**: Benjamini–Hochberg (``scipy.stats.false_discovery_control``) over EVERY candidate
  tested in the run, so looking at many conditions does not manufacture rules;
- **pooled effect** on one scale comparable across envs and metrics (:data:`EFFECT_SCALE`): each
  case's ``effect.diff`` divided by the half-width of its own confidence interval, clipped to
  ±:data:`EFFECT_CLIP`. 1.0 means "the case's own 95% interval just reaches zero"; the scale is
  free of the metric's units (returns, success rates) and of the env's reward range, and a
  noisy case (wide interval) counts for less. The rule's effect is the mean over its attempts,
  with a seeded percentile-bootstrap interval (:func:`bootstrap_mean_ci`).

Candidates with ``q ≤ fdr`` and at least one win are kept, then redundant ones pruned: candidates that matched the
very same attempts collapse into the one with the fewest (then alphabetically first)
conditions, and a multi-condition rule goes when a kept rule on a subset of its conditions wins
at least as often. Same cases and seed → the same rules in the same order.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from remedy.cases.errors import TooFewCasesError, ValidationError
from remedy.cases.model import Case, RemedyFamily, RootCause

from .facts import Attempt, final_attempts
from .model import CaseRef, Condition, ConditionField, Rule, RuleEvidence, rule_id

__all__ = [
    "NULL_WIN_RATE",
    "MIN_ATTEMPTS",
    "EFFECT_CLIP",
    "EFFECT_SCALE",
    "MiningResult",
    "mine",
    "standardized_effect",
    "bootstrap_mean_ci",
]

#: P(an attempt ends ``improved`` | the patch does nothing): the confirmation's false-improved bound
NULL_WIN_RATE = 0.05
#: fewest measured attempts worth mining: below this every rule would rest on one or two scenarios
MIN_ATTEMPTS = 10
#: standardized effects are clipped to ±this, so one case with a near-zero-width interval cannot dominate
EFFECT_CLIP = 3.0
EFFECT_SCALE = "diff / own 95% CI half-width (1 = the case's interval just reaches 0), clipped to ±3"
_RESAMPLES = 2000
_LEVEL = 0.95


@dataclass(frozen=True)
class MiningResult:
    """What one mining run found: the kept rules (best first), every candidate tested, and the inputs' size."""

    rules: list[Rule]
    tested: list[Rule] = field(default_factory=list)  # every candidate scored (the BH family), kept ones included
    n_cases: int = 0  # cases read
    n_attempts: int = 0  # measured attempts at their final verdict (what support counts)
    min_support: int = 3
    fdr: float = 0.1
    max_conditions: int = 2
    seed: int = 0

    @property
    def n_tested(self) -> int:
        """Number of candidates tested (the denominator of the Benjamini–Hochberg correction)."""
        return len(self.tested)


@dataclass(frozen=True)
class _Candidate:
    conditions: tuple[Condition, ...]
    family: RemedyFamily
    members: tuple[int, ...]  # indices into the attempt list, ascending


def standardized_effect(case: Case) -> float:
    """A case's effect on :data:`EFFECT_SCALE`: ``diff`` over its CI half-width, clipped to ±EFFECT_CLIP."""
    eff = case.verification.effect if case.verification else None
    if eff is None:
        return 0.0
    half = (eff.ci_high - eff.ci_low) / 2
    if half <= 0:  # every seed agreed exactly: as sure as the scale allows, in the diff's direction
        return 0.0 if eff.diff == 0 else math.copysign(EFFECT_CLIP, eff.diff)
    return float(np.clip(eff.diff / half, -EFFECT_CLIP, EFFECT_CLIP))


def bootstrap_mean_ci(
    values: Sequence[float], rng: np.random.Generator, level: float = _LEVEL, n_resamples: int = _RESAMPLES
) -> tuple[float, float, float]:
    """(mean, low, high): the mean of ``values`` and its percentile-bootstrap interval at ``level``.

    One value (or identical values) gives a zero-width interval at the value.
    """
    x = np.asarray(values, dtype=float)
    mean = float(x.mean())
    if x.size < 2:
        return mean, mean, mean
    means = x[rng.integers(0, x.size, size=(n_resamples, x.size))].mean(axis=1)
    alpha = (1 - level) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return mean, float(min(low, mean)), float(max(high, mean))


def _check(min_support: int, fdr: float, max_conditions: int) -> None:
    if min_support < 1:
        raise ValidationError(f"--min-support must be at least 1 (got {min_support})")
    if not 0 < fdr <= 1:
        raise ValidationError(f"--fdr must be in (0, 1] (got {fdr}); 0.1 is usual")
    if not 1 <= max_conditions <= 3:
        raise ValidationError(f"--max-conditions must be 1, 2 or 3 (got {max_conditions})")


def mine(
    cases: Iterable[Case],
    *,
    min_support: int = 3,
    fdr: float = 0.1,
    max_conditions: int = 2,
    seed: int = 0,
    now: datetime | None = None,
) -> MiningResult:
    """Mine rules from ``cases`` (see the module docstring for the statistics).

    ``now`` stamps the evidence (``mined_at``); by default the newest case's creation time, so
    the same cases and ``seed`` give identical rules. Raises :class:`TooFewCasesError` when
    fewer than ``max(min_support, MIN_ATTEMPTS)`` measured attempts have a verdict.
    """
    _check(min_support, fdr, max_conditions)
    cases = list(cases)
    attempts = final_attempts(cases)
    needed = max(min_support, MIN_ATTEMPTS)
    if len(attempts) < needed:
        raise TooFewCasesError(
            f"need at least {needed} measured cases with a verdict to mine; the KB has {len(attempts)} "
            "(each attempt counted once) — run `remedy bench run` or `remedy fix` first",
            have=len(attempts),
            need=needed,
        )
    stamp = now or max(a.case.provenance.created_at for a in attempts)
    candidates = _candidates(attempts, min_support, max_conditions)
    tested = _score(candidates, attempts, seed, stamp)
    # a rule with no win recommends nothing, whatever the fdr (at fdr 1 every q would pass)
    kept = _prune([r for r in tested if r.evidence.q_value <= fdr and r.evidence.wins], tested, candidates, attempts)
    order = sorted(tested, key=_rank)
    return MiningResult(
        rules=sorted(kept, key=_rank),
        tested=order,
        n_cases=len(cases),
        n_attempts=len(attempts),
        min_support=min_support,
        fdr=fdr,
        max_conditions=max_conditions,
        seed=seed,
    )


def _rank(rule: Rule) -> tuple[Any, ...]:
    e = rule.evidence
    return (e.q_value, -e.win_rate, -e.effect, rule.id)


# ---- enumeration -----------------------------------------------------------------------------


def _candidates(attempts: list[Attempt], min_support: int, max_conditions: int) -> list[_Candidate]:
    """Every (conjunction, family) met by at least ``min_support`` attempts of that family, in a fixed order."""
    by_family: dict[RemedyFamily, list[int]] = defaultdict(list)
    for i, a in enumerate(attempts):
        by_family[a.family].append(i)
    out: list[_Candidate] = []
    for family in sorted(by_family, key=lambda f: f.value):
        members = by_family[family]
        if len(members) < min_support:
            continue
        holders: dict[Condition, frozenset[int]] = defaultdict(frozenset)
        for i in members:
            for fact in attempts[i].facts:
                holders[fact] = holders[fact] | {i}
        frequent = sorted((f for f, s in holders.items() if len(s) >= min_support), key=lambda c: c.text)
        for size in range(1, max_conditions + 1):
            for combo in itertools.combinations(frequent, size):
                if len({c.field for c in combo if c.field != ConditionField.symptom}) < sum(
                    c.field != ConditionField.symptom for c in combo
                ):
                    continue  # two values of one single-valued field never hold together
                matched = frozenset.intersection(*(holders[c] for c in combo))
                if len(matched) >= min_support:
                    out.append(_Candidate(combo, family, tuple(sorted(matched))))
    return out


# ---- scoring ---------------------------------------------------------------------------------


def _score(candidates: list[_Candidate], attempts: list[Attempt], seed: int, stamp: datetime) -> list[Rule]:
    """One Rule per candidate with its evidence; q-values by Benjamini–Hochberg over all of them."""
    if not candidates:
        return []
    from scipy import stats  # heavy: only when there is something to test

    effects = [standardized_effect(a.case) for a in attempts]
    pvals = []
    for cand in candidates:
        wins = sum(attempts[i].improved for i in cand.members)
        pvals.append(float(stats.binomtest(wins, len(cand.members), NULL_WIN_RATE, alternative="greater").pvalue))
    qvals = stats.false_discovery_control(np.asarray(pvals), method="bh")
    return [
        _rule(cand, attempts, effects, p, float(min(1.0, q)), seed, stamp)
        for cand, p, q in zip(candidates, pvals, qvals)
    ]


def _rule(
    cand: _Candidate,
    attempts: list[Attempt],
    effects: list[float],
    p: float,
    q: float,
    seed: int,
    stamp: datetime,
) -> Rule:
    conditions = list(cand.conditions)
    rid = rule_id(conditions, cand.family)
    members = [attempts[i] for i in cand.members]
    wins = [a for a in members if a.improved]
    # one generator per rule, keyed by the seed and the rule id: a rule's interval does not
    # depend on which other candidates happened to be enumerated before it
    rng = np.random.default_rng([seed, int(rid[2:], 16)])
    mean, low, high = bootstrap_mean_ci([effects[i] for i in cand.members], rng)
    refs = {i: _ref(attempts[i], effects[i]) for i in cand.members}
    evidence = RuleEvidence(
        support=len(members),
        wins=len(wins),
        fixed=sum(a.fixed for a in wins),
        win_rate=len(wins) / len(members),
        effect_scale=EFFECT_SCALE,
        effect=mean,
        ci_low=low,
        ci_high=high,
        confidence_level=_LEVEL,
        p_value=min(1.0, p),
        q_value=q,
        supporting=[refs[i] for i in cand.members if attempts[i].improved],
        counter=[refs[i] for i in cand.members if not attempts[i].improved],
        mined_at=stamp.astimezone(UTC),
        seed=seed,
    )
    return Rule(
        id=rid,
        conditions=conditions,
        family=cand.family,
        cause=_cause(conditions, wins),
        params=_params(wins),
        evidence=evidence,
    )


def _ref(attempt: Attempt, effect: float) -> CaseRef:
    case = attempt.case
    v = case.verification
    eff = v.effect if v else None
    assert v is not None  # final_attempts keeps measured cases only
    return CaseRef(
        case_id=case.case_id,
        scenario=case.scenario,
        env_id=case.subject.env_id,
        status=v.status,
        metric=eff.metric if eff else "",
        diff=eff.diff if eff else None,
        effect=effect,
        fixed=v.fixed,
    )


def _cause(conditions: list[Condition], wins: list[Attempt]) -> RootCause | None:
    """The root cause the winning patches addressed: the condition's, else the wins' common top cause."""
    for c in conditions:
        if c.field == ConditionField.root_cause:
            return RootCause(c.value)
    tops = {a.case.diagnosis.causes[0].cause if a.case.diagnosis and a.case.diagnosis.causes else None for a in wins}
    return tops.pop() if len(tops) == 1 else None  # None also when there are no wins or a win was undiagnosed


def _params(wins: list[Attempt]) -> dict[str, Any]:
    """Parameters of the patch's first part on which every win (two at least) agrees."""
    if len(wins) < 2:
        return {}
    dumps = [a.case.patch.parts[0].model_dump(mode="json", exclude={"kind"}) for a in wins]
    keys = sorted(set.intersection(*(set(d) for d in dumps)))
    return {k: dumps[0][k] for k in keys if all(d[k] == dumps[0][k] for d in dumps[1:])}


# ---- pruning ---------------------------------------------------------------------------------


def _prune(kept: list[Rule], tested: list[Rule], candidates: list[_Candidate], attempts: list[Attempt]) -> list[Rule]:
    """Drop refinements no better than a kept parent; collapse rules that matched the same attempts.

    Of rules that matched the same attempts, the one named is the one with the fewest
    conditions, then the most specific (its condition holds for the fewest attempts of any
    family), then a symptom or root cause before an env trait, then alphabetical.
    """
    members = {r.id: c.members for r, c in zip(tested, candidates)}
    sharper = [r for r in kept if not _refines_no_better(r, kept)]
    groups: dict[tuple[RemedyFamily, tuple[int, ...]], list[Rule]] = defaultdict(list)
    for r in sharper:
        groups[(r.family, members[r.id])].append(r)
    merged = []
    for group in groups.values():
        group.sort(key=lambda r: _naming_order(r, attempts))
        head, rest = group[0], group[1:]
        merged.append(head.model_copy(update={"equivalent": [r.condition_text for r in rest]}))
    return merged


_FIELD_ORDER = [
    ConditionField.symptom,
    ConditionField.root_cause,
    ConditionField.action_space,
    ConditionField.reward_density,
    ConditionField.obs_size,
    ConditionField.algo_family,
]


def _naming_order(rule: Rule, attempts: list[Attempt]) -> tuple[Any, ...]:
    prevalence = sum(all(c in a.facts for c in rule.conditions) for a in attempts)
    fields = sorted(_FIELD_ORDER.index(c.field) for c in rule.conditions)
    return (len(rule.conditions), prevalence, fields, rule.condition_text)


def _refines_no_better(rule: Rule, kept: list[Rule]) -> bool:
    """True when a kept rule of the same family on a strict subset of the conditions wins at least as often."""
    own = {c.text for c in rule.conditions}
    return any(
        p.family == rule.family
        and {c.text for c in p.conditions} < own
        and p.evidence.win_rate >= rule.evidence.win_rate
        for p in kept
    )
