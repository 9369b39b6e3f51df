"""The LLM diagnoser: a DSPy program grounded in retrieved cases, rules and priors.

The program (:class:`DiagnoseFailure` under ``dspy.ChainOfThought``) gets
structured, pre-analysed context, never raw logs: the env, the algorithm, the
current reward code, the signature's key numbers and a few failure episodes,
similar cases with their verified effects, the offline vote's candidate remedies
(ordered by the KB's remedy ranker when one is active) with how each family's
attempts ended, matching rules and built-in priors, and what a fix loop already tried. It answers observations -> candidate causes
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

import copy
import hashlib
import json
import os
import re
from collections.abc import Mapping
from typing import Any

from .offline_env import offline_defaults

offline_defaults()  # before DSPy imports litellm, which reads them at import

import dspy  # noqa: E402
from dspy.utils.exceptions import (  # noqa: E402
    AdapterParseError,
    LMTimeoutError,
    LMTransportError,
)
from dspy.utils.exceptions import LMError as DSPyLMError  # noqa: E402

from remedy.cases.errors import LMError  # noqa: E402
from remedy.cases.model import Cause, Diagnosis  # noqa: E402

from .diagnosis import (  # noqa: E402
    CandidatePatch,
    DiagnosisContext,
    DiagnosisReport,
    patch_family,
    register_diagnoser,
)
from .llm_io import (  # noqa: E402
    _Malformed,
    _rules_text,
    build_description_inputs,
    build_inputs,
    parse_outputs,
    remedies_text,
    sandbox_check,
)
from .llm_programs import (  # noqa: E402
    CHOOSE_PROGRAM,
    DESCRIBE_PROGRAM,
    LLM_PROGRAM,
    OUTPUTS,
    OUTSIDE_TAXONOMY,
    RETRY_TEMPERATURE,
    ChooseCause,
    ChooseCauseFromDescription,
    DiagnoseFailure,
    DiagnoseFromDescription,
    LLMChooseProgram,
    LLMDescribeProgram,
    LLMDiagnoserProgram,
    choose_grammar,
    parse_choice,
)
from .offline import OfflineDiagnoser  # noqa: E402

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
    "remedies_text",
    "parse_outputs",
    "sandbox_check",
    "OUTSIDE_TAXONOMY",
]


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
        vote: OfflineDiagnoser | None = None,
        remedies: bool = True,
    ) -> None:
        self._lm = lm
        #: the vote whose candidates the program sees as ranked remedies (:func:`remedies_text`): the KB
        #: hands it its active offline version and remedy ranker; None: the built-in vote, no ranker
        self.vote = vote
        #: False: the ranked remedies are left out of the grounding (the benchmark's ablation)
        self.remedies = remedies
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
            vote=self.vote,
            remedies=self.remedies,
        )

    def with_vote(self, vote: OfflineDiagnoser) -> LLMDiagnoser:
        """The same diagnoser (of the same class) showing ``vote``'s ranked remedies."""
        clone = copy.copy(self)
        clone.vote = vote
        return clone

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
        build = build_description_inputs if described else build_inputs
        inputs = build(ctx, self.vote, self.remedies and self.grounded)
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
            return LLMDiagnoser(lm=self._lm, max_retries=self.max_retries, vote=self.offline).diagnose(ctx)
        except LMError as ex:
            report = self.offline.diagnose(ctx)
            note = f"LLM diagnosis failed, used offline instead: {ex}"
            return report.model_copy(update={"warnings": [note, *report.warnings]})


register_diagnoser("llm", LLMDiagnoser)
register_diagnoser("auto", AutoDiagnoser)
