"""The llm backend of ``remedy optimize``: compile the DSPy diagnosis program against verified outcomes.

:func:`compile_llm` turns the job's examples into ``dspy.Example`` s whose inputs are exactly what
``remedy diagnose --diagnoser llm`` shows the program for that case's signature
(:func:`~remedy.retrieval.llm.build_inputs` of a :class:`DiagnosisContext`), compiles
:class:`~remedy.retrieval.llm.LLMDiagnoserProgram` with one DSPy optimizer, and scores the active
program and the compiled one on the validation split with the job's metric
(:func:`~remedy.optimizer.metric.score_prediction` over the parsed outputs; malformed output
scores 0 and its feedback says so).

- ``bootstrap``: ``dspy.BootstrapFewShotWithRandomSearch``; ``trials`` candidate demo sets.
- ``mipro``: ``dspy.MIPROv2`` (Optuna over instructions and demo sets); ``trials`` search trials.
- ``gepa``: ``dspy.GEPA`` (reflective instruction evolution from the metric's feedback text);
  its metric-call budget pays for ``trials`` proposals that each reach a full evaluation on the
  selection set (a rejected proposal costs only two minibatches, so it usually makes more
  proposals than ``trials``). It needs a reflection
  LM: ``reflection_lm``, else ``REMEDY_REFLECTION_LM`` (with ``REMEDY_REFLECTION_LM_API_BASE`` /
  ``_API_KEY``), else the task LM as configured by ``REMEDY_LM``. An LM object passed as ``lm``
  is never silently reused for reflection.

The validation split is the promotion yardstick, so no optimizer ever sees it: each selects its
candidates on an inner split of *train* (grouped by scenario / run and seeded like the outer
one). Demos are kept only from predictions scoring at least :data:`DEMO_THRESHOLD` (a right
top-1 cause on a solved example). Retrieval context comes from ``contexts`` (the job retrieves
leave-group-out neighbours as ``remedy diagnose`` would); an example without one gets an empty
retrieval context (priors only). The KB's accepted rules are not shown: they were mined from
the same cases and would leak the validation labels.

Nothing falls back: an optimizer that cannot run as asked (no LM, no reflection LM, the ``gepa``
package missing, too few examples for its splits, an unreachable LM) raises
:class:`~remedy.cases.errors.OptimizeError` with what to do.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from remedy.retrieval.offline_env import offline_defaults

offline_defaults()  # before DSPy imports litellm, which reads them at import

import dspy  # noqa: E402
from dspy.utils.exceptions import AdapterParseError  # noqa: E402
from dspy.utils.exceptions import LMError as DSPyLMError  # noqa: E402

from remedy.cases.errors import LMError, OptimizeError  # noqa: E402
from remedy.retrieval.diagnosis import DiagnosisContext, patch_family  # noqa: E402
from remedy.retrieval.llm import (  # noqa: E402
    LLMDiagnoserProgram,
    _Malformed,  # parse_outputs' documented "cannot parse" signal
    build_inputs,
    lm_configured,
    lm_from_env,
    parse_outputs,
)

from .dataset import Example, split_examples  # noqa: E402
from .metric import Score, score_prediction  # noqa: E402
from .versions import ProgramVersion  # noqa: E402

__all__ = [
    "LLMCompiled",
    "compile_llm",
    "check_request",
    "load_program",
    "llm_metric",
    "score_outputs",
    "to_dspy_examples",
    "OPTIMIZERS",
]

OPTIMIZERS = ("gepa", "mipro", "bootstrap")
#: a bootstrapped demo is kept only when its prediction scored at least this (a right top-1 cause)
DEMO_THRESHOLD = 0.7
#: share of the train groups the optimizers select candidates on
INNER_VAL_FRACTION = 0.3
#: GEPA's reflection minibatch (its default); the inner train split must hold at least this many
GEPA_MINIBATCH = 3
#: fewest inner-train examples each optimizer needs (bootstrap: one demo; mipro: a demo set and a data summary)
MIN_INNER_TRAIN = {"bootstrap": 1, "mipro": 2, "gepa": GEPA_MINIBATCH}
#: MIPROv2 evaluates minibatches of this size only when the inner validation split is larger
MIPRO_MINIBATCH = 35
_KEY = "example_key"


@dataclass(frozen=True)
class LLMCompiled:
    """What :func:`compile_llm` produced: the program's saved state, both validation scores, and how."""

    program: str  # the compiled program's state (``dump_state``) as JSON text: what ``ProgramStore.add`` stores
    active_val: float  # the active program (stored llm version, else the uncompiled one) on validation
    new_val: float  # the compiled program on validation
    optimizer: str
    details: dict[str, Any] = field(default_factory=dict)


