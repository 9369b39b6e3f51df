"""The LLM diagnoser: a DSPy program grounded in retrieved cases, rules and priors.

The program (:class:`DiagnoseFailure` under ``dspy.ChainOfThought``) gets
structured, pre-analysed context, never raw logs: the env, the algorithm, the
current reward code, the signature's key numbers and a few failure episodes,
similar cases with their verified effects, matching rules and built-in priors,
and what a fix loop already tried. It answers observations -> candidate causes
-> evidence -> root causes and patches as JSON, which is parsed with pydantic
into the same typed patches the offline backend produces. Malformed output is
retried a bounded number of times, then raises :class:`LMError`. Reward code
and safety predicates the model writes pass the sandbox before anything uses
them; rejected candidates are dropped with a warning naming the rule.

Configuration (README): ``REMEDY_LM`` (any litellm model string),
``REMEDY_LM_API_BASE``, ``REMEDY_LM_API_KEY`` (else the provider's own variable),
``REMEDY_LM_ENGINE`` (``auto`` | ``litellm`` | ``lm15``), ``REMEDY_LM_TEMPERATURE``,
``REMEDY_LM_MAX_TOKENS``, ``REMEDY_LM_NUM_RETRIES``, ``REMEDY_LM_TIMEOUT``, ``REMEDY_LM_OUTPUT``
(``full`` | ``choose`` | ``choose-grammar``: see :data:`OUTPUTS`; the choose answers suit 135M-270M models).
A local OpenAI-compatible server (vLLM, llama.cpp, LM Studio) works with
``REMEDY_LM=openai/<served-model-name> REMEDY_LM_API_BASE=http://localhost:8000/v1``;
Ollama with ``REMEDY_LM=ollama_chat/llama3.1 REMEDY_LM_API_BASE=http://localhost:11434/v1``.
DSPy's default engine sends ``max_completion_tokens``; an older server that wants
``max_tokens`` needs ``REMEDY_LM_ENGINE=litellm``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Mapping
from typing import Any, Literal

from .offline_env import offline_defaults

offline_defaults()  # before DSPy imports litellm, which reads them at import

import dspy  # noqa: E402
from dspy.utils.exceptions import (  # noqa: E402
    AdapterParseError,
    LMTimeoutError,
    LMTransportError,
)
from dspy.utils.exceptions import LMError as DSPyLMError  # noqa: E402
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator  # noqa: E402

from remedy.cases.errors import LMError, PatchRejectedError, RemedyError  # noqa: E402
from remedy.cases.model import Cause, Diagnosis, RootCause  # noqa: E402
from remedy.cases.patches import spec as patch_spec  # noqa: E402
from remedy.cases.patches.spec import Patch  # noqa: E402

from .diagnosis import (  # noqa: E402
    UNSPECIFIED,
    CandidatePatch,
    DiagnosisContext,
    DiagnosisReport,
    fits_subject,
    patch_family,
    register_diagnoser,
)
from .offline import OfflineDiagnoser  # noqa: E402
from .priors import match_priors  # noqa: E402

__all__ = [
    "DiagnoseFailure",
    "LLMDiagnoserProgram",
    "DiagnoseFromDescription",
    "LLMDescribeProgram",
    "LLMChooseProgram",
    "ChooseCause",
    "ChooseCauseFromDescription",
    "OUTPUTS",
    "parse_choice",
    "choose_grammar",
    "build_description_inputs",
    "LLMDiagnoser",
    "AutoDiagnoser",
    "LLM_PROGRAM",
    "lm_from_env",
    "lm_configured",
    "build_inputs",
    "parse_outputs",
]

LLM_PROGRAM = "dspy-diagnose-1"
#: the program for failures described in words (``remedy diagnose --describe``).
DESCRIBE_PROGRAM = "dspy-describe-1"
#: sampling temperature of retries after a malformed answer.
RETRY_TEMPERATURE = 0.7
_TAXONOMY = ", ".join(c.value for c in RootCause)


_FIELD_HINTS = {
    "code": "python source defining shaped_reward(...)",
    "changes": "{constructor_arg: value}",
    "stages": '[{"env_kwargs": {...}, "fraction": 0..1}] (fractions sum to 1)',
    "predicate": "python expression over obs, action, info; True when violated",
    "mode": '"penalty"|"terminate"',
}


def _patch_schema() -> str:
    """One entry per patch-part kind with its fields and types, straight from the spec models."""
    lines = []
    for name in patch_spec.__all__:
        fields = getattr(getattr(patch_spec, name), "model_fields", None)
        if not fields or "kind" not in fields:
            continue
        args = ", ".join(
            f'"{f}": {_FIELD_HINTS.get(f) or _type_name(info.annotation)}' for f, info in fields.items() if f != "kind"
        )
        lines.append(f'{{"kind": "{fields["kind"].default}", {args}}}')
    return "; ".join(lines)


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


# The answer fields both diagnosis signatures share (one parser reads them).
_CANDIDATES_DESC = "plausible root causes"
_EVIDENCE_DESC = "evidence for and against each candidate cause"
_ROOT_CAUSES_DESC = (
    f'JSON list, most likely first: [{{"cause": one of [{_TAXONOMY}], "confidence": 0..1, "rationale": str}}]'
)
_PATCHES_DESC = (
    'JSON list, best first: [{"patch": {"parts": [PART, ...], "description": str}, "rationale": str, '
    '"expected_effect": str, "side_effects": str, "compute_cost": "low"|"medium"|"high", '
    '"cites": [case or rule ids]}] where PART is one of: ' + _patch_schema()
)


class DiagnoseFailure(dspy.Signature):
    """You are an experienced reinforcement-learning engineer diagnosing a trained agent that fails.

    Work step by step: list observations from the signature report; name candidate causes; weigh the
    evidence for and against each (similar verified cases count most, their effects were measured
    against a same-budget control; a patch listed under previous attempts that did not improve must
    not be proposed again); then give the fix for the most likely cause. Prefer simple patches; a
    sparse "+100 on success, -0.1 per step" reward is often safer than a clever dense one. Name each
    patch's side effects and compute cost. Reward code must define
    shaped_reward(obs, action, reward, next_obs, terminated, truncated, info) -> float using only
    `np` and `math` (no imports), guard against NaN/inf/huge inputs, clip, and avoid division by zero;
    `reward` is the reward the agent trained on and info.get("original_reward", reward) the env's own.
    """

    env_description: str = dspy.InputField(desc="environment: id, kwargs, spaces, reward density, task success")
    algorithm: str = dspy.InputField(desc="algorithm, hyperparameters and training steps")
    reward_code: str = dspy.InputField(desc="the reward the agent was trained on")
    signature_report: str = dspy.InputField(desc="key failure numbers, symptom tags and sample failure episodes")
    similar_cases: str = dspy.InputField(desc="similar past cases with root causes, patches and verified effects")
    rules: str = dspy.InputField(desc="matching accepted rules and built-in priors (id: when -> suggests)")
    previous_attempts: str = dspy.InputField(desc="patches already tried on this agent and what happened")
    observations: str = dspy.OutputField(desc="what stands out in the data")
    candidate_causes: str = dspy.OutputField(desc=_CANDIDATES_DESC)
    evidence: str = dspy.OutputField(desc=_EVIDENCE_DESC)
    root_causes: str = dspy.OutputField(desc=_ROOT_CAUSES_DESC)
    patches: str = dspy.OutputField(desc=_PATCHES_DESC)


class LLMDiagnoserProgram(dspy.Module):
    """``ChainOfThought(DiagnoseFailure)``; the optimizer compiles and saves this module."""

    signature: type[dspy.Signature] = DiagnoseFailure

    def __init__(self) -> None:
        super().__init__()
        self.diagnose = dspy.ChainOfThought(self.signature)

    def forward(self, config: dict[str, Any] | None = None, **inputs: str) -> dspy.Prediction:
        """Run the chain of thought on the formatted context (``config``: per-call LM settings)."""
        return self.diagnose(**inputs, config=dict(config or {}))


class DiagnoseFromDescription(dspy.Signature):
    """You are an experienced reinforcement-learning engineer diagnosing a trained agent from a description.

    There is no measurement, only what someone wrote (a bug report, a forum post, a colleague's account of a
    video). Work step by step: list what the description says the agent does; name candidate causes; weigh
    them against the similar past cases (their verified effects were measured against a same-budget control)
    and the matching rules; then give the fix for the most likely cause. Say what the description leaves
    unknown. Prefer simple patches. Reward code must define
    shaped_reward(obs, action, reward, next_obs, terminated, truncated, info) -> float using only
    `np` and `math` (no imports), guard against NaN/inf/huge inputs and clip.
    """

    description: str = dspy.InputField(desc="the failure in the reporter's words")
    environment: str = dspy.InputField(desc="env id, algorithm and action space when the reporter named them")
    symptom_reading: str = dspy.InputField(desc="symptom tags the description was read as, with similarity 0..1")
    similar_cases: str = dspy.InputField(desc="similar past cases with root causes, patches and verified effects")
    rules: str = dspy.InputField(desc="matching accepted rules and built-in priors (id: when -> suggests)")
    observations: str = dspy.OutputField(desc="what the description says, and what it leaves unknown")
    candidate_causes: str = dspy.OutputField(desc=_CANDIDATES_DESC)
    evidence: str = dspy.OutputField(desc=_EVIDENCE_DESC)
    root_causes: str = dspy.OutputField(desc=_ROOT_CAUSES_DESC)
    patches: str = dspy.OutputField(desc=_PATCHES_DESC)


class LLMDescribeProgram(LLMDiagnoserProgram):
    """``ChainOfThought(DiagnoseFromDescription)``: the LLM backend's program for described failures."""

    signature = DiagnoseFromDescription


