"""What the LM diagnoser hands the program and how it reads the answer.

Inputs: the context as pre-analysed text (env, signature, similar cases with their verified
effects, the ranked remedies with their outcome counts, rules, priors), never raw logs. Outputs: root causes and patches parsed with pydantic into
the typed patches the offline backend produces, malformed answers signalled by :class:`_Malformed`,
and written code checked by the sandbox before anything uses it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Literal

from .offline_env import offline_defaults

offline_defaults()  # before DSPy imports litellm, which reads them at import

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator  # noqa: E402

from remedy.cases.errors import PatchRejectedError, RemedyError  # noqa: E402
from remedy.cases.model import Cause, RemedyFamily, RootCause  # noqa: E402
from remedy.cases.patches.spec import Patch  # noqa: E402

from .diagnosis import (  # noqa: E402
    UNSPECIFIED,
    CandidatePatch,
    DiagnosisContext,
    fits_subject,
)
from .neighbours import patient_key  # noqa: E402
from .offline import OfflineDiagnoser  # noqa: E402
from .priors import match_priors  # noqa: E402
from .remedy_ranker import Outcomes, RemedyRanker, family_causes, family_outcomes  # noqa: E402

__all__ = ["build_inputs", "build_description_inputs", "parse_outputs", "sandbox_check", "remedies_text"]

#: most ranked remedies shown (the vote keeps at most ``OfflineSettings.max_candidates``: 5 by default)
MAX_REMEDIES = 5
#: similar cases shown in a prompt, and attempts of one past failure among them (a small LM's context is short)
MAX_CASE_ROWS = 12
MAX_CASES_PER_PATIENT = 2

_KEY_FEATURES = (
    "return_iqm",
    "return_mean",
    "success_rate",
    "truncation_rate",
    "early_termination_rate",
    "ep_len_mean",
    "ep_len_frac",
    "action_jerk",
    "action_saturation",
    "action_entropy",
    "state_coverage",
    "obs_abs_max",
    "reward_success_corr",
    "reward_per_step",
    "curve_plateau",
    "curve_collapse",
    "curve_oscillation",
    "entropy_drop",
    "approx_kl_max",
    "constraint_violation_rate",
    "shifted_gap",
)


def _env_text(ctx: DiagnosisContext) -> str:
    s, t = ctx.subject, ctx.subject.traits
    base = (
        f"{s.env_id} kwargs={json.dumps(s.env_kwargs, sort_keys=True, default=str)}; {t.action_space.value} "
        f"actions (dim {t.action_dim}), observation dim {t.obs_dim}, {t.reward_density.value} reward; "
        f"task success: {s.success or 'not defined'}"
    )
    if ctx.constraints:
        base += "; declared safety constraints (true when violated): " + "; ".join(ctx.constraints)
    return f"{ctx.env_description}\n{base}" if ctx.env_description else base


def _signature_text(ctx: DiagnosisContext) -> str:
    f = ctx.signature.features
    nums = [f"{k}={f[k]:.4g}" for k in _KEY_FEATURES if k in f and math.isfinite(f[k])]
    eps = [
        f"  seed={e.seed} return={e.ret:.4g} length={e.length} end={e.termination} success={e.success}"
        for e in ctx.failure_episodes[:5]
    ]
    return "\n".join(
        [
            f"summary: {ctx.signature.summary}",
            "symptoms: " + (", ".join(ctx.signature.symptoms) or "none"),
            "features: " + "; ".join(nums),
            "sample failure episodes:",
            *(eps or ["  (none recorded)"]),
        ]
    )


def _cases_text(ctx: DiagnosisContext) -> str:
    rows: list[str] = []
    per_patient: dict[str, int] = {}
    for rc in ctx.cases:
        c = rc.case
        key = patient_key(c)  # a prompt holds a few attempts of each similar failure, the most similar first
        per_patient[key] = per_patient.get(key, 0) + 1
        if per_patient[key] > MAX_CASES_PER_PATIENT or len(rows) >= MAX_CASE_ROWS:
            continue
        eff = c.verification.effect if c.verification else None
        eff_txt = (
            f"{eff.metric} {eff.diff:+.3g} CI [{eff.ci_low:+.3g}, {eff.ci_high:+.3g}]"
            if eff
            else (f"literature: {c.literature.claim}" if c.literature else "no measured effect")
        )
        causes = ", ".join(x.value for x in c.root_causes) or "undiagnosed"
        rows.append(
            f"- {c.case_id} (similarity {rc.similarity:.2f}; {c.subject.env_id}, {c.subject.algo}): "
            f"symptoms {', '.join(c.signature.symptoms) or 'none'}; causes {causes}; "
            f"patch {c.patch.summary()}; status {c.status}; {eff_txt}"
        )
    return "\n".join(rows) or "(no similar cases in the knowledge base yet)"


def remedies_text(ctx: DiagnosisContext, vote: OfflineDiagnoser | None = None) -> str:
    """The ranked remedies: ``vote``'s candidates (one per family; ordered by its remedy ranker when it has
    one, else by the vote), each with the cause it addresses, the ranker's P or the vote's score, and how
    the attempts of its family ended among the similar cases (and, with a ranker, in the KB it was
    fitted on). Families tried among the similar cases that the vote does not propose are listed after."""
    vote = vote or OfflineDiagnoser()
    report = vote.diagnose(ctx)
    ranked = [c.cause for c in report.diagnosis.causes]
    near = family_outcomes(rc.case for rc in ctx.cases)
    ranker = vote.ranker
    kb = ranker.experience() if ranker is not None else None
    shown = report.candidates[:MAX_REMEDIES]
    rows = [_remedies_head(ranker, bool(kb))]
    rows += [f"{i + 1}. {_remedy_row(c, ranked, ranker, near, kb)}" for i, c in enumerate(shown)]
    if not shown:
        rows.append("(the vote proposes no remedy)")
    others = [f"{f.value} ({o.text()})" for f, o in near.items() if f not in {c.family for c in shown}]
    if others:
        rows.append("tried among the similar cases, not proposed: " + "; ".join(others))
    return "\n".join(rows)


def _remedy_row(
    cand: CandidatePatch,
    ranked: list[RootCause],
    ranker: RemedyRanker | None,
    near: dict[RemedyFamily, Outcomes],
    kb: dict[RemedyFamily, Outcomes] | None,
) -> str:
    """``family (patch; for cause): score; similar cases: counts[; KB: counts]``."""
    addressed = family_causes().get(cand.family, frozenset())
    cause = next((f"; for {c.value}" for c in ranked if c in addressed), "")  # the best-ranked cause it addresses
    score = f"{_p_label(ranker)} {cand.score:.2f}" if ranker is not None else f"vote score {cand.score:.2f}"
    row = f"{cand.family.value} ({cand.patch.summary()[:80]}{cause}): {score}; similar cases: {_seen(near, cand)}"
    return f"{row}; KB: {_seen(kb, cand)}" if kb else row


def _seen(counts: dict[RemedyFamily, Outcomes], cand: CandidatePatch) -> str:
    return counts[cand.family].text() if cand.family in counts else "not tried"


def _p_label(ranker: RemedyRanker | None) -> str:
    return "P(fixed)" if ranker is not None and ranker.label == "fixed" else "P(confirmed fix)"


def _remedies_head(ranker: RemedyRanker | None, kb_counts: bool) -> str:
    if ranker is None:
        return (
            "ranked remedies (the offline vote's candidates in its order; no remedy ranker is active; "
            "outcomes of each family's attempts among the similar cases above):"
        )
    fitted = f", and in the {ranker.meta.get('rows', '?')} KB attempts it was fitted on" if kb_counts else ""
    return (
        f"ranked remedies (the offline vote's candidates ordered by the remedy ranker {ranker.version or 'unsaved'}: "
        f"{_p_label(ranker)} learned from every measured outcome; outcomes of each family's attempts "
        f"among the similar cases above{fitted}):"
    )


def _rules_text(ctx: DiagnosisContext) -> tuple[str, list[str]]:
    rows, ids = [], []
    for r in ctx.rules:
        rid = str(getattr(r, "id", "rule"))
        ids.append(rid)
        rows.append(f"- {rid} [accepted rule]: when {_when(r)} -> {getattr(r, 'recommendation', '')}{_measured(r)}")
    for m in match_priors(ctx.subject, ctx.signature, constraints=ctx.constraints):
        ids.append(m.rule.id)
        causes = ", ".join(f"{c.value} ({conf:.2f})" for c, conf in m.rule.causes)
        fams = ", ".join(p.summary() for _, p in m.patches) or "no template"
        rows.append(f"- {m.rule.id} [prior; {m.rule.source}]: {'; '.join(m.evidence)} -> {causes}; try {fams}")
    return "\n".join(rows) or "(none matched)", ids


def _when(rule: object) -> str:
    """A rule's condition, readable (``Condition.text`` when the conditions have it)."""
    conds = list(getattr(rule, "conditions", []))
    return " and ".join(str(getattr(c, "text", c)) for c in conds) or "always"


