"""What an llm `remedy optimize` run costs in LM calls, per optimizer and --trials, on the dev export.

    .venv/bin/python bench/optimize_llm_calls.py [--cases reports/kb/dev-cases.jsonl] [--trials 1 4 16] [--seed 0]

The examples and the split are the job's (grouped by scenario, seeded); contexts are cold (no KB
retrieval, so nothing is embedded). The LM is DSPy's DummyLM answering one fixed, well-formed
diagnosis (and, for GEPA, a reflection DummyLM proposing one instruction), so the scores printed
mean nothing: the figures are the number of calls a real model would be sent (task LM and
reflection LM) and the time DSPy itself spends around them. Multiply the calls by your model's
latency and price to size a run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import dspy
from dspy.utils.dummies import DummyLM

from remedy.cases.io import read_cases
from remedy.optimizer.dataset import build_examples, dev_answer_keys, split_examples
from remedy.optimizer.llm import compile_llm

ANSWER = {
    "reasoning": "r", "observations": "o", "candidate_causes": "undertraining", "evidence": "e",
    "root_causes": json.dumps([{"cause": "undertraining", "confidence": 0.6, "rationale": "curve still rising"}]),
    "patches": json.dumps([{"patch": {"kind": "training_budget", "extra_steps": 50000}, "compute_cost": "medium"}]),
    "program_description": "d", "module_description": "d", "proposed_instruction": "Diagnose the agent.", "summary": "s",
}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=Path, default=Path("reports/kb/dev-cases.jsonl"))
    ap.add_argument("--trials", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cases, _ = read_cases(args.cases)
    examples = build_examples(cases, answer_keys=dev_answer_keys({c.scenario for c in cases if c.scenario}))
    train, val = split_examples(examples, seed=args.seed)
    print(f"{len(examples)} examples: {len(train)} train, {len(val)} validation\n")
    print("| optimizer | --trials | task LM calls | reflection LM calls | seconds (DSPy overhead) |")
    print("| --- | --- | --- | --- | --- |")
    for optimizer in ("bootstrap", "mipro", "gepa"):
        for trials in args.trials:
            lm = DummyLM(itertools.cycle([ANSWER]))
            refl = DummyLM(itertools.cycle([{"new_instruction": "Diagnose the agent."}]), adapter=dspy.JSONAdapter())
            t0 = time.perf_counter()
            compile_llm(train, val, optimizer=optimizer, seed=args.seed, trials=trials, lm=lm,
                        reflection_lm=refl if optimizer == "gepa" else None)  # fmt: skip
            secs = time.perf_counter() - t0
            n_refl = len(refl.history) if optimizer == "gepa" else "-"
            print(f"| {optimizer} | {trials} | {len(lm.history)} | {n_refl} | {secs:.1f} |", flush=True)


if __name__ == "__main__":
    main()
