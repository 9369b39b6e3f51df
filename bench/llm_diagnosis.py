"""The LLM diagnoser measured on real failure reports, beside the offline diagnoser and the commonest cause.

Data: ``bench/data/describe_reports.jsonl`` (public RL failure reports with the causes and remedy
families their threads settled on; see ``bench/describe.py``). Default splits: the held-out batches
``holdout4`` and ``holdout5`` (``dev`` is for tuning only). The KB holds the bundled example cases.

Columns (each report diagnosed from its text, with the env / algorithm / action space it names):

- ``most frequent``: dev's commonest first causes, the same for every report;
- ``offline``: ``diagnose_description`` as shipped (the offline vote);
- ``lm <output> zero-shot``: the LLM backend with the similar cases and rules withheld;
- ``lm <output> grounded``: the same with the retrieved cases and matching rules/priors in the prompt;
- ``lm choose-grammar grounded+bootstrap`` (``--optimize bootstrap``): the grounded choose program after
  ``dspy.BootstrapFewShotWithRandomSearch`` on dev (the optimizer and settings of ``remedy optimize
  --backend llm --optimizer bootstrap``, applied to the choose program): demos bootstrapped from dev-train,
  candidates chosen on ``--val-size`` dev reports, the margin rule (``promotion_decision``) printed, the
  compiled program scored on the holdout whatever the rule says. Its state and compile cost are saved
  under ``llm_programs/`` next to ``--out`` and reloaded on a rerun.
- ``lm choose-grammar grounded+mipro`` / ``+gepa`` (``--optimize mipro|gepa --trials T``): the same program after
  ``dspy.MIPROv2`` / ``dspy.GEPA`` with the settings of ``remedy optimize --backend llm --optimizer mipro|gepa
  --trials T`` (:func:`compile_instructions`); the proposer / reflection LM is the served model itself,
  without the choose grammar. Same dev split, margin rule, saving and holdout scoring.

``<output>`` is the answer the program asks for (``REMEDY_LM_OUTPUT``, :data:`remedy.retrieval.llm.OUTPUTS`):
``full`` (the shipped chain of thought: ranked causes and patches as JSON), ``choose`` (up to three cause
names picked from the taxonomy) and ``choose-grammar`` (the same under a llama.cpp grammar).

Per column: top-1 / top-3 cause and family top-3 (where the column proposes families), each with a
seeded bootstrap 95% interval over reports; LM calls, tokens and wall time; and the answers that went
wrong, counted, never mapped: ``parse`` (no answer in the expected format), ``outside`` (cause names
outside the taxonomy; an answer with no listed name at all scores as a miss), ``bad patches``
(patches dropped for not fitting the patch schema) and ``lm errors``. A failed answer scores as a miss.
Paired bootstrap intervals compare grounded with zero-shot per output.

One LM call per report and column (no retries: ``--retries``), temperature 0; a choose answer may take 64
tokens (``--choose-tokens``; a listed answer needs about 40), a full one ``REMEDY_LM_MAX_TOKENS``. Rows are appended to
``--out`` as they finish and skipped when already there (same model label, column and report), so an
interrupted run resumes and a rerun costs nothing.

Usage (a local model, on 2 cores):

    remedy lm serve --model smollm2 --threads 1 &     # prints the REMEDY_LM lines below
    export REMEDY_LM=openai/smollm2 REMEDY_LM_API_BASE=http://127.0.0.1:8080/v1 REMEDY_LM_API_KEY=none \\
        REMEDY_LM_ENGINE=litellm REMEDY_LM_MAX_TOKENS=400
    .venv/bin/python bench/llm_diagnosis.py --label smollm2 [--outputs choose,choose-grammar,full]
    .venv/bin/python bench/llm_diagnosis.py --label smollm2 --outputs choose-grammar --modes grounded \
        --optimize bootstrap --candidates 0 --val-size 12 [--demo-candidate]  # serve with --ctx 8192 (demos)
    .venv/bin/python bench/llm_diagnosis.py --label smollm2 --outputs choose-grammar --modes grounded \
        --optimize mipro|gepa --trials 2 --val-size 12
    .venv/bin/python bench/llm_diagnosis.py --label smollm2 --outputs choose-grammar --patients

``--patients`` scores the built holdout fault scenarios instead (``data/llm_diagnosis_patients.jsonl``): each
patient rolled out once (``--episodes``, seed 0; subject, signature and failure episodes cached in
``llm_diagnosis_patients.signatures.jsonl``) and diagnosed from its signature as ``remedy diagnose`` does,
the KB of bundled examples minus the patient's own scenario.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

for _k, _v in (
    ("HF_HUB_OFFLINE", "1"),
    ("TRANSFORMERS_OFFLINE", "1"),
    ("TOKENIZERS_PARALLELISM", "false"),
    ("LITELLM_LOCAL_MODEL_COST_MAP", "True"),
):
    os.environ.setdefault(_k, _v)

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from describe import CachingEmbedder, load_reports  # noqa: E402
from llm_scoring import (  # noqa: E402
    lm_usage,
    load_patients,
    paired,
    patient_context,
    print_table,
    summarize,
)

from remedy.cases.errors import LMError  # noqa: E402
from remedy.kb.diagnose import diagnose_description, diagnose_signature  # noqa: E402
from remedy.kb.facade import KnowledgeBase  # noqa: E402
from remedy.optimizer.versions import DEFAULT_MARGIN, promotion_decision  # noqa: E402
from remedy.retrieval.describe import SymptomReader  # noqa: E402
from remedy.retrieval.embedder import default_embedder  # noqa: E402
from remedy.retrieval.llm import (  # noqa: E402
    OUTPUTS,
    OUTSIDE_TAXONOMY,
    ChooseCauseFromDescription,
    LLMChooseProgram,
    LLMDiagnoser,
    choose_grammar,
    lm_from_env,
    parse_choice,
)
from remedy.retrieval.offline import OfflineDiagnoser  # noqa: E402

HERE = Path(__file__).resolve().parent
OPTIMIZERS = ("bootstrap", "mipro", "gepa")
SEED = 0


def diagnose_row(kb, reader, report: dict, diagnoser) -> dict:
    """One report through one diagnoser: ranked causes and families, and what went wrong."""
    row: dict = {"causes": [], "families": None, "status": "ok", "outside": [], "bad_patches": 0, "error": ""}
    try:
        rep = (
            diagnose_signature(
                kb,
                report["ctx"]["subject"],
                report["ctx"]["signature"],
                diagnoser=diagnoser,
                exclude_scenario=report["id"],  # the patient's own bundled cases are not its neighbours
                rules=(),
                **{k: v for k, v in report["ctx"].items() if k not in ("subject", "signature")},
            )
            if "patient" in report
            else diagnose_description(
                kb,
                report["symptom"],
                env_id=report.get("env"),
                algo=report.get("algo"),
                action_space=report.get("action_space"),
                diagnoser=diagnoser,
                reader=reader,
                rules=(),  # a fresh KB of examples has no accepted rules; priors still match
            )
        )
    except LMError as ex:
        msg = str(ex)
        row["families"] = None if getattr(diagnoser, "output", "full") != "full" else []
        row["error"] = msg[:400]
        if OUTSIDE_TAXONOMY in msg or "Input should be" in msg:
            row["status"] = "outside"
        elif "malformed output" in msg:
            row["status"] = "parse"
        else:
            row["status"] = "lm_error"
        return row
    row["causes"] = [c.cause.value for c in rep.diagnosis.causes if c.cause.value != "unknown"]
    fams = [f.family.value for f in rep.families] or list(dict.fromkeys(c.family.value for c in rep.candidates))
    full = getattr(diagnoser, "output", "full") == "full"
    row["families"] = fams if (full or not isinstance(diagnoser, LLMDiagnoser)) else None
    for w in rep.warnings:
        if w.startswith(OUTSIDE_TAXONOMY):
            row["outside"] = w.split(": ", 1)[1].split(", ")
        row["bad_patches"] += w.startswith("dropped LLM patch")
    return row


# ---- the optimized column: the grounded choose program compiled on dev (DSPy bootstrap) --------------------


class _Captured(Exception):
    """Raised by :class:`_InputCapture` with the program inputs the diagnoser would have sent."""


class _InputCapture(LLMDiagnoser):
    """An LLM diagnoser that stops at the prompt: what the choose program sees for a report, no LM call."""

    def _chosen(self, ctx, inputs, described):  # type: ignore[override]
        raise _Captured(dict(inputs))


def report_inputs(kb, reader, report: dict) -> dict[str, str]:
    """The grounded choose program's inputs for one report, exactly as ``diagnose_description`` builds them."""
    try:
        diagnose_description(
            kb,
            report["symptom"],
            env_id=report.get("env"),
            algo=report.get("algo"),
            action_space=report.get("action_space"),
            diagnoser=_InputCapture(lm=object(), output="choose-grammar", grounded=True),
            reader=reader,
            rules=(),
        )
    except _Captured as got:
        return got.args[0]
    raise RuntimeError("the diagnoser was never asked")  # pragma: no cover - diagnose_description always asks