# ---- the least a small model can keep: cause names picked from the taxonomy -------------------

#: ``full``: the chain of thought above (observations, evidence, ranked causes and patches as JSON);
#: ``choose``: only up to three cause names picked from the taxonomy, most likely first (no patches:
#: they come from the typed templates); ``choose-grammar``: the same, decoded under a grammar that
#: admits nothing else (``grammar`` in the request body: llama.cpp servers, ``remedy lm serve``).
OUTPUTS = ("full", "choose", "choose-grammar")
CHOOSE_PROGRAM = "dspy-choose-1"
#: the warning (and error) prefix naming answers outside the taxonomy (counted by bench/llm_diagnosis.py)
OUTSIDE_TAXONOMY = "LM named causes outside the taxonomy (dropped, not mapped)"
_CHOICES = [c.value for c in RootCause if c is not RootCause.unknown]
_CHOOSE_DESC = "up to 3 cause names, most likely first, comma-separated, each one of: " + ", ".join(_CHOICES)


class ChooseCause(dspy.Signature):
    """Name the most likely root causes of a failing reinforcement-learning agent, choosing only from the list."""

    env_description: str = dspy.InputField(desc="environment: id, kwargs, spaces, reward density, task success")
    algorithm: str = dspy.InputField(desc="algorithm, hyperparameters and training steps")
    signature_report: str = dspy.InputField(desc="key failure numbers, symptom tags and sample failure episodes")
    similar_cases: str = dspy.InputField(desc="similar past cases with root causes, patches and verified effects")
    rules: str = dspy.InputField(desc="matching accepted rules and built-in priors (id: when -> suggests)")
    causes: str = dspy.OutputField(desc=_CHOOSE_DESC)