def load_program(program_json: str) -> LLMDiagnoserProgram:
    """An :class:`LLMDiagnoserProgram` carrying a stored version's state (instructions and demos)."""
    program = LLMDiagnoserProgram()
    try:
        program.load_state(json.loads(program_json))
    except (ValueError, KeyError, TypeError) as ex:
        raise OptimizeError(
            f"the stored llm program does not load ({ex}); roll it back with `remedy programs rollback --backend llm`"
        ) from ex
    return program


def to_dspy_examples(
    examples: Sequence[Example], contexts: Mapping[str, DiagnosisContext] | None = None
) -> list[dspy.Example]:
    """Each example as a ``dspy.Example``: the program's inputs (from its context) plus its key and labels."""
    out = []
    for ex in examples:
        ctx = (contexts or {}).get(ex.key) or DiagnosisContext(subject=ex.subject, signature=ex.signature)
        inputs = build_inputs(ctx)
        labels = {
            _KEY: ex.key,
            "verified_causes": ", ".join(c.value for c in ex.causes),
            "verified_families": ", ".join(f.value for f in ex.families),
        }
        out.append(dspy.Example(**inputs, **labels).with_inputs(*inputs))
    return out


def score_outputs(example: Example, pred: Any) -> Score:
    """The metric on a prediction's raw ``root_causes`` / ``patches`` text; malformed output scores 0."""
    try:
        causes, patches, _ = parse_outputs(getattr(pred, "root_causes", ""), getattr(pred, "patches", ""))
    except _Malformed as ex:
        return Score(
            0.0, f"malformed output: {ex}. root_causes and patches must be JSON lists as described. Score 0.00."
        )
    return score_prediction(example, [c.cause for c in causes], [patch_family(p) for p, _ in patches])


def llm_metric(examples: Sequence[Example], *, feedback: bool) -> Callable[..., Any]:
    """A DSPy metric over ``examples`` (found by key): ``dspy.Prediction(score, feedback)`` for GEPA, else a float."""
    by_key = {e.key: e for e in examples}

    def metric(gold: Any, pred: Any, trace: Any = None, pred_name: Any = None, pred_trace: Any = None) -> Any:
        s = score_outputs(by_key[gold[_KEY]], pred)
        return dspy.Prediction(score=s.score, feedback=s.feedback) if feedback else s.score

    return metric


def compile_llm(
    train: Sequence[Example],
    val: Sequence[Example],
    *,
    optimizer: str,
    seed: int = 0,
    trials: int = 16,
    active: ProgramVersion | None = None,
    lm: Any | None = None,
    reflection_lm: Any | None = None,
    contexts: Mapping[str, DiagnosisContext] | None = None,
    environ: Mapping[str, str] | None = None,
) -> LLMCompiled:
    """Compile the diagnosis program on ``train`` with ``optimizer`` and score it and the active one on ``val``.

    ``lm`` None: :func:`~remedy.retrieval.llm.lm_from_env`. ``environ`` (default ``os.environ``) is
    where ``REMEDY_LM`` and ``REMEDY_REFLECTION_LM`` are read. See the module docstring for the
    reflection LM, the inner split and the errors.
    """
    task_lm, refl, inner_train, inner_val = _plan(train, val, optimizer, seed, trials, lm, reflection_lm, environ)
    start = _start_program(active)
    d_val = to_dspy_examples(val, contexts)
    with dspy.context(lm=task_lm, adapter=dspy.ChatAdapter(use_json_adapter_fallback=False)):
        active_scores = _evaluate(start, val, d_val, task_lm)  # first LM calls: an unreachable LM fails here
        compiled = _guarded(task_lm, lambda: _compile(
            optimizer, start, inner_train, inner_val, contexts, task_lm, refl, seed=seed, trials=trials
        ))  # fmt: skip
        new_scores = _evaluate(compiled, val, d_val, task_lm)
    details = {
        "lm": str(getattr(task_lm, "model", type(task_lm).__name__)),
        "reflection_lm": None if refl is None else str(getattr(refl, "model", type(refl).__name__)),
        "inner_train": len(inner_train),
        "inner_val": len(inner_val),
        "trials": trials,
        "start": active.id if active is not None and active.backend == "llm" else "built-in program",
        "demos": len(compiled.diagnose.predict.demos),
        "instructions_changed": compiled.diagnose.predict.signature.instructions
        != start.diagnose.predict.signature.instructions,
        "val_scores": {e.key: [a, b] for e, a, b in zip(val, active_scores, new_scores, strict=True)},
    }
    return LLMCompiled(
        program=json.dumps(compiled.dump_state(), sort_keys=True, default=str),
        active_val=_mean(active_scores),
        new_val=_mean(new_scores),
        optimizer=optimizer,
        details=details,
    )


