"""bench/llm_diagnosis.py's optimized column: the grounded choose program bootstrapped on dev reports with
DSPy's DummyLM (no server), saved, reloaded, and judged by the margin rule."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from dspy.utils.dummies import DummyLM


def _report(i: int, cause: str) -> dict:
    return {"id": f"r{i:02d}", "split": "dev", "causes": [cause], "families": ["reward_shaping"], "symptom": "x"}


def test_bootstrap_compiles_on_dev_saves_and_reloads(bench_script, tmp_path: Path, monkeypatch) -> None:
    bench = bench_script("llm_diagnosis")
    # the program's inputs without a KB or an embedder: the compile is what is under test
    monkeypatch.setattr(
        bench,
        "report_inputs",
        lambda kb, reader, r: {
            "description": f"report {r['id']}",
            "environment": "CartPole-v1",
            "symptom_reading": "never_succeeds",
            "similar_cases": "-",
            "rules": "-",
        },
    )
    dev = [_report(i, "sparse_reward" if i % 2 else "undertraining") for i in range(12)]
    args = argparse.Namespace(out=tmp_path / "rows.jsonl", demos=2, candidates=1, val_size=4)
    lm = DummyLM([{"causes": "sparse_reward, undertraining"}] * 200)
    program, details = bench.compile_bootstrap(args, None, None, dev, lm, "dummy")
    assert (details["train"], details["val"]) == (8, 4)
    assert details["candidate_demos"]["-3"] == 0 and 1 <= details["candidate_demos"]["-1"] <= 2
    # a constant answer scores the same with or without demos: a tie, so the margin rule keeps the active program
    assert details["new_val"] == details["active_val"] == details["candidate_val"]["-3"]
    assert details["promoted"] is False and "the active version stays" in details["decision"]
    assert program.choose.demos == [] and details["demos"] == 0  # the best of a tie is the first: no demos
    assert details["calls"] > 0
    # a rerun with the same settings loads the saved program: no LM call
    again, saved = bench.compile_bootstrap(args, None, None, dev, DummyLM([]), "dummy")
    assert saved == json.loads(json.dumps(details)) and len(again.choose.demos) == details["demos"]


@pytest.mark.parametrize(
    ("answer", "score"),
    [("sparse_reward, undertraining", 1.0), ("undertraining, sparse_reward", 0.5), ("undertraining", 0.0), ("", 0.0)],
)
def test_choose_metric_credits_the_first_cause_fully(bench_script, answer: str, score: float) -> None:
    import dspy

    bench = bench_script("llm_diagnosis")
    gold = dspy.Example(truth=["sparse_reward"])
    assert bench.choose_metric(gold, dspy.Prediction(causes=answer)) == score