def choose_metric(gold: Any, pred: Any, trace: Any = None) -> float:
    """1 for the right first cause, 0.5 for a right cause in the top 3, else 0 (a demo needs 1)."""
    known, _ = parse_choice(getattr(pred, "causes", "") or "")
    names = [c.value for c in known]
    if names[:1] and names[0] in gold.truth:
        return 1.0
    return 0.5 if any(n in gold.truth for n in names[:3]) else 0.0


def dev_split(dev: list[dict], val_size: int, seed: int) -> tuple[list[dict], list[dict]]:
    """Dev's reports as (train, val): a seeded shuffle by id; the holdout is never touched."""
    ordered = sorted(dev, key=lambda r: r["id"])
    random.Random(seed).shuffle(ordered)
    return ordered[val_size:], ordered[:val_size]


def compile_bootstrap(
    args, kb, reader, dev: list[dict], lm, label: str, pick: str = "best"
) -> tuple[LLMChooseProgram, dict]:
    """The grounded choose program after ``dspy.BootstrapFewShotWithRandomSearch`` on dev, and how it went.

    The same optimizer and settings as ``remedy optimize --backend llm --optimizer bootstrap`` (bootstrapped
    demos only, one thread, a demo kept only from a right first cause), applied to the choose program on
    dev's reports: demos come from dev-train, candidates are chosen on dev-val, and the margin rule
    (``promotion_decision``) compares the best candidate with the demo-less program there. The state is
    saved next to ``--out`` and reloaded on a rerun with the same settings (DSPy's cache makes a recompile
    free too). ``pick``: ``best`` (the optimizer's choice) or ``demos`` (the best-scoring candidate that
    carries demos, to score on the holdout what the optimizer turned down).
    """
    import dspy

    key = f"{label}-choose-grammar-bootstrap-d{args.demos}-c{args.candidates}-v{args.val_size}-s{SEED}"
    path = args.out.parent / "llm_programs" / f"{key}.json"
    if path.exists():
        saved = json.loads(path.read_text())
        program = LLMChooseProgram(ChooseCauseFromDescription)
        program.load_state(saved["state"] if pick == "best" else saved["candidates"][saved["details"]["demo_pick"]])
        return program, saved["details"]
    train, val = dev_split(dev, args.val_size, SEED)

    def examples(reports: list[dict]) -> list:
        out = []
        for r in reports:
            inputs = report_inputs(kb, reader, r)
            out.append(dspy.Example(**inputs, truth=r["causes"]).with_inputs(*inputs))
        return out

    d_train, d_val = examples(train), examples(val)
    opt = dspy.BootstrapFewShotWithRandomSearch(
        choose_metric, max_bootstrapped_demos=args.demos, max_labeled_demos=0,
        num_candidate_programs=args.candidates, num_threads=1, metric_threshold=1.0, max_errors=10**6,
    )  # fmt: skip
    start, t0 = len(lm.history), time.perf_counter()
    adapter = dspy.ChatAdapter(use_json_adapter_fallback=False)
    # DSPy prints its progress: to stderr, stdout carries the table
    with dspy.context(lm=lm, adapter=adapter), contextlib.redirect_stdout(sys.stderr):
        best = opt.compile(LLMChooseProgram(ChooseCauseFromDescription), trainset=d_train, valset=d_val)
    calls, ptok, ctok = lm_usage(lm, start)
    # per-candidate mean metric on dev-val; seed -3 is the program without demos (the active one)
    cands = {c["seed"]: float(np.mean(c["subscores"])) for c in best.candidate_programs}
    active_val, new_val = cands[-3], float(np.mean(best.candidate_programs[0]["subscores"]))
    promote, why = promotion_decision(active_val, new_val, DEFAULT_MARGIN)
    with_demos = [c for c in best.candidate_programs if c["program"].choose.demos]  # sorted best first
    details = {
        "optimizer": "dspy.BootstrapFewShotWithRandomSearch",
        "train": len(train),
        "val": len(val),
        "demos": len(best.choose.demos),
        "candidate_val": {str(k): round(v, 4) for k, v in sorted(cands.items())},
        "candidate_demos": {str(c["seed"]): len(c["program"].choose.demos) for c in best.candidate_programs},
        "active_val": round(active_val, 4),
        "new_val": round(new_val, 4),
        "promoted": promote,
        "demo_pick": str(with_demos[0]["seed"]) if with_demos else None,
        "decision": why,
        "calls": calls,
        "tokens": ptok + ctok,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    states = {str(c["seed"]): c["program"].dump_state() for c in best.candidate_programs}
    saved = {"details": details, "state": best.dump_state(), "candidates": states}
    path.write_text(json.dumps(saved, indent=1, default=str) + "\n")
    if pick == "demos" and with_demos:
        return with_demos[0]["program"], details
    return best, details


def choose_feedback(gold: Any, pred: Any, trace: Any = None, pred_name: Any = None, pred_trace: Any = None) -> Any:
    """:func:`choose_metric` with the feedback text GEPA reflects on: what was answered, what the thread settled on."""
    import dspy

    score = choose_metric(gold, pred)
    known, outside = parse_choice(getattr(pred, "causes", "") or "")
    said = ", ".join(c.value for c in known) or "no cause from the list"
    extra = f" (not in the list: {', '.join(outside)})" if outside else ""
    feedback = (
        f"Answered {said}{extra}; the report's thread settled on {', '.join(gold.truth)}. Score {score:.2f} "
        "(1 for the right cause first, 0.5 for it in the top 3)."
    )
    return dspy.Prediction(score=score, feedback=feedback)


def val_scores(program: Any, d_val: list) -> list[float]:
    """Each dev-val report's :func:`choose_metric` under the current DSPy context (an unparseable answer: 0)."""
    from dspy.utils.exceptions import AdapterParseError

    out = []
    for ex in d_val:
        try:
            out.append(choose_metric(ex, program(**ex.inputs())))
        except AdapterParseError:
            out.append(0.0)
    return out


def history_usage(start: int, task_lm: Any, task_start: int) -> dict[str, int]:
    """LM calls and tokens in DSPy's global history since ``start``: the task LM's calls and the rest (MIPRO's
    proposer, GEPA's reflection). Cache hits count as calls; tokens count only fresh calls (``fresh_calls``)."""
    from dspy.clients.base_lm import GLOBAL_HISTORY

    out = {"task_calls": len(task_lm.history) - task_start, "other_calls": 0, "fresh_calls": 0, "tokens": 0}
    for h in GLOBAL_HISTORY[start:]:
        u = h.get("usage") or {}
        tokens = int(u.get("prompt_tokens") or 0) + int(u.get("completion_tokens") or 0)
        out["fresh_calls"] += tokens > 0
        out["tokens"] += tokens
    out["other_calls"] = len(GLOBAL_HISTORY) - start - out["task_calls"]
    return out


def field_grammar(fields: list[str]) -> str:
    """A GBNF grammar for the ChatAdapter's answer with ``fields``: each header, then free text without ``[``."""
    parts = " ".join(f'"[[ ## {f} ## ]]\\n" text "\\n\\n"' for f in fields)
    return f'root ::= {parts} "[[ ## completed ## ]]"\ntext ::= [^\\[]+\n'


def field_grammar_adapter() -> Any:
    """DSPy's ChatAdapter that holds an LM without its own grammar (MIPRO's proposer) to the answer's headers.

    The task LM carries the choose grammar and is left alone; any other LM's request gets
    :func:`field_grammar` of the signature's output fields, so its text is free but always parses.
    """
    import dspy

    class FieldGrammarAdapter(dspy.ChatAdapter):
        def __call__(self, lm, lm_kwargs, signature, demos, inputs):  # type: ignore[no-untyped-def]
            if "extra_body" not in (getattr(lm, "kwargs", None) or {}) and "extra_body" not in lm_kwargs:
                lm_kwargs = {**lm_kwargs, "extra_body": {"grammar": field_grammar(list(signature.output_fields))}}
            return super().__call__(lm, lm_kwargs, signature, demos, inputs)

    return FieldGrammarAdapter(use_json_adapter_fallback=False)


def compile_instructions(args, kb, reader, dev: list[dict], lm, prompt_lm, label: str) -> tuple[LLMChooseProgram, dict]:
    """The grounded choose program after ``dspy.MIPROv2`` or ``dspy.GEPA`` on dev, and how it went.

    The settings of ``remedy optimize --backend llm --optimizer mipro|gepa --trials T``
    (:mod:`remedy.optimizer.llm`): MIPROv2 with ``auto=None``, ``max(2, min(T, 6))`` instruction and demo
    candidates, ``T`` trials, bootstrapped demos only (``--demos`` at most, kept from a right first cause),
    full evaluations (dev-val is under MIPRO's minibatch size); GEPA with the feedback metric, a reflection
    minibatch of 3 and ``len(val) + T * (2 * 3 + len(val))`` metric calls. ``lm`` (the task LM) sends the
    grammar; ``prompt_lm`` (MIPRO's proposer, GEPA's reflection) is the same served model without it, since
    its answer is an instruction, not a cause name; MIPRO's proposer answers are held to the ChatAdapter's
    field headers by :func:`field_grammar_adapter` (the wording stays free); GEPA's reflection goes through
    its default proposer's own JSONAdapter, unconstrained. Both select on dev-val; the margin rule then compares the
    compiled program with the uncompiled one there (both scores re-read from DSPy's cache). Saved and reloaded
    like :func:`compile_bootstrap`.
    """
    import dspy
    from dspy.clients.base_lm import GLOBAL_HISTORY

    opt_name, trials = args.optimize, args.trials
    key = f"{label}-choose-grammar-{opt_name}-d{args.demos}-t{trials}-v{args.val_size}-s{SEED}"
    path = args.out.parent / "llm_programs" / f"{key}.json"
    if path.exists():
        saved = json.loads(path.read_text())
        program = LLMChooseProgram(ChooseCauseFromDescription)
        program.load_state(saved["state"])
        return program, saved["details"]
    train, val = dev_split(dev, args.val_size, SEED)
    d_train = [
        dspy.Example(**i, truth=r["causes"]).with_inputs(*i) for r in train for i in [report_inputs(kb, reader, r)]
    ]
    d_val = [dspy.Example(**i, truth=r["causes"]).with_inputs(*i) for r in val for i in [report_inputs(kb, reader, r)]]
    start_prog = LLMChooseProgram(ChooseCauseFromDescription)
    if opt_name == "mipro":
        opt = dspy.MIPROv2(
            choose_metric, prompt_model=prompt_lm, task_model=lm, auto=None, num_candidates=max(2, min(trials, 6)),
            max_bootstrapped_demos=args.demos, max_labeled_demos=0, num_threads=1, seed=SEED, verbose=False,
            track_stats=False, metric_threshold=1.0,
        )  # fmt: skip
        compile_kw = {"num_trials": trials, "seed": SEED, "minibatch": False}
    else:
        budget = len(d_val) + trials * (2 * 3 + len(d_val))
        opt = dspy.GEPA(
            choose_feedback, max_metric_calls=budget, reflection_lm=prompt_lm, reflection_minibatch_size=3,
            num_threads=1, seed=SEED, track_stats=False,
        )  # fmt: skip
        compile_kw = {}
    start, task_start, t0 = len(GLOBAL_HISTORY), len(lm.history), time.perf_counter()
    # MIPRO's proposer answers under field_grammar (without it the 135M model's first proposal did not parse and
    # MIPROv2 stopped); GEPA's default proposer sets its own JSONAdapter (unconstrained: an unparseable reflection
    # is a proposal lost, as in remedy optimize); the task LM keeps its own grammar
    adapter = field_grammar_adapter()
    with dspy.context(lm=lm, adapter=adapter), contextlib.redirect_stdout(sys.stderr):
        compiled = opt.compile(start_prog, trainset=d_train, valset=d_val, **compile_kw)
        active = val_scores(start_prog, d_val)  # cache hits: the optimizers scored both already
        new = val_scores(compiled, d_val)
    active_val, new_val = float(np.mean(active)), float(np.mean(new))
    promote, why = promotion_decision(active_val, new_val, DEFAULT_MARGIN)
    instructions = compiled.choose.signature.instructions
    details = {
        "optimizer": "dspy.MIPROv2" if opt_name == "mipro" else "dspy.GEPA",
        "trials": trials,
        "budget": compile_kw.get("num_trials") if opt_name == "mipro" else budget,
        "train": len(train),
        "val": len(val),
        "demos": len(compiled.choose.demos),
        "instructions_changed": instructions != start_prog.choose.signature.instructions,
        "instructions": instructions,
        "active_val": round(active_val, 4),
        "new_val": round(new_val, 4),
        "promoted": promote,
        "decision": why,
        **history_usage(start, lm, task_start),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    details["calls"] = details["task_calls"] + details["other_calls"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"details": details, "state": compiled.dump_state()}, indent=1, default=str) + "\n")
    return compiled, details