class ChooseCauseFromDescription(dspy.Signature):
    """Name the most likely root causes of a reinforcement-learning failure described in words, choosing only
    from the list. Similar past cases and rules, when given, show which causes fit such symptoms."""

    description: str = dspy.InputField(desc="the failure in the reporter's words")
    environment: str = dspy.InputField(desc="env id, algorithm and action space when the reporter named them")
    symptom_reading: str = dspy.InputField(desc="symptom tags the description was read as, with similarity 0..1")
    similar_cases: str = dspy.InputField(desc="similar past cases with root causes, patches and verified effects")
    rules: str = dspy.InputField(desc="matching accepted rules and built-in priors (id: when -> suggests)")
    causes: str = dspy.OutputField(desc=_CHOOSE_DESC)


class LLMChooseProgram(dspy.Module):
    """``Predict(ChooseCause)`` (or the description variant): no reasoning tokens, one short answer."""

    def __init__(self, signature: type[dspy.Signature] = ChooseCause) -> None:
        super().__init__()
        self.signature = signature
        self.choose = dspy.Predict(signature)

    def forward(self, config: dict[str, Any] | None = None, **inputs: str) -> dspy.Prediction:
        """Ask for the cause names (``config``: per-call LM settings, e.g. the grammar)."""
        return self.choose(
            **{k: v for k, v in inputs.items() if k in self.signature.input_fields}, config=dict(config or {})
        )