def _measured(rule: object) -> str:
    """A mined rule's evidence in a few words (wins of support, effect with CI), when it has some."""
    e = getattr(rule, "evidence", None)
    if e is None:
        return ""
    return f"; improved in {e.wins} of {e.support} verified cases, effect {e.effect:+.2f} [{e.ci_low:+.2f}, {e.ci_high:+.2f}]"


def _grounding(ctx: DiagnosisContext, vote: OfflineDiagnoser | None, remedies: bool) -> str:
    """The ``similar_cases`` field: the cases, then the ranked remedies (in the same field rather than a new
    one: DSPy restores a stored program's field descriptions by position, so a new input field would
    mislabel every program version compiled before it)."""
    cases = _cases_text(ctx)
    return f"{cases}\n\n{remedies_text(ctx, vote)}" if remedies else cases


def build_inputs(ctx: DiagnosisContext, vote: OfflineDiagnoser | None = None, remedies: bool = True) -> dict[str, str]:
    """The program's input fields, formatted from the diagnosis context.

    ``similar_cases`` ends with the ranked remedies of ``vote`` (:func:`remedies_text`; None: the
    built-in vote without a ranker); ``remedies=False`` leaves them out.
    """
    s = ctx.subject
    reward = ctx.reward_code or (
        f"(the env's built-in reward; reference: {s.reward_ref})" if s.reward_ref else "(the env's built-in reward)"
    )
    tried = "\n".join(f"- {a.summary()}" for a in ctx.tried) or "(none)"
    return {
        "env_description": _env_text(ctx),
        "algorithm": f"{s.algo}; hyperparameters {json.dumps(s.hyperparams, sort_keys=True, default=str)}; "
        f"trained {s.train_steps if s.train_steps is not None else 'unknown'} steps",
        "reward_code": reward,
        "signature_report": _signature_text(ctx),
        "similar_cases": _grounding(ctx, vote, remedies),
        "rules": _rules_text(ctx)[0],
        "previous_attempts": tried,
    }