def check_request(
    train: Sequence[Example],
    val: Sequence[Example],
    *,
    optimizer: str,
    seed: int = 0,
    trials: int = 16,
    lm: Any | None = None,
    reflection_lm: Any | None = None,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Raise the :class:`OptimizeError` :func:`compile_llm` would raise before its first LM call, if any.

    Lets the job refuse an impossible request before it spends time on retrieval.
    """
    _plan(train, val, optimizer, seed, trials, lm, reflection_lm, environ)


def _plan(
    train: Sequence[Example],
    val: Sequence[Example],
    optimizer: str,
    seed: int,
    trials: int,
    lm: Any | None,
    reflection_lm: Any | None,
    environ: Mapping[str, str] | None,
) -> tuple[Any, Any, list[Example], list[Example]]:
    """The task LM, the reflection LM (GEPA) and the inner split, or the error saying why the request cannot run."""
    if optimizer not in OPTIMIZERS:
        raise OptimizeError(f"unknown llm optimizer {optimizer!r}; choose {'|'.join(OPTIMIZERS)}")
    if trials < 1:
        raise OptimizeError(f"--trials must be at least 1, got {trials}")
    if not val:
        raise OptimizeError("no validation examples to score the llm program on")
    env = os.environ if environ is None else environ
    task_lm = lm if lm is not None else _env_lm(env)
    refl = _reflection_lm(reflection_lm, env) if optimizer == "gepa" else None
    inner_train, inner_val = _inner_split(train, optimizer, seed)
    return task_lm, refl, inner_train, inner_val


# ---- the LMs -----------------------------------------------------------------------------------


def _env_lm(env: Mapping[str, str]) -> Any:
    if not lm_configured(env):
        raise OptimizeError(
            "--backend llm needs an LM: set REMEDY_LM (e.g. openai/gpt-4o-mini, or openai/<model> with "
            "REMEDY_LM_API_BASE=http://localhost:8000/v1 for a local server), or use --backend offline"
        )
    try:
        return lm_from_env(env)
    except LMError as ex:
        raise OptimizeError(str(ex).replace("--diagnoser offline", "--backend offline")) from ex


def _reflection_lm(given: Any | None, env: Mapping[str, str]) -> Any:
    """GEPA's reflection LM: ``given``, else ``REMEDY_REFLECTION_LM``, else ``REMEDY_LM``; never the task LM object."""
    if importlib.util.find_spec("gepa") is None:
        raise OptimizeError(
            "--optimizer gepa needs the `gepa` package (pip install gepa), or choose mipro or bootstrap"
        )
    if given is not None:
        return given
    model = env.get("REMEDY_REFLECTION_LM", "").strip()
    if not model:
        if not lm_configured(env):
            raise OptimizeError(
                "--optimizer gepa needs a reflection LM: set REMEDY_REFLECTION_LM (a strong model; else REMEDY_LM "
                "is used for reflection too), or choose mipro or bootstrap"
            )
        return _env_lm(env)
    # the reflection model may live elsewhere than the task model: its endpoint and key are its own
    own = {k: v for k, v in env.items() if k not in ("REMEDY_LM_API_BASE", "REMEDY_LM_API_KEY")}
    own["REMEDY_LM"] = model
    for suffix in ("API_BASE", "API_KEY"):
        if env.get(f"REMEDY_REFLECTION_LM_{suffix}"):
            own[f"REMEDY_LM_{suffix}"] = env[f"REMEDY_REFLECTION_LM_{suffix}"]
    try:
        return lm_from_env(own)
    except LMError as ex:
        raise OptimizeError(f"REMEDY_REFLECTION_LM: {ex}") from ex


def _guarded(lm: Any, run: Callable[[], LLMDiagnoserProgram]) -> LLMDiagnoserProgram:
    """Run an optimizer; an LM that fails mid-run is one OptimizeError naming it (no partial result is kept)."""
    try:
        with contextlib.redirect_stdout(sys.stderr):  # DSPy's optimizers print progress; stdout may carry --json
            return run()
    except DSPyLMError as ex:
        raise OptimizeError(_lm_failure(lm, ex)) from ex


def _lm_failure(lm: Any, ex: Exception) -> str:
    kw = getattr(lm, "kwargs", {}) or {}
    where = kw.get("api_base") or "the provider's default endpoint"
    text = (str(ex).strip().splitlines() or [type(ex).__name__])[0][:300]
    return (
        f"the LM {getattr(lm, 'model', '?')} at {where} failed: {text}; check REMEDY_LM, REMEDY_LM_API_BASE and "
        "REMEDY_LM_API_KEY, or use --backend offline (nothing was stored)"
    )


# ---- splits, programs, scoring -------------------------------------------------------------------


def _inner_split(train: Sequence[Example], optimizer: str, seed: int) -> tuple[list[Example], list[Example]]:
    """Train's own grouped split: what the optimizer learns from, and what it selects candidates on."""
    need = MIN_INNER_TRAIN[optimizer]
    groups = len({e.group for e in train})
    if groups < 2:
        raise OptimizeError(
            f"too few examples for --optimizer {optimizer}: the train split holds {len(train)} example(s) from "
            f"{groups} scenario(s) or run(s); it needs at least 2 groups to select candidates apart from validation "
            "(verify more runs, or lower --val-fraction)"
        )
    inner_train, inner_val = split_examples(train, val_fraction=INNER_VAL_FRACTION, seed=seed)
    if len(inner_train) < need:
        raise OptimizeError(
            f"too few examples for --optimizer {optimizer}: it needs {need} examples to learn from after holding out "
            f"its selection set, the train split gives {len(inner_train)} (verify more runs, lower --val-fraction, "
            "or choose bootstrap)"
        )
    return inner_train, inner_val


def _start_program(active: ProgramVersion | None) -> LLMDiagnoserProgram:
    if active is not None and active.backend == "llm" and active.program:
        return load_program(active.program)
    return LLMDiagnoserProgram()


def _evaluate(
    program: LLMDiagnoserProgram, examples: Sequence[Example], d_examples: Sequence[dspy.Example], lm: Any
) -> list[float]:
    """Each example's score, one call each (no threads: reproducible, and gentle on a local server)."""
    scores = []
    for ex, d in zip(examples, d_examples, strict=True):
        try:
            pred = program(**d.inputs())
        except AdapterParseError:
            scores.append(0.0)  # unparseable answer: the program's fault, scored as malformed
            continue
        except DSPyLMError as err:
            raise OptimizeError(_lm_failure(lm, err)) from err
        scores.append(score_outputs(ex, pred).score)
    return scores


def _mean(xs: Sequence[float]) -> float:
    return round(math.fsum(xs) / len(xs), 6) if xs else 0.0


def _compile(
    optimizer: str,
    start: LLMDiagnoserProgram,
    inner_train: Sequence[Example],
    inner_val: Sequence[Example],
    contexts: Mapping[str, DiagnosisContext] | None,
    lm: Any,
    refl: Any,
    *,
    seed: int,
    trials: int,
) -> LLMDiagnoserProgram:
    d_train, d_val = to_dspy_examples(inner_train, contexts), to_dspy_examples(inner_val, contexts)
    labelled = [*inner_train, *inner_val]
    if optimizer == "bootstrap":
        opt = dspy.BootstrapFewShotWithRandomSearch(
            llm_metric(labelled, feedback=False), max_bootstrapped_demos=4, max_labeled_demos=0,
            num_candidate_programs=trials, num_threads=1, metric_threshold=DEMO_THRESHOLD,
        )  # fmt: skip
        return opt.compile(start, trainset=d_train, valset=d_val)
    if optimizer == "mipro":
        opt = dspy.MIPROv2(
            llm_metric(labelled, feedback=False), prompt_model=lm, task_model=lm, auto=None,
            num_candidates=max(2, min(trials, 6)), max_bootstrapped_demos=4, max_labeled_demos=0,
            num_threads=1, seed=seed, verbose=False, track_stats=False, metric_threshold=DEMO_THRESHOLD,
        )  # fmt: skip
        return opt.compile(
            start, trainset=d_train, valset=d_val, num_trials=trials, seed=seed,
            minibatch=len(d_val) > MIPRO_MINIBATCH, minibatch_size=MIPRO_MINIBATCH,
        )  # fmt: skip
    # each GEPA proposal costs a minibatch on the parent and the child, then the selection set if it improved
    budget = len(d_val) + trials * (2 * GEPA_MINIBATCH + len(d_val))
    opt = dspy.GEPA(
        llm_metric(labelled, feedback=True), max_metric_calls=budget, reflection_lm=refl,
        reflection_minibatch_size=GEPA_MINIBATCH, num_threads=1, seed=seed, track_stats=False,
    )  # fmt: skip
    return opt.compile(start, trainset=d_train, valset=d_val)