def choose_grammar() -> str:
    """A GBNF grammar for the ChatAdapter's answer: the ``causes`` header, then 1-3 names from the list."""
    names = " | ".join(f'"{c}"' for c in _CHOICES)
    return (
        'root ::= "[[ ## causes ## ]]\\n" name (", " name)? (", " name)? "\\n\\n[[ ## completed ## ]]"\n'
        f"name ::= {names}\n"
    )


def parse_choice(text: str) -> tuple[list[RootCause], list[str]]:
    """The names in the answer that are in the taxonomy (in order, once each) and those that are not.

    Names are matched exactly after case and separator folding ("Sparse reward" -> sparse_reward);
    nothing outside the list is mapped to a cause.
    """
    known, outside = [], []
    for raw in re.split(r"[,;\n]+", text or ""):
        name = re.sub(r"^\s*(?:[-*]|\d+[.)])\s*", "", raw).strip().strip("`'\".[]").strip()
        if not name:
            continue
        key = re.sub(r"[\s-]+", "_", name.lower())
        if key in _CHOICES:
            if RootCause(key) not in known:
                known.append(RootCause(key))
        else:
            outside.append(name[:60])
    return known[:3], outside


# ---- context -> prompt inputs ----------------------------------------------------------------

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
    rows = []
    for rc in ctx.cases:
        c = rc.case
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


def build_inputs(ctx: DiagnosisContext) -> dict[str, str]:
    """The program's input fields, formatted from the diagnosis context."""
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
        "similar_cases": _cases_text(ctx),
        "rules": _rules_text(ctx)[0],
        "previous_attempts": tried,
    }


def build_description_inputs(ctx: DiagnosisContext) -> dict[str, str]:
    """The description program's inputs: the text, what the user named, the tags read, cases and rules."""
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
        "similar_cases": _cases_text(ctx),
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


