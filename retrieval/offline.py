"""The offline diagnoser: votes of similar verified cases, matching rules and built-in priors.

No network, deterministic. Three kinds of voter, each weighted by a knob the
optimizer can tune:

- similar cases, weighted by similarity x measured outcome x trust (``remedy.retrieval.trust``:
  imported cases count less than ones verified here, and a case that later verifications of
  similar signatures contradict loses weight): an ``improved`` case
  votes for its root causes and its patch family; ``worse``/``no_effect``/
  ``reward_hacking`` cases vote AGAINST their family (and, more softly, their
  causes) for a similar signature; ``inconclusive`` and ``stopped_early`` (dropped by a race
  at a share of the budget) cases vote neither way; example (literature) cases vote with a
  smaller weight;
- accepted rules that matched the signature;
- the built-in prior rulebook (``remedy.retrieval.priors``), so a cold KB still answers.

Scores become confidences by dividing by their sum plus an ``unknown`` mass;
candidates are ranked by family score, one per family, with patches the fix
loop already tried and saw fail demoted.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from remedy.cases.model import Case, Cause, Diagnosis, RemedyFamily, RootCause, Source, Status
from remedy.cases.patches.spec import Patch, TrainingBudget

from .budgets import extra_steps
from .diagnosis import (
    UNSPECIFIED,
    Attempt,
    CandidatePatch,
    ComputeCost,
    DiagnosisContext,
    DiagnosisReport,
    FamilyProposal,
    RetrievedCase,
    fits_subject,
    patch_family,
    register_diagnoser,
    without_noops,
)
from .neighbours import by_patient, patient_key
from .prior_templates import MAX_BUDGET_MULTIPLE
from .priors import PRIORS, PriorRule, match_priors
from .remedy_ranker import RemedyRanker, cause_for, rerank
from .text_priors import REPORT_FAMILY_RATES, STATED_FAMILIES, TEXT_PRIORS
from .trust import trust_weights

__all__ = ["OfflineDiagnoser", "OfflineSettings", "OFFLINE_PROGRAM"]

OFFLINE_PROGRAM = "offline-1"

_OFFER_TEXT = {"improved": "verified to fix", "example": "a literature remedy for", "unverified": "proposed for"}
_COST: dict[str, ComputeCost] = {
    "training_budget": "medium",
    "curriculum": "medium",
    "reward_shaping": "medium",
    "frame_stack": "medium",
}


@dataclass
class _Tally:
    """Running scores with the evidence behind each (weight, text) for rationales."""

    causes: dict[RootCause, float] = field(default_factory=lambda: defaultdict(float))
    cause_why: dict[RootCause, list[tuple[float, str]]] = field(default_factory=lambda: defaultdict(list))
    # family -> [(weight, cause the vote addresses or None)]; weighted by that cause's score at the end
    family_votes: dict[RemedyFamily, list[tuple[float, RootCause | None]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    family_cites: dict[RemedyFamily, list[str]] = field(default_factory=lambda: defaultdict(list))
    # family -> [(weight, order, CandidatePatch)] concrete patches offered for it
    offers: dict[RemedyFamily, list[tuple[float, int, CandidatePatch]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    # patch (as JSON, adapted to the subject) -> weight of similar cases where that same patch did not help
    against: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    # (extra steps, weight) of the similar failures' pure budget patches that did not help (adapted to the subject)
    against_budget: list[tuple[int, float]] = field(default_factory=list)
    cited_cases: list[str] = field(default_factory=list)
    cited_rules: list[str] = field(default_factory=list)

    def cause(self, c: RootCause, w: float, why: str) -> None:
        self.causes[c] += w
        self.cause_why[c].append((w, why))

    def family(self, f: RemedyFamily, w: float, cite: str, cause: RootCause | None) -> None:
        self.family_votes[f].append((w, cause))
        if w > 0 and cite not in self.family_cites[f]:
            self.family_cites[f].append(cite)

    def offer(self, cand: CandidatePatch, w: float) -> None:
        self.offers[cand.family].append((w, len(self.offers[cand.family]), cand))

    def cite_case(self, cid: str) -> None:
        if cid not in self.cited_cases:
            self.cited_cases.append(cid)

    def cite_rule(self, rid: str) -> None:
        if rid not in self.cited_rules:
            self.cited_rules.append(rid)


class OfflineSettings(BaseModel):
    """Every knob of the offline vote, in one frozen, serializable value (the optimizer stores and loads these).

    Defaults come from RL practice and the bundled example cases, never from the bench suite
    (see ``_kernel`` and ``bench/vote_defaults.py``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    k: int = Field(default=10, ge=0, description="similar past failures (patients) that vote, each with its attempts")
    w_similarity: float = Field(default=1.0, ge=0, description="weight of a retrieved case's vote")
    w_effect: float = Field(default=1.0, ge=0, description="weight of a case's measured effect in its vote")
    w_rules: float = Field(default=1.0, ge=0, description="weight of an accepted rule's vote")
    w_prior: float = Field(default=0.5, ge=0, description="weight of a built-in prior rule's vote")
    min_similarity: float = Field(default=0.3, description="cases below this cosine do not vote")
    example_weight: float = Field(default=0.3, ge=0, description="bundled example cases (literature, unmeasured)")
    unverified_weight: float = Field(default=0.1, ge=0, description="cases without a verification")
    against_cause_weight: float = Field(
        default=0.5, ge=0, description="how much a failed patch counts against its cause"
    )
    cause_credit: Literal["patch", "diagnosis"] = Field(
        default="patch",
        description="which causes a case's outcome votes for: the one its patch addresses, or every diagnosed one",
    )
    unknown_mass: float = Field(default=0.25, ge=0, description="vote mass kept for 'unknown'")
    tried_penalty: float = Field(default=0.2, ge=0, le=1, description="factor on a patch already tried in this loop")
    tried_family_penalty: float = Field(default=0.6, ge=0, le=1, description="factor on a family already tried")
    offer_against_weight: float = Field(
        default=1.0,
        ge=0,
        description="how much similar cases where a patch did not help take from that same patch's offer "
        "(orders a family's offers; 0: the strongest win alone)",
    )
    repeat_share: bool = Field(
        default=True,
        description="attempts of one remedy on one past failure (a screen and its confirmation, a factory's "
        "repeats) share one vote instead of each voting",
    )
    budget_failure_reach: float | None = Field(
        default=1.0 + MAX_BUDGET_MULTIPLE,
        ge=1,
        description="more training that did not help a past failure counts against this one only if that failure "
        "had trained at most this many times this one's steps (None: always counts)",
    )
    budget_against_smaller: bool = Field(
        default=True,
        description="more training that did not help a similar failure also counts against offers of less "
        "training (False: only against the same number of extra steps)",
    )
    cause_link_floor: float = Field(default=0.25, ge=0, description="least cause support for a candidate to be offered")
    max_candidates: int = Field(default=8, ge=1, description="candidate patches returned")
    max_causes: int = Field(default=5, ge=1, description="root causes returned")
    sim_floor: float = Field(
        default=0.48, ge=0, lt=1, description="cosine at or below which a neighbour counts nothing"
    )
    sim_power: float = Field(default=1.0, gt=0, description="growth of a neighbour's weight above sim_floor")
    other_env_weight: float = Field(default=0.85, ge=0, description="factor on cases from another env")
    text_sim_floor: float = Field(default=0.3, ge=0, lt=1, description="sim_floor for a diagnosis from a description")
    imported_weight: float = Field(default=0.5, ge=0, description="factor on cases imported from another team")
    contradiction_weight: float = Field(default=1.0, ge=0, description="how much later contradicting cases take away")
    w_stated: float = Field(
        default=0.5, ge=0, description="weight of a root cause a description states outright (x its cosine)"
    )
    text_case_weight: float = Field(
        default=0.5, ge=0, description="factor on retrieved cases' votes in a diagnosis from a description"
    )
    w_family_base_rate: float = Field(
        default=0.5,
        ge=0,
        description="weight of the public reports' family base rates in a description's family ranking "
        "(x the top family score; text_priors.REPORT_FAMILY_RATES)",
    )


class OfflineDiagnoser:
    """Weighted votes of cases, rules and priors; every knob lives in :class:`OfflineSettings`.

    ``OfflineDiagnoser(settings)`` or ``OfflineDiagnoser(sim_floor=0.5, ...)`` (overrides of the
    defaults, as ``get_diagnoser("offline", **params)`` passes them).
    """

    name = "offline"
    #: runs stored ``offline`` program versions (vote settings tuned by ``remedy optimize``)
    program_kind = "offline"

    def __init__(
        self,
        settings: OfflineSettings | None = None,
        *,
        priors: tuple[PriorRule, ...] = PRIORS,
        text_priors: tuple[PriorRule, ...] = TEXT_PRIORS,
        program_id: str | None = None,
        ranker: RemedyRanker | None = None,
        **overrides: Any,
    ) -> None:
        base = settings or OfflineSettings()
        self.settings = base.model_copy(update=OfflineSettings(**{**base.model_dump(), **overrides}).model_dump())
        self.priors = priors
        #: extra priors for a diagnosis from a description (``remedy.retrieval.text_priors``)
        self.text_priors = text_priors
        #: the stored program version these settings come from (``remedy optimize``), if any
        self.program_id = program_id
        #: a fitted remedy ranker (``remedy optimize --backend ranker``): when set, it orders the
        #: vote's candidates by P(confirmed fix) and weighs its causes by their best candidate; None: the vote's order
        self.ranker = ranker

    @property
    def params(self) -> dict[str, Any]:
        """The tunable knobs, for provenance and the optimizer."""
        return self.settings.model_dump()

    @property
    def program_version(self) -> str:
        """The stored program version's id when the settings come from one, else ``offline-1`` plus a
        short hash of the knobs, so reports say which settings made them."""
        if self.program_id is not None:
            return self.program_id
        blob = json.dumps(self.params, sort_keys=True).encode()
        return f"{OFFLINE_PROGRAM}:{hashlib.sha256(blob).hexdigest()[:8]}"

    # ---- the vote --------------------------------------------------------------------------

    def diagnose(self, ctx: DiagnosisContext) -> DiagnosisReport:
        """Rank root causes and candidate patches for ``ctx`` (deterministic)."""
        tally = _Tally()
        warnings = list(ctx.notes)
        self._vote_priors(ctx, tally)
        self._vote_rules(ctx, tally)
        self._vote_cases(ctx, tally)
        self._vote_stated(ctx, tally)
        causes = self._causes(tally)
        candidates, dropped = self._candidates(ctx, tally)
        warnings.extend(dropped)
        families = self._families(tally, candidates) if ctx.description else []
        diagnosis = Diagnosis(
            causes=causes,
            backend=self.name,
            program_version=self.program_version,
            cited_cases=tally.cited_cases,
            cited_rules=tally.cited_rules,
        )
        report = DiagnosisReport(
            signature=ctx.signature, diagnosis=diagnosis, candidates=candidates, warnings=warnings, families=families
        )
        return report if self.ranker is None else rerank(report, self.ranker, ctx.subject)

    def _vote_priors(self, ctx: DiagnosisContext, tally: _Tally) -> None:
        priors = (*self.priors, *self.text_priors) if ctx.description else self.priors
        for m in match_priors(ctx.subject, ctx.signature, priors, ctx.constraints):
            why = f"{m.rule.id} ({', '.join(m.evidence)})"
            top = max(conf for _, conf in m.rule.causes)
            for cause, conf in m.rule.causes:
                tally.cause(cause, self.settings.w_prior * conf, why)
            main = max(m.rule.causes, key=lambda cc: cc[1])[0]
            best: dict[RemedyFamily, float] = {}
            for tmpl, patch in m.patches:
                w = self.settings.w_prior * top * tmpl.weight
                best[tmpl.family] = max(best.get(tmpl.family, 0.0), w)  # one vote per family per rule
                tally.offer(
                    CandidatePatch(
                        patch=patch,
                        family=tmpl.family,
                        rationale=f"{tmpl.rationale} [{m.rule.id}: {m.rule.source}]",
                        expected_effect=tmpl.expected_effect,
                        side_effects=tmpl.side_effects,
                        compute_cost=tmpl.compute_cost,
                        cites=[m.rule.id],
                    ),
                    w,
                )
            if ctx.description:  # a vague subject: a template that built nothing still advises its family
                for tmpl in m.rule.templates:
                    w = self.settings.w_prior * top * tmpl.weight
                    best[tmpl.family] = max(best.get(tmpl.family, 0.0), w)
            for family, w in best.items():
                tally.family(family, w, m.rule.id, main)
            tally.cite_rule(m.rule.id)

    def _vote_stated(self, ctx: DiagnosisContext, tally: _Tally) -> None:
        """Causes the description states outright, weighted by how closely the words say so."""
        for r in ctx.stated:
            w = self.settings.w_stated * r.similarity
            tally.cause(r.cause, w, f"stated: '{r.clause[:60]}'")
            for rank, family in enumerate(STATED_FAMILIES.get(r.cause, ())):
                tally.family(family, w / (1 + rank), f"stated:{r.cause.value}", r.cause)

    def _vote_rules(self, ctx: DiagnosisContext, tally: _Tally) -> None:
        for rule in ctx.rules:
            rid = str(getattr(rule, "id", "rule"))
            rec = getattr(rule, "recommendation", None)
            conf = _float(_get(rec, "confidence", _get(rule, "confidence", 1.0)), 1.0)
            w = self.settings.w_rules * conf
            cause = _enum(RootCause, _get(rec, "cause", _get(rec, "root_cause", None)))
            if cause is not None:
                tally.cause(cause, w, f"rule {rid}")
            patch = _patch(_get(rec, "patch", None))
            family = patch_family(patch) if patch else _enum(RemedyFamily, _get(rec, "family", None))
            if family is not None:
                tally.family(family, w, rid, cause)
            if patch is not None:
                tally.offer(
                    CandidatePatch(
                        patch=patch,
                        family=family,
                        rationale=f"accepted rule {rid}",
                        compute_cost=_COST.get(family.value, "low"),
                        cites=[rid],
                    ),
                    w,
                )
            tally.cite_rule(rid)

    def _vote_cases(self, ctx: DiagnosisContext, tally: _Tally) -> None:
        # k patients: with one case per patient (or k cases retrieved) that is the first k cases
        near = by_patient([rc for rc in ctx.cases if rc.similarity >= self.settings.min_similarity], self.settings.k)
        trust = trust_weights(
            [rc.case for rc in near], self.settings.imported_weight, self.settings.contradiction_weight
        )
        shares = [1.0] * len(near)
        if self.settings.repeat_share:  # one past failure's repeats of one remedy share one vote
            keys = [(patient_key(rc.case), rc.case.patch.model_dump_json()) for rc in near]
            counts = Counter(keys)
            shares = [1.0 / counts[key] for key in keys]
        for rc, weight, share in zip(near, trust, shares):
            self._vote_case(ctx, rc, tally, weight * share)

    def _outcome_weight(self, case: Case) -> tuple[float, str]:
        """(factor, label): positive for fixes that worked, negative for those that did not."""
        if case.verification is not None:
            status = case.verification.status
            if status == Status.improved:
                eff = case.verification.effect
                strength = eff.prob_improvement if eff and eff.prob_improvement is not None else 1.0
                return 1.0 + self.settings.w_effect * strength, "improved"
            if status == Status.no_effect:
                return -0.5 * self.settings.w_effect, "no_effect"
            if status in (Status.worse, Status.reward_hacking):
                return -1.0 * self.settings.w_effect, status.value
            if status == Status.inconclusive:  # one seed, or a screen not confirmed: evidence neither way
                return 0.0, "inconclusive"
            if status == Status.stopped_early:  # dropped by a race on a share of the budget: no verdict
                return 0.0, "stopped_early"
            return -0.25 * self.settings.w_effect, "failed"  # may be a broken patch rather than a wrong idea
        if case.source == Source.example or case.literature is not None:
            return self.settings.example_weight, "example"
        return self.settings.unverified_weight, "unverified"

    def _credited(self, case: Case, family: RemedyFamily) -> list[tuple[int, Cause]]:
        """The diagnosed causes a case's outcome votes on, with the rank each counts at.

        ``patch`` credit: only the cause its patch stands for (:func:`cause_for`), at full weight. An outcome is
        evidence about the cause the patch addressed: a more-training patch that did nothing says little about
        the reward misspecification listed second, and a wrong remedy says nothing against a right cause it did
        not address. ``diagnosis`` credit (the vote before this knob) spreads the outcome over every diagnosed
        cause by rank, so the many ``no_effect`` attempts of a fix loop count against the causes it got right.
        """
        causes = list(case.diagnosis.causes) if case.diagnosis else []
        if self.settings.cause_credit == "diagnosis":
            return list(enumerate(causes))
        stands = cause_for(family, [c.cause for c in causes])
        return [(0, c) for c in causes if c.cause == stands][:1]

    def _kernel(self, similarity: float, floor: float | None = None) -> float:
        """How much a neighbour counts: nothing at or below ``sim_floor``, then ``sim_power`` growth.

        Defaults come from the bundled example cases, never from the bench suite
        (``bench/vote_defaults.py``): ``sim_floor`` 0.48 is the 90th percentile of the cosine
        between examples that share no root cause; ``sim_power`` 1 (linear, nothing argues for
        sharper); ``other_env_weight`` 0.85 is P(shared cause | other env) / P(shared | same env).
        A user's description sits further from the stored summaries than a measured signature's
        summary does, so text contexts use ``text_sim_floor`` (chosen on the describe bench's dev split), and
        weigh cases by ``text_case_weight`` against the tags' priors (chosen there too)."""
        floor = self.settings.sim_floor if floor is None else floor
        x = max(0.0, (similarity - floor) / max(1e-9, 1.0 - floor))
        return x**self.settings.sim_power

    def _beyond_reach(self, ctx: DiagnosisContext, case: Case, factor: float) -> bool:
        """Whether ``case`` is more training that did not help a failure trained far longer than this one.

        Such a failure tested budgets this patient would reach only after the ones it would try first: a
        CartPole agent trained 30,000 steps that 30,000 more did not help says nothing about one trained
        3,000 (the default budget patch doubles a patient's training, so with ``budget_failure_reach`` at
        1 + that multiple the two tested ranges do not overlap). Its outcome does not vote here."""
        reach, mine, theirs = self.settings.budget_failure_reach, ctx.subject.train_steps, case.subject.train_steps
        if reach is None or factor >= 0 or not mine or not theirs or not case.patch.budget_only:
            return False
        return theirs > reach * mine

    def _vote_case(self, ctx: DiagnosisContext, rc: RetrievedCase, tally: _Tally, trust: float = 1.0) -> None:
        case = rc.case
        factor, label = self._outcome_weight(case)
        if self._beyond_reach(ctx, case, factor):
            factor, label = 0.0, "trained far longer"
        base = (
            self.settings.w_similarity
            * self._kernel(rc.similarity, self.settings.text_sim_floor if ctx.description else None)
            * trust
        )
        if case.subject.env_id != ctx.subject.env_id and ctx.subject.env_id != UNSPECIFIED:
            base *= self.settings.other_env_weight
        if ctx.description:
            base *= self.settings.text_case_weight
        why = f"case {case.case_id} ({label}, sim {rc.similarity:.2f})"
        cause_factor = factor if factor > 0 else factor * self.settings.against_cause_weight
        family = patch_family(case.patch)
        if label != "failed":  # a patch that crashed says nothing about the diagnosis
            for rank, cause in self._credited(case, family):
                tally.cause(cause.cause, base * cause_factor * cause.confidence / (1 + rank), why)
        top = case.diagnosis.causes[0].cause if case.diagnosis and case.diagnosis.causes else None
        tally.family(family, base * factor, case.case_id, top)
        if factor < 0 and label != "failed":  # this very patch did not help on a similar failure
            patch = _adapt_patch(case, ctx)
            if patch is not None:
                tally.against[patch.model_dump_json()] += base * -factor
                if patch.budget_only:
                    tally.against_budget.append((extra_steps(patch), base * -factor))
        if factor > 0:
            patch = _adapt_patch(case, ctx)
            if patch is not None:
                tally.offer(
                    CandidatePatch(
                        patch=patch,
                        family=family,
                        rationale=f"{_OFFER_TEXT.get(label, 'used on')} a similar failure: {why}",
                        expected_effect=_effect_text(case),
                        compute_cost=_COST.get(family.value, "low"),
                        cites=[case.case_id],
                    ),
                    base * factor,
                )
        tally.cite_case(case.case_id)

    # ---- turning scores into a report --------------------------------------------------------

    def _causes(self, tally: _Tally) -> list[Cause]:
        positive = {c: s for c, s in tally.causes.items() if s > 1e-9}
        if not positive:
            return [
                Cause(
                    cause=RootCause.unknown,
                    confidence=1.0,
                    rationale="no prior, rule or similar case matched this signature",
                )
            ]
        total = sum(positive.values()) + self.settings.unknown_mass
        ranked = sorted(positive.items(), key=lambda kv: (-kv[1], kv[0].value))[: self.settings.max_causes]
        return [Cause(cause=c, confidence=round(s / total, 4), rationale=_why(tally.cause_why[c])) for c, s in ranked]

    def _candidates(self, ctx: DiagnosisContext, tally: _Tally) -> tuple[list[CandidatePatch], list[str]]:
        scored: list[CandidatePatch] = []
        warnings: list[str] = []
        tried = {a.patch.model_dump_json() for a in ctx.tried}
        for family, offers in tally.offers.items():
            cand = self._pick(ctx, offers, warnings, tried=tried, against=self._against(tally))
            if cand is None:
                continue
            score = self._family_score(tally, family) * self._tried_factor(cand.patch, family, ctx.tried)
            cites = [*cand.cites, *(c for c in tally.family_cites[family] if c not in cand.cites)]
            scored.append(cand.model_copy(update={"score": round(score, 4), "cites": cites}))
        scored.sort(key=lambda c: (-c.score, c.family.value))
        return scored[: self.settings.max_candidates], warnings

    def _against(self, tally: _Tally) -> Callable[[Patch], float]:
        """How much similar failures' votes take from an offered patch: those where the same patch did not help,
        and for a pure budget patch (``budget_against_smaller``) those where as much extra training or more did
        not help. Training longer at the same settings does not undo what more of it left unfixed: after a
        similar failure's +8,000 did nothing, a +4,000 offer is not the better bet, the ladder's next step is."""
        exact = tally.against

        def against(patch: Patch) -> float:
            if not (self.settings.budget_against_smaller and patch.budget_only):
                return exact.get(patch.model_dump_json(), 0.0)
            steps = extra_steps(patch)
            return sum(w for extra, w in tally.against_budget if extra >= steps)

        return against

    def _families(self, tally: _Tally, candidates: list[CandidatePatch]) -> list[FamilyProposal]:
        """Every family with a positive score, best first, each with its candidate patch when one fits."""
        example = {c.family: c for c in candidates}
        votes = {f: self._family_score(tally, f) for f in tally.family_votes}
        # a vague description leans on how real reports were resolved (REPORT_FAMILY_RATES)
        top = max([s for s in votes.values() if s > 0], default=1.0)
        for f, rate in REPORT_FAMILY_RATES.items():
            votes[f] = votes.get(f, 0.0) + self.settings.w_family_base_rate * rate * top
        scored = [(s, f) for f, s in votes.items()]
        ranked = sorted(((s, f) for s, f in scored if s > 1e-9), key=lambda sf: (-sf[0], sf[1].value))
        return [
            FamilyProposal(
                family=f,
                score=round(s, 4),
                example=example[f].patch if f in example else None,
                cites=list(example[f].cites if f in example else tally.family_cites.get(f, [])),
            )
            for s, f in ranked[: self.settings.max_candidates]
        ]

    def _family_score(self, tally: _Tally, family: RemedyFamily) -> float:
        """Sum of the family's votes, each scaled by how likely the cause it addresses is.

        A fix for the most likely cause should lead; a vote against (a failed case) counts in full.
        """
        top = max((s for s in tally.causes.values()), default=0.0)
        score = 0.0
        for w, cause in tally.family_votes[family]:
            link = 1.0
            if w > 0 and cause is not None and top > 0:
                link = max(self.settings.cause_link_floor, tally.causes.get(cause, 0.0) / top)
            score += w * link
        return score

    def _pick(
        self,
        ctx: DiagnosisContext,
        offers: list,
        warnings: list[str],
        tried: AbstractSet[str] = frozenset(),
        against: Callable[[Patch], float] | None = None,
    ) -> CandidatePatch | None:
        """The strongest offered patch of a family that fits the subject and this loop has not ``tried`` yet
        (patches as JSON), else the strongest that fits (a warning when none does).

        An offer's strength is its case's vote less ``offer_against_weight`` x the votes of similar cases
        where the same patch did not help (``against``): the failures order a family's patches, not only
        the family. Untried first: the family keeps its score (times the tried penalties) but shows a patch
        the loop can still verify, so a second verified fix of the family (tau=0.02 beside a learning-rate
        reset) is reached once the first has failed, instead of the loop running out of candidates."""
        k = self.settings.offer_against_weight

        def strength(o: tuple[float, int, CandidatePatch]) -> tuple[float, int]:
            return (-(o[0] - k * (against(o[2].patch) if against else 0.0)), o[1])

        reasons = []
        fitting = []
        for _, _, cand in sorted(offers, key=strength):
            if without_noops(cand.patch, ctx.subject) is None:
                reasons.append(f"'{cand.patch.summary()[:60]}' (this run already trains with it)")
                continue
            ok, reason = fits_subject(cand.patch, ctx.subject)
            if ok:
                fitting.append(cand)
            else:
                reasons.append(f"'{cand.patch.summary()[:60]}' ({reason})")
        fresh = [c for c in fitting if c.patch.model_dump_json() not in tried]
        if fresh or fitting:
            return (fresh or fitting)[0]
        if reasons:
            warnings.append(
                f"no {offers[0][2].family.value} patch fits {ctx.subject.algo} on {ctx.subject.env_id}: "
                + "; ".join(reasons[:2])
            )
        return None

    def _tried_factor(self, patch: Patch, family: RemedyFamily, tried: tuple[Attempt, ...]) -> float:
        factor = 1.0
        for att in tried:
            if not att.failed:
                continue
            if att.patch == patch:
                factor *= self.settings.tried_penalty
            elif patch_family(att.patch) == family:
                factor *= self.settings.tried_family_penalty
        return factor


# ---- helpers ---------------------------------------------------------------------------------


def _why(items: list[tuple[float, str]], n: int = 3) -> str:
    ranked = sorted(items, key=lambda it: -abs(it[0]))[:n]
    return "; ".join(f"{text} {w:+.2f}" for w, text in ranked)


def _effect_text(case: Case) -> str:
    v = case.verification
    if v is not None and v.effect is not None:
        return f"{v.effect.text()} in {case.subject.env_id}"
    if case.literature is not None:
        return f"literature: {case.literature.claim} ({case.literature.source})"
    return ""


def _adapt_patch(case: Case, ctx: DiagnosisContext) -> Patch | None:
    """A past case's patch made fit for this subject, or None when it cannot travel.

    Reward code is written against one env's observations, so it only travels within
    the same env; a training budget is rescaled to this subject's training steps.
    """
    patch = case.patch
    if "reward_shaping" in patch.kinds and case.subject.env_id != ctx.subject.env_id:
        return None
    if (
        patch.kinds == ["training_budget"]
        and isinstance(budget := patch.parts[0], TrainingBudget)
        and case.subject.train_steps
        and ctx.subject.train_steps
    ):
        # the same multiple of this run's training, capped like the priors' budgets
        frac = min(MAX_BUDGET_MULTIPLE, budget.extra_steps / case.subject.train_steps)
        steps = max(1_000, int(round(frac * ctx.subject.train_steps, -3)))
        return Patch(parts=[TrainingBudget(extra_steps=steps)])  # the case's own wording named its step count
    return without_noops(patch, ctx.subject)  # nor what this run already trains with


def _get(obj: object, name: str, default: object) -> object:
    if obj is None:
        return default
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _float(v: object, default: float) -> float:
    try:
        f = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return default
    return f if math.isfinite(f) else default


def _enum(kind: type, v: object):
    if v is None:
        return None
    try:
        return kind(getattr(v, "value", v))
    except ValueError:
        return None


def _patch(v: object) -> Patch | None:
    if v is None or isinstance(v, Patch):
        return v
    try:
        return Patch.from_data(v)
    except Exception:  # a rule's free-text recommendation is not a patch; it still votes by family
        return None


register_diagnoser("offline", OfflineDiagnoser)