def build_description_inputs(
    ctx: DiagnosisContext, vote: OfflineDiagnoser | None = None, remedies: bool = True
) -> dict[str, str]:
    """The description program's inputs: the text, what the user named, the tags read, cases (with the
    ranked remedies, as in :func:`build_inputs`) and rules."""
    s = ctx.subject
    named = [
        f"env {s.env_id}" if s.env_id != UNSPECIFIED else "env not named",
        f"algorithm {s.algo}" if s.algo != UNSPECIFIED else "algorithm not named",
        f"{s.traits.action_space.value} actions",
    ]
    reading = (
        ", ".join(r.tag if r.similarity is None else f"{r.tag} ({r.similarity:.2f}: '{r.clause}')" for r in ctx.reading)
        or ", ".join(ctx.signature.symptoms)
        or "(no tag read)"
    )
    if ctx.stated:  # causes the words name outright, read the same way as the tags
        reading += "; causes stated: " + ", ".join(
            f"{r.cause.value} ({r.similarity:.2f}: '{r.clause}')" for r in ctx.stated
        )
    return {
        "description": ctx.description,
        "environment": "; ".join(named),
        "symptom_reading": reading,
        "similar_cases": _grounding(ctx, vote, remedies),
        "rules": _rules_text(ctx)[0],
    }