# ---- holdout patients: the bench's fault scenarios, diagnosed from their measured signatures ---------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=HERE / "data" / "describe_reports.jsonl")
    ap.add_argument("--out", type=Path, help="rows file (default data/llm_diagnosis.jsonl, or _patients.jsonl)")
    ap.add_argument("--splits", default="", help="comma-separated splits (default holdout4,holdout5; patients holdout)")
    ap.add_argument(
        "--patients", action="store_true", help="score the built holdout patients (signatures), not reports"
    )
    ap.add_argument("--episodes", type=int, default=10, help="rollout episodes per patient signature (default 10)")
    ap.add_argument("--label", default="", help="the model's name in the rows (required for LM columns)")
    ap.add_argument("--outputs", default="choose,choose-grammar", help=f"LM outputs to score, of {', '.join(OUTPUTS)}")
    ap.add_argument("--modes", default="zero-shot,grounded", help="zero-shot, grounded or both")
    ap.add_argument("--retries", type=int, default=0, help="retries after a malformed answer (default 0)")
    ap.add_argument("--choose-tokens", type=int, default=64, help="max tokens of a choose answer (default 64)")
    ap.add_argument("--limit", type=int, default=0, help="score only the first N reports of the splits")
    ap.add_argument("--table-only", action="store_true", help="print the table from --out; call no LM")
    ap.add_argument(
        "--optimize",
        default="",
        choices=("", *OPTIMIZERS),
        help="add the grounded choose-grammar program compiled on dev by bootstrap, mipro or gepa",
    )
    ap.add_argument(
        "--trials", type=int, default=2, help="mipro / gepa: remedy optimize's --trials (search trials; default 2)"
    )
    ap.add_argument("--demos", type=int, default=2, help="bootstrapped demos at most (default 2)")
    ap.add_argument("--candidates", type=int, default=1, help="random-search demo sets beyond the first (default 1)")
    ap.add_argument(
        "--demo-candidate", action="store_true", help="also score the best compiled candidate carrying demos"
    )
    ap.add_argument("--val-size", type=int, default=20, help="dev reports held out to choose and promote (default 20)")
    args = ap.parse_args()

    name = "llm_diagnosis_patients.jsonl" if args.patients else "llm_diagnosis.jsonl"
    args.out = args.out or HERE / "data" / name
    if args.patients and args.optimize:
        raise SystemExit("error: --optimize compiles the description program; run it without --patients")
    all_reports = load_patients() if args.patients else load_reports(args.data)
    splits = (args.splits or ("holdout" if args.patients else "holdout4,holdout5")).split(",")
    reports = [r for r in all_reports if r["split"] in splits]
    reports = reports[: args.limit] if args.limit else reports
    by_id = {r["id"]: r for r in all_reports}
    dev = [r for r in all_reports if r["split"] == "dev"]
    lm_columns = [f"lm {o} {m}" for o in args.outputs.split(",") if o for m in args.modes.split(",") if m]
    if args.optimize:
        lm_columns.append(f"lm choose-grammar grounded+{args.optimize}")
    if args.optimize == "bootstrap" and args.demo_candidate:
        lm_columns.append(f"lm choose-grammar grounded+{args.optimize}-demos")
    columns = ["most frequent on dev", "offline (shipped)", *lm_columns]
    label = args.label or ("-" if args.table_only else "")
    if lm_columns and not label:
        raise SystemExit("error: give --label NAME (the served model, e.g. smollm2) so rows of models stay apart")

    done = [json.loads(x) for x in args.out.read_text().splitlines() if x.strip()] if args.out.exists() else []
    mine = [r for r in done if r["label"] in (label, "*") and r["id"] in {x["id"] for x in reports}]
    if not args.table_only:
        mine = run(args, reports, dev, lm_columns, label, mine)
    data = f"built patients, {args.episodes} episodes each" if args.patients else f"data {args.data.name}"
    print(f"splits: {', '.join(splits)}; {data}; one call per item, {args.retries} retries")
    lines = summarize(mine, by_id, columns)
    print_table(label, lines)
    pairs = [(f"lm {o} zero-shot", f"lm {o} grounded", f"grounded - zero-shot ({o})") for o in args.outputs.split(",")]
    if args.optimize:
        g = "lm choose-grammar grounded"
        pairs.append((g, f"{g}+{args.optimize}", f"{args.optimize} - grounded (choose-grammar)"))
        pairs.append((g, f"{g}+{args.optimize}-demos", f"{args.optimize} demo candidate - grounded (choose-grammar)"))
    for a, b, name in pairs:
        for m in ("top1", "top3"):
            d, lo, hi, n = paired(mine, by_id, a, b, m)
            if n:
                print(f"{name}, {m}: {d:+.0%} [{lo:+.0%}, {hi:+.0%}] over {n} reports")
    for path in sorted((args.out.parent / "llm_programs").glob(f"{label}-*.json")) if args.optimize else ():
        x = json.loads(path.read_text())["details"]
        found = (
            f"dev-val candidates {x['candidate_val']}"
            if "candidate_val" in x
            else f"instructions changed: {x['instructions_changed']}; dev-val {x['active_val']} -> {x['new_val']}"
        )
        print(
            f"compiled {path.stem}: train {x['train']} / val {x['val']} dev reports, {x['demos']} demos; "
            f"{x['calls']} LM calls, {x['tokens']} tokens, {x['seconds']:.0f} s; {found}; margin rule: {x['decision']}"
        )


