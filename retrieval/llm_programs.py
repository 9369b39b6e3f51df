"""The LM diagnoser's DSPy programs: what they are asked and the answer formats a small model can keep.

Signatures and modules for a failure signature (:class:`DiagnoseFailure`) and a description
(:class:`DiagnoseFromDescription`), the choose-only variants (:class:`ChooseCause`) and their
grammar, and the parsing of a chosen list. :mod:`remedy.retrieval.llm` runs them.
"""

from __future__ import annotations

import re
from typing import Any

from .offline_env import offline_defaults

offline_defaults()  # before DSPy imports litellm, which reads them at import

import dspy  # noqa: E402

from remedy.cases.model import RootCause  # noqa: E402
from remedy.cases.patches import spec as patch_spec  # noqa: E402

__all__ = [
    "LLM_PROGRAM",
    "DESCRIBE_PROGRAM",
    "CHOOSE_PROGRAM",
    "RETRY_TEMPERATURE",
    "OUTPUTS",
    "OUTSIDE_TAXONOMY",
    "DiagnoseFailure",
    "LLMDiagnoserProgram",
    "DiagnoseFromDescription",
    "LLMDescribeProgram",
    "ChooseCause",
    "ChooseCauseFromDescription",
    "LLMChooseProgram",
    "choose_grammar",
    "parse_choice",
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