# ---- model output -> typed values ------------------------------------------------------------


class _LMCause(BaseModel):
    model_config = ConfigDict(extra="ignore")
    cause: RootCause
    confidence: float = Field(ge=0, le=1)
    rationale: str = ""


class _LMPatch(BaseModel):
    model_config = ConfigDict(extra="ignore")
    patch: dict[str, Any]
    rationale: str = ""
    expected_effect: str = ""
    side_effects: str = ""
    compute_cost: Literal["low", "medium", "high"] = "medium"
    cites: list[str] = Field(default_factory=list)

    @field_validator("compute_cost", mode="before")
    @classmethod
    def _lower(cls, v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) else v


class _Malformed(Exception):
    """The model's answer could not be parsed; worth another try."""


def _json_list(text: str, field: str) -> list[Any]:
    body = (text or "").strip()
    fenced = re.search(r"```(?:json)?\s*(.*?)```", body, re.S)
    if fenced:
        body = fenced.group(1).strip()
    try:
        data = json.loads(body)
    except json.JSONDecodeError as ex:
        raise _Malformed(f"{field} is not valid JSON ({ex.msg} at char {ex.pos})") from ex
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise _Malformed(f"{field} is not a JSON list")
    return data


def parse_outputs(root_causes: str, patches: str) -> tuple[list[Cause], list[tuple[Patch, _LMPatch]], list[str]]:
    """Parse the two JSON outputs; raises ``_Malformed`` when nothing usable is there.

    Individual patches that do not fit the spec are dropped with a warning (the rest stay).
    """
    causes = []
    for i, item in enumerate(_json_list(root_causes, "root_causes")):
        try:
            c = _LMCause.model_validate(item)
        except ValidationError as ex:
            raise _Malformed(
                f"root_causes[{i}] does not fit {{cause, confidence, rationale}}: {ex.errors()[0]['msg']}"
            ) from ex
        causes.append(Cause(cause=c.cause, confidence=round(c.confidence, 4), rationale=c.rationale))
    if not causes:
        raise _Malformed("root_causes is empty")
    out, warnings = [], []
    for i, item in enumerate(_json_list(patches, "patches")):
        if isinstance(item, dict) and "patch" not in item and ("kind" in item or "parts" in item):
            item = {"patch": item}  # a bare part or patch: accept it
        try:
            meta = _LMPatch.model_validate(item)
            out.append((Patch.from_data(meta.patch), meta))
        except (ValidationError, ValueError, TypeError) as ex:
            warnings.append(f"dropped LLM patch #{i + 1}: does not fit the patch schema ({_first_error(ex)})")
    causes.sort(key=lambda c: -c.confidence)
    return causes, out, warnings


def _first_error(ex: Exception) -> str:
    if isinstance(ex, ValidationError) and ex.errors():
        e = ex.errors()[0]
        return f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}"
    return str(ex).splitlines()[0][:200]


# ---- sandbox ---------------------------------------------------------------------------------


def sandbox_check(patch: Patch, ctx: DiagnosisContext) -> tuple[bool, str]:
    """Run the patch through :func:`remedy.cases.patches.check.check_patch` (fit, static check, compile, fuzz)."""
    from remedy.cases.patches.check import check_patch

    if ctx.subject.env_id == UNSPECIFIED:  # a description that named no env: nothing to fuzz code against
        if any(p.kind in ("reward_shaping", "safety_constraint") for p in patch.parts):
            return False, "code patches are fuzzed against the env's spaces; name the env (--env) to get them"
        return fits_subject(patch, ctx.subject)
    s = ctx.subject
    try:
        report = check_patch(patch, s.env_id, s.env_kwargs, s.algo)
    except PatchRejectedError as ex:
        return False, f"{ex.rule or 'rejected'}: {ex}"
    except RemedyError as ex:
        return False, str(ex)
    return (True, "") if report.ok else (False, f"{report.rule or 'rejected'}: {report.message}")


# ---- the LM ----------------------------------------------------------------------------------