def lm_configured(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``REMEDY_LM`` names a model."""
    env = os.environ if environ is None else environ
    return bool(env.get("REMEDY_LM", "").strip())


def lm_from_env(environ: Mapping[str, str] | None = None) -> dspy.LM:
    """A ``dspy.LM`` from ``REMEDY_LM`` and friends (no global DSPy settings are touched)."""
    env = os.environ if environ is None else environ
    model = env.get("REMEDY_LM", "").strip()
    if not model:
        raise LMError(
            "no LM configured: set REMEDY_LM (e.g. openai/gpt-4o-mini or ollama_chat/llama3.1) "
            "or use --diagnoser offline"
        )
    kwargs: dict[str, Any] = {
        "temperature": _setting(env, "REMEDY_LM_TEMPERATURE", 0.0, float),
        "max_tokens": _setting(env, "REMEDY_LM_MAX_TOKENS", 4000, int),
        "num_retries": _setting(env, "REMEDY_LM_NUM_RETRIES", 2, int),
        "engine": env.get("REMEDY_LM_ENGINE", "auto"),
        "cache": False,
    }
    if env.get("REMEDY_LM_API_BASE"):
        kwargs["api_base"] = env["REMEDY_LM_API_BASE"]
    if env.get("REMEDY_LM_API_KEY"):
        kwargs["api_key"] = env["REMEDY_LM_API_KEY"]
    elif kwargs.get("api_base") and model.startswith("openai/") and not env.get("OPENAI_API_KEY"):
        kwargs["api_key"] = "not-needed"  # local OpenAI-compatible servers ignore the key but clients want one
    if env.get("REMEDY_LM_TIMEOUT"):
        kwargs["timeout"] = _setting(env, "REMEDY_LM_TIMEOUT", 120.0, float)
    try:
        return dspy.LM(model, **kwargs)
    except (ValueError, TypeError) as ex:
        raise LMError(f"cannot configure the LM '{model}': {ex}; check REMEDY_LM and REMEDY_LM_ENGINE") from ex


def _setting(env: Mapping[str, str], key: str, default: Any, cast: type) -> Any:
    raw = env.get(key, "")
    if not str(raw).strip():
        return default
    try:
        return cast(raw)
    except ValueError:
        raise LMError(f"{key}={raw!r} is not a valid {cast.__name__}; fix or unset it") from None


def _endpoint(lm: Any) -> str:
    kw = getattr(lm, "kwargs", {}) or {}
    return str(kw.get("api_base") or kw.get("base_url") or "the provider's default endpoint")


def _lm_failure(lm: Any, ex: Exception) -> str:
    """One line naming the endpoint and model: unreachable, or reachable but refusing the call."""
    text = re.sub(r"^\[[^\]]*\]\s*", "", str(ex)).strip().splitlines()[0] if str(ex).strip() else type(ex).__name__
    model = getattr(lm, "model", "?")
    if isinstance(ex, (LMTransportError, LMTimeoutError)) or "connect" in text.lower():
        if "refused" in text.lower():
            text = "connection refused"
        return (
            f"could not reach the LM at {_endpoint(lm)} ({model}): {text[:300]}; "
            "check REMEDY_LM_API_BASE or use --diagnoser offline"
        )
    return (
        f"the LM at {_endpoint(lm)} ({model}) refused the request: {text[:300]}; "
        "check REMEDY_LM, REMEDY_LM_API_KEY or use --diagnoser offline"
    )


class LLMDiagnoser:
    """Diagnosis by a DSPy program; same report type as the offline backend."""

    name = "llm"
    needs_lm = True
    #: runs stored ``llm`` program versions (DSPy programs compiled by ``remedy optimize --backend llm``)
    program_kind = "llm"

    def __init__(
        self,
        lm: Any | None = None,
        max_retries: int = 2,
        program: LLMDiagnoserProgram | None = None,
        program_path: str | None = None,
        max_candidates: int = 5,
        describe_program: LLMDescribeProgram | None = None,
        program_id: str | None = None,
        output: str | None = None,
        grounded: bool = True,
        choose_program: LLMChooseProgram | None = None,
    ) -> None:
        self._lm = lm
        #: the ``choose`` program to run (e.g. one compiled with demos by bench/llm_diagnosis.py
        #: ``--optimize``) when its signature fits the case (described or measured); else a fresh one
        self.choose_program = choose_program
        #: the answer asked for (:data:`OUTPUTS`; ``REMEDY_LM_OUTPUT``, default ``full``)
        self.output = (output or os.environ.get("REMEDY_LM_OUTPUT", "") or "full").strip()
        if self.output not in OUTPUTS:
            raise LMError(f"unknown LM output {self.output!r}; use one of {', '.join(OUTPUTS)} (REMEDY_LM_OUTPUT)")
        #: False: the similar cases and rules are withheld (zero-shot; the benchmark's ablation)
        self.grounded = grounded
        self.max_retries = max(0, int(max_retries))
        #: whether the caller chose the program (an active stored version then does not replace it)
        self.program_chosen = program is not None or bool(program_path)
        self.program = program or LLMDiagnoserProgram()
        self.describe_program = describe_program or LLMDescribeProgram()
        if program_path:
            self.program.load(program_path)
        self.max_candidates = max_candidates
        self.program_id = program_id

    def with_program(self, program: LLMDiagnoserProgram, program_id: str) -> LLMDiagnoser:
        """The same diagnoser (LM, retries, description program) running a stored program version."""
        return LLMDiagnoser(
            lm=self._lm,
            max_retries=self.max_retries,
            program=program,
            max_candidates=self.max_candidates,
            describe_program=self.describe_program,
            program_id=program_id,
            output=self.output,
            grounded=self.grounded,
            choose_program=self.choose_program,
        )

    def preflight(self) -> None:
        """Raise LMError now when no LM is configured (``REMEDY_LM``), before any rollout."""
        _ = self.lm

    @property
    def lm(self) -> Any:
        """The LM in use (built from the environment on first use)."""
        if self._lm is None:
            self._lm = lm_from_env()
        return self._lm

    @property
    def program_version(self) -> str:
        """The stored version's id when it runs one (``remedy optimize``), else the program name plus a hash
        of its instructions and demos."""
        if self.program_id is not None:
            return self.program_id
        state = json.dumps(self.program.dump_state(), sort_keys=True, default=str)
        blob = (DiagnoseFailure.instructions + state).encode()
        return f"{LLM_PROGRAM}:{hashlib.sha256(blob).hexdigest()[:8]}"

    def diagnose(self, ctx: DiagnosisContext) -> DiagnosisReport:
        """Ask the program, parse, sandbox-check; raises LMError when unreachable or never parseable."""
        described = bool(ctx.description)  # a failure in words: the description program, same report type
        inputs = build_description_inputs(ctx) if described else build_inputs(ctx)
        if not self.grounded:
            inputs.update(similar_cases="(not given)", rules="(not given)")
        if self.output != "full":
            return self._chosen(ctx, inputs, described)
        causes, patches, warnings = self._ask(inputs, self.describe_program if described else self.program)
        candidates = self._candidates(ctx, patches, warnings)
        known_cases = [rc.case.case_id for rc in ctx.cases]
        _, rule_ids = _rules_text(ctx)
        cited = {x for c in candidates for x in c.cites}
        diagnosis = Diagnosis(
            causes=causes,
            backend=self.name,
            program_version=self.describe_program_version if described else self.program_version,
            cited_cases=[cid for cid in known_cases if cid in cited] or known_cases,
            cited_rules=[rid for rid in rule_ids if rid in cited] or rule_ids,
        )
        return DiagnosisReport(
            signature=ctx.signature, diagnosis=diagnosis, candidates=candidates, warnings=[*ctx.notes, *warnings]
        )

    def _chosen(self, ctx: DiagnosisContext, inputs: dict[str, str], described: bool) -> DiagnosisReport:
        """The ``choose`` answer: cause names from the list, ranked; no patches (templates supply them)."""
        signature = ChooseCauseFromDescription if described else ChooseCause
        given = self.choose_program
        program = given if given is not None and given.signature is signature else LLMChooseProgram(signature)
        config = {"extra_body": {"grammar": choose_grammar()}} if self.output == "choose-grammar" else {}
        lm, problems = self.lm, []
        for attempt in range(self.max_retries + 1):
            try:
                with dspy.context(lm=lm, adapter=dspy.ChatAdapter(use_json_adapter_fallback=False)):
                    answer = program(
                        config={**config, **({"temperature": RETRY_TEMPERATURE} if attempt else {})}, **inputs
                    )
            except AdapterParseError as ex:
                problems.append(f"attempt {attempt + 1}: unparseable answer ({str(ex).splitlines()[0][:160]})")
                continue
            except DSPyLMError as ex:
                raise LMError(_lm_failure(lm, ex)) from ex
            known, outside = parse_choice(answer.causes)
            warnings = [f"{OUTSIDE_TAXONOMY}: {', '.join(outside)}"] if outside else []
            if known:
                causes = [
                    Cause(
                        cause=c,
                        confidence=round(1.0 / (i + 1), 4),
                        rationale=f"the LM's pick #{i + 1} (rank, not a probability)",
                    )
                    for i, c in enumerate(known)
                ]
                state = json.dumps(program.dump_state(), sort_keys=True, default=str)
                version = hashlib.sha256((program.signature.instructions + state + self.output).encode()).hexdigest()[
                    :8
                ]
                diagnosis = Diagnosis(
                    causes=causes,
                    backend=self.name,
                    program_version=f"{CHOOSE_PROGRAM}:{version}",
                    cited_cases=[rc.case.case_id for rc in ctx.cases] if self.grounded else [],
                    cited_rules=_rules_text(ctx)[1] if self.grounded else [],
                )
                return DiagnosisReport(signature=ctx.signature, diagnosis=diagnosis, warnings=[*ctx.notes, *warnings])
            problems.append(f"attempt {attempt + 1}: {OUTSIDE_TAXONOMY}: {', '.join(outside) or '(nothing)'}")
        raise LMError(
            f"the LM {getattr(lm, 'model', '?')} gave malformed output {self.max_retries + 1} times "
            f"({problems[-1]}); try a stronger model, REMEDY_LM_OUTPUT=choose-grammar or --diagnoser offline"
        )

    @property
    def describe_program_version(self) -> str:
        """The description program's name plus a hash of its instructions and demos."""
        state = json.dumps(self.describe_program.dump_state(), sort_keys=True, default=str)
        blob = (DiagnoseFromDescription.instructions + state).encode()
        return f"{DESCRIBE_PROGRAM}:{hashlib.sha256(blob).hexdigest()[:8]}"

    def _ask(self, inputs: dict[str, str], program: dspy.Module | None = None) -> tuple[list[Cause], list, list[str]]:
        lm, problems = self.lm, []
        adapter = dspy.ChatAdapter(use_json_adapter_fallback=False)  # our own bounded retry handles format errors
        for attempt in range(self.max_retries + 1):
            try:
                # a retry samples warmer, so a deterministic model does not repeat the same malformed answer
                config = {"temperature": RETRY_TEMPERATURE} if attempt else {}
                with dspy.context(lm=lm, adapter=adapter):
                    pred = (program or self.program)(config=config, **inputs)
                return parse_outputs(pred.root_causes, pred.patches)
            except AdapterParseError as ex:
                problems.append(f"attempt {attempt + 1}: unparseable answer ({str(ex).splitlines()[0][:160]})")
            except _Malformed as ex:
                problems.append(f"attempt {attempt + 1}: {ex}")
            except DSPyLMError as ex:
                raise LMError(_lm_failure(lm, ex)) from ex
        raise LMError(
            f"the LM {getattr(lm, 'model', '?')} gave malformed output {self.max_retries + 1} times "
            f"({problems[-1]}); try a stronger model or --diagnoser offline"
        )

    def _candidates(self, ctx: DiagnosisContext, patches: list, warnings: list[str]) -> list[CandidatePatch]:
        out: list[CandidatePatch] = []
        for patch, meta in patches:
            if len(out) >= self.max_candidates:
                break
            ok, why = sandbox_check(patch, ctx)
            if not ok:
                warnings.append(f"rejected LLM candidate '{patch.summary()[:80]}' by the sandbox: {why}")
                continue
            rank = len(out)
            out.append(
                CandidatePatch(
                    patch=patch,
                    family=patch_family(patch),
                    rationale=meta.rationale,
                    expected_effect=meta.expected_effect,
                    side_effects=meta.side_effects,
                    compute_cost=meta.compute_cost,
                    cites=meta.cites,
                    score=round(1.0 / (rank + 1), 4),
                )
            )
        return out


class AutoDiagnoser:
    """``llm`` when an LM is configured (``REMEDY_LM`` or an explicit ``lm``), else ``offline``.

    Under ``auto`` an LM failure never stops the diagnosis: it falls back to offline with a warning.
    """

    name = "auto"

    def __init__(self, lm: Any | None = None, max_retries: int = 2, **offline_params: Any) -> None:
        self._lm, self.max_retries = lm, max_retries
        self.offline = OfflineDiagnoser(**offline_params)

    def diagnose(self, ctx: DiagnosisContext) -> DiagnosisReport:
        """Try the LLM backend when configured; fall back to offline on LMError."""
        if self._lm is None and not lm_configured():
            return self.offline.diagnose(ctx)
        try:
            return LLMDiagnoser(lm=self._lm, max_retries=self.max_retries).diagnose(ctx)
        except LMError as ex:
            report = self.offline.diagnose(ctx)
            note = f"LLM diagnosis failed, used offline instead: {ex}"
            return report.model_copy(update={"warnings": [note, *report.warnings]})


register_diagnoser("llm", LLMDiagnoser)
register_diagnoser("auto", AutoDiagnoser)