def run(args, reports: list[dict], dev: list[dict], lm_columns: list[str], label: str, mine: list[dict]) -> list[dict]:
    """Diagnose every (column, report) not in ``mine`` yet, appending each row to ``--out`` as it finishes."""
    have = {(r["column"], r["id"]) for r in mine}
    # DSPy's response cache on (the diagnoser's default is off): a rerun costs no LM call; the cache key holds
    # the model string, which `remedy lm serve` sets to the model's own name
    lm = lm_from_env().copy(cache=True) if lm_columns else None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    commonest = [c for c, _ in Counter(r["causes"][0] for r in dev).most_common(3)]
    families = [f for f, _ in Counter(f for r in dev for f in r["families"]).most_common(3)]
    embedder = CachingEmbedder(default_embedder())
    reader = SymptomReader(embedder)
    with tempfile.TemporaryDirectory(prefix="remedy-llm-bench-") as tmp, args.out.open("a") as out:
        base = KnowledgeBase.open(Path(tmp) / "kb", create=True, embedder=embedder)
        base.load_examples()
        if args.patients:
            from remedy.kb.fixloop import one_torch_thread

            one_torch_thread()
            cache = args.out.with_suffix(".signatures.jsonl")
            for r in reports:
                r["ctx"] = patient_context(r["patient"], cache, args.episodes)

        def put(row: dict) -> None:
            mine.append(row)
            out.write(json.dumps(row) + "\n")
            out.flush()

        for r in reports:  # the baselines take no LM: the same row serves every model ("*")
            if ("most frequent on dev", r["id"]) not in have:
                put(
                    {"label": "*", "column": "most frequent on dev", "id": r["id"], "split": r["split"]}
                    | {"causes": commonest, "families": families, "status": "ok", "outside": [], "bad_patches": 0}
                )
            if ("offline (shipped)", r["id"]) not in have:
                t0 = time.perf_counter()
                row = diagnose_row(base, reader, r, OfflineDiagnoser())
                put(
                    {"label": "*", "column": "offline (shipped)", "id": r["id"], "split": r["split"], **row}
                    | {"seconds": round(time.perf_counter() - t0, 3)}
                )
        for col in lm_columns:
            _, output, mode = col.split(" ")
            # a choose answer is at most ~40 tokens: a cap spares the minutes a small model spends rambling
            col_lm = lm if output == "full" else lm.copy(max_tokens=args.choose_tokens)
            program = None
            if "+" in mode and any((col, r["id"]) not in have for r in reports):
                # the compile's LM sends the grammar in every request, as the diagnoser's config does
                compile_lm = col_lm.copy(extra_body={"grammar": choose_grammar()})
                if args.optimize == "bootstrap":
                    pick = "demos" if mode.endswith("-demos") else "best"
                    program, _ = compile_bootstrap(args, base, reader, dev, compile_lm, label, pick)
                else:  # the proposer / reflection LM: the served model without the grammar
                    program, _ = compile_instructions(args, base, reader, dev, compile_lm, lm, label)
            diag = LLMDiagnoser(
                lm=col_lm,
                output=output,
                grounded=mode.startswith("grounded"),
                max_retries=args.retries,
                choose_program=program,
            )
            for i, r in enumerate(reports):
                if (col, r["id"]) in have:
                    continue
                start, t0 = len(col_lm.history), time.perf_counter()
                row = diagnose_row(base, reader, r, diag)
                calls, ptok, ctok = lm_usage(col_lm, start)
                row |= {"calls": calls, "prompt_tokens": ptok, "completion_tokens": ctok}
                put(
                    {"label": label, "column": col, "id": r["id"], "split": r["split"], **row}
                    | {"seconds": round(time.perf_counter() - t0, 3)}
                )
                print(
                    f"{col} {i + 1}/{len(reports)} {r['id']}: {row['status']} {row['causes'][:3]} "
                    f"truth {r['causes']} ({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
        base.close()
    return mine


if __name__ == "__main__":
    main()
