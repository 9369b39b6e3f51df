"""The offline diagnoser: votes of similar verified cases, matching rules and built-in priors.

No network, deterministic. Three kinds of voter, each weighted by a knob the
optimizer can tune:

- similar cases, weighted by similarity x measured outcome: an ``improved`` case
  votes for its root causes and its patch family; ``worse``/``no_effect``/
  ``reward_hacking`` cases vote AGAINST their family (and, more softly, their
  causes) for a similar signature; example (literature) cases vote with a
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
from collections import defaultdict
from dataclasses import dataclass, field

from remedy.cases.model import Case, Cause, Diagnosis, RemedyFamily, RootCause, Source, Status
from remedy.cases.patches.spec import Patch, TrainingBudget

from .diagnosis import (
    Attempt,
    CandidatePatch,
    DiagnosisContext,
    DiagnosisReport,
    RetrievedCase,
    fits_subject,
    patch_family,
    register_diagnoser,
)
from .priors import MAX_BUDGET_MULTIPLE, PRIORS, PriorRule, match_priors

__all__ = ["OfflineDiagnoser", "OFFLINE_PROGRAM"]

OFFLINE_PROGRAM = "offline-1"

_OFFER_TEXT = {"improved": "verified to fix", "example": "a literature remedy for", "unverified": "proposed for"}
_COST = {"training_budget": "medium", "curriculum": "medium", "reward_shaping": "medium", "frame_stack": "medium"}


@dataclass
class _Tally:
    """Running scores with the evidence behind each (weight, text) for rationales."""

    causes: dict[RootCause, float] = field(default_factory=lambda: defaultdict(float))
    cause_why: dict[RootCause, list[tuple[float, str]]] = field(default_factory=lambda: defaultdict(list))
    # family -> [(weight, cause the vote addresses or None)]; weighted by that cause's score at the end
    family_votes: dict[RemedyFamily, list[tuple[float, RootCause | None]]] = field(
        default_factory=lambda: defaultdict(list))
    family_cites: dict[RemedyFamily, list[str]] = field(default_factory=lambda: defaultdict(list))
    # family -> [(weight, order, CandidatePatch)] concrete patches offered for it
    offers: dict[RemedyFamily, list[tuple[float, int, CandidatePatch]]] = field(default_factory=lambda: defaultdict(list))
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


class OfflineDiagnoser:
    """Weighted votes of cases, rules and priors. Every knob is a constructor parameter."""

    name = "offline"

    def __init__(
        self,
        k: int = 10,
        w_similarity: float = 1.0,
        w_effect: float = 1.0,
        w_rules: float = 1.0,
        w_prior: float = 0.5,
        min_similarity: float = 0.3,
        example_weight: float = 0.3,
        unverified_weight: float = 0.1,
        against_cause_weight: float = 0.5,
        unknown_mass: float = 0.25,
        tried_penalty: float = 0.2,
        tried_family_penalty: float = 0.6,
        cause_link_floor: float = 0.25,
        max_candidates: int = 8,
        max_causes: int = 5,
        sim_floor: float = 0.6,
        sim_power: float = 2.0,
        other_env_weight: float = 0.5,
        priors: tuple[PriorRule, ...] = PRIORS,
    ) -> None:
        self.k, self.w_similarity, self.w_effect = k, w_similarity, w_effect
        self.w_rules, self.w_prior, self.min_similarity = w_rules, w_prior, min_similarity
        self.example_weight, self.unverified_weight = example_weight, unverified_weight
        self.against_cause_weight, self.unknown_mass = against_cause_weight, unknown_mass
        self.tried_penalty, self.tried_family_penalty = tried_penalty, tried_family_penalty
        self.max_candidates, self.max_causes = max_candidates, max_causes
        self.cause_link_floor = cause_link_floor
        self.sim_floor, self.sim_power, self.other_env_weight = sim_floor, sim_power, other_env_weight
        self.priors = priors

    @property
    def params(self) -> dict[str, float]:
        """The tunable knobs, for provenance and the optimizer."""
        keys = ("k", "w_similarity", "w_effect", "w_rules", "w_prior", "min_similarity", "example_weight",
                "unverified_weight", "against_cause_weight", "unknown_mass", "tried_penalty",
                "tried_family_penalty", "cause_link_floor", "max_candidates", "max_causes", "sim_floor",
                "sim_power", "other_env_weight")
        return {key: getattr(self, key) for key in keys}

    @property
    def program_version(self) -> str:
        """``offline-1`` plus a short hash of the knobs, so reports say which settings made them."""
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
        causes = self._causes(tally)
        candidates, dropped = self._candidates(ctx, tally)
        warnings.extend(dropped)
        diagnosis = Diagnosis(causes=causes, backend=self.name, program_version=self.program_version,
                              cited_cases=tally.cited_cases, cited_rules=tally.cited_rules)
        return DiagnosisReport(signature=ctx.signature, diagnosis=diagnosis, candidates=candidates, warnings=warnings)

    def _vote_priors(self, ctx: DiagnosisContext, tally: _Tally) -> None:
        for m in match_priors(ctx.subject, ctx.signature, self.priors, ctx.constraints):
            why = f"{m.rule.id} ({', '.join(m.evidence)})"
            top = max(conf for _, conf in m.rule.causes)
            for cause, conf in m.rule.causes:
                tally.cause(cause, self.w_prior * conf, why)
            main = max(m.rule.causes, key=lambda cc: cc[1])[0]
            best: dict[RemedyFamily, float] = {}
            for tmpl, patch in m.patches:
                w = self.w_prior * top * tmpl.weight
                best[tmpl.family] = max(best.get(tmpl.family, 0.0), w)  # one vote per family per rule
                tally.offer(CandidatePatch(
                    patch=patch, family=tmpl.family, rationale=f"{tmpl.rationale} [{m.rule.id}: {m.rule.source}]",
                    expected_effect=tmpl.expected_effect, side_effects=tmpl.side_effects,
                    compute_cost=tmpl.compute_cost, cites=[m.rule.id]), w)
            for family, w in best.items():
                tally.family(family, w, m.rule.id, main)
            tally.cite_rule(m.rule.id)

    def _vote_rules(self, ctx: DiagnosisContext, tally: _Tally) -> None:
        for rule in ctx.rules:
            rid = str(getattr(rule, "id", "rule"))
            rec = getattr(rule, "recommendation", None)
            conf = _float(_get(rec, "confidence", _get(rule, "confidence", 1.0)), 1.0)
            w = self.w_rules * conf
            cause = _enum(RootCause, _get(rec, "cause", _get(rec, "root_cause", None)))
            if cause is not None:
                tally.cause(cause, w, f"rule {rid}")
            patch = _patch(_get(rec, "patch", None))
            family = patch_family(patch) if patch else _enum(RemedyFamily, _get(rec, "family", None))
            if family is not None:
                tally.family(family, w, rid, cause)
            if patch is not None:
                tally.offer(CandidatePatch(patch=patch, family=family, rationale=f"accepted rule {rid}",
                                           compute_cost=_COST.get(family.value, "low"), cites=[rid]), w)
            tally.cite_rule(rid)

    def _vote_cases(self, ctx: DiagnosisContext, tally: _Tally) -> None:
        near = [rc for rc in ctx.cases if rc.similarity >= self.min_similarity][: self.k]
        for rc in near:
            self._vote_case(ctx, rc, tally)

    def _outcome_weight(self, case: Case) -> tuple[float, str]:
        """(factor, label): positive for fixes that worked, negative for those that did not."""
        if case.verification is not None:
            status = case.verification.status
            if status == Status.improved:
                eff = case.verification.effect
                strength = eff.prob_improvement if eff and eff.prob_improvement is not None else 1.0
                return 1.0 + self.w_effect * strength, "improved"
            if status == Status.no_effect:
                return -0.5 * self.w_effect, "no_effect"
            if status in (Status.worse, Status.reward_hacking):
                return -1.0 * self.w_effect, status.value
            if status == Status.inconclusive:  # one seed, or a screen not confirmed: evidence neither way
                return 0.0, "inconclusive"
            return -0.25 * self.w_effect, "failed"  # may be a broken patch rather than a wrong idea
        if case.source == Source.example or case.literature is not None:
            return self.example_weight, "example"
        return self.unverified_weight, "unverified"

    def _kernel(self, similarity: float) -> float:
        """How much a neighbour counts: summaries of the same kind of agent already sit near 0.7
        cosine with the bundled model, so weight rises sharply only above ``sim_floor``."""
        x = max(0.0, (similarity - self.sim_floor) / max(1e-9, 1.0 - self.sim_floor))
        return x ** self.sim_power

    def _vote_case(self, ctx: DiagnosisContext, rc: RetrievedCase, tally: _Tally) -> None:
        case = rc.case
        factor, label = self._outcome_weight(case)
        base = self.w_similarity * self._kernel(rc.similarity)
        if case.subject.env_id != ctx.subject.env_id:
            base *= self.other_env_weight
        why = f"case {case.case_id} ({label}, sim {rc.similarity:.2f})"
        cause_factor = factor if factor > 0 else factor * self.against_cause_weight
        if label != "failed":  # a patch that crashed says nothing about the diagnosis
            for rank, cause in enumerate(case.diagnosis.causes if case.diagnosis else []):
                tally.cause(cause.cause, base * cause_factor * cause.confidence / (1 + rank), why)
        family = patch_family(case.patch)
        top = case.diagnosis.causes[0].cause if case.diagnosis and case.diagnosis.causes else None
        tally.family(family, base * factor, case.case_id, top)
        if factor > 0:
            patch = _adapt_patch(case, ctx)
            if patch is not None:
                tally.offer(CandidatePatch(
                    patch=patch, family=family, rationale=f"{_OFFER_TEXT.get(label, 'used on')} a similar failure: {why}",
                    expected_effect=_effect_text(case), compute_cost=_COST.get(family.value, "low"),
                    cites=[case.case_id]), base * factor)
        tally.cite_case(case.case_id)

    # ---- turning scores into a report --------------------------------------------------------

    def _causes(self, tally: _Tally) -> list[Cause]:
        positive = {c: s for c, s in tally.causes.items() if s > 1e-9}
        if not positive:
            return [Cause(cause=RootCause.unknown, confidence=1.0,
                          rationale="no prior, rule or similar case matched this signature")]
        total = sum(positive.values()) + self.unknown_mass
        ranked = sorted(positive.items(), key=lambda kv: (-kv[1], kv[0].value))[: self.max_causes]
        return [Cause(cause=c, confidence=round(s / total, 4), rationale=_why(tally.cause_why[c])) for c, s in ranked]

    def _candidates(self, ctx: DiagnosisContext, tally: _Tally) -> tuple[list[CandidatePatch], list[str]]:
        scored, warnings = [], []
        for family, offers in tally.offers.items():
            cand = self._pick(ctx, offers, warnings)
            if cand is None:
                continue
            score = self._family_score(tally, family) * self._tried_factor(cand.patch, family, ctx.tried)
            cites = [*cand.cites, *(c for c in tally.family_cites[family] if c not in cand.cites)]
            scored.append(cand.model_copy(update={"score": round(score, 4), "cites": cites}))
        scored.sort(key=lambda c: (-c.score, c.family.value))
        return scored[: self.max_candidates], warnings

    def _family_score(self, tally: _Tally, family: RemedyFamily) -> float:
        """Sum of the family's votes, each scaled by how likely the cause it addresses is.

        A fix for the most likely cause should lead; a vote against (a failed case) counts in full.
        """
        top = max((s for s in tally.causes.values()), default=0.0)
        score = 0.0
        for w, cause in tally.family_votes[family]:
            link = 1.0
            if w > 0 and cause is not None and top > 0:
                link = max(self.cause_link_floor, tally.causes.get(cause, 0.0) / top)
            score += w * link
        return score

    def _pick(self, ctx: DiagnosisContext, offers: list, warnings: list[str]) -> CandidatePatch | None:
        """The strongest offered patch of a family that fits the subject (a warning when none does)."""
        reasons = []
        for _, _, cand in sorted(offers, key=lambda o: (-o[0], o[1])):
            ok, reason = fits_subject(cand.patch, ctx.subject)
            if ok:
                return cand
            reasons.append(f"'{cand.patch.summary()[:60]}' ({reason})")
        if reasons:
            warnings.append(f"no {offers[0][2].family.value} patch fits {ctx.subject.algo} on {ctx.subject.env_id}: "
                            + "; ".join(reasons[:2]))
        return None

    def _tried_factor(self, patch: Patch, family: RemedyFamily, tried: tuple[Attempt, ...]) -> float:
        factor = 1.0
        for att in tried:
            if not att.failed:
                continue
            if att.patch == patch:
                factor *= self.tried_penalty
            elif patch_family(att.patch) == family:
                factor *= self.tried_family_penalty
        return factor


# ---- helpers ---------------------------------------------------------------------------------

def _why(items: list[tuple[float, str]], n: int = 3) -> str:
    ranked = sorted(items, key=lambda it: -abs(it[0]))[:n]
    return "; ".join(f"{text} {w:+.2f}" for w, text in ranked)


def _effect_text(case: Case) -> str:
    v = case.verification
    if v is not None and v.effect is not None:
        e = v.effect
        return f"{e.metric} {e.diff:+.3g} [{e.ci_low:+.3g}, {e.ci_high:+.3g}] in {case.subject.env_id}"
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
    if patch.kinds == ["training_budget"] and case.subject.train_steps and ctx.subject.train_steps:
        # the same multiple of this run's training, capped like the priors' budgets
        frac = min(MAX_BUDGET_MULTIPLE, patch.parts[0].extra_steps / case.subject.train_steps)
        steps = max(1_000, int(round(frac * ctx.subject.train_steps, -3)))
        return Patch(parts=[TrainingBudget(extra_steps=steps)])  # the case's own wording named its step count
    return patch


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
