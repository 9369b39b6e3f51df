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


def _fake_inputs(bench, monkeypatch) -> None:
    """The program's inputs without a KB or an embedder: the compile is what is under test."""
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


def test_bootstrap_compiles_on_dev_saves_and_reloads(bench_script, tmp_path: Path, monkeypatch) -> None:
    bench = bench_script("llm_diagnosis")
    _fake_inputs(bench, monkeypatch)
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


# every output field the optimizers' LMs are asked for: the choose answer, MIPRO's proposer, GEPA's reflection
_ANY_ANSWER = {
    "causes": "sparse_reward, undertraining",
    "observations": "reports of RL failures",
    "summary": "RL failure reports",
    "program_description": "picks causes",
    "module_description": "picks causes",
    "proposed_instruction": "Pick the cause the similar cases share.",
    "new_instruction": "Pick the cause the similar cases share.",
}


@pytest.mark.parametrize("optimizer", ["mipro", "gepa"])
def test_mipro_and_gepa_compile_on_dev_are_judged_and_scored(
    bench_script, tmp_path: Path, monkeypatch, optimizer: str
) -> None:
    import dspy

    bench = bench_script("llm_diagnosis")
    _fake_inputs(bench, monkeypatch)
    dev = [_report(i, "sparse_reward" if i % 2 else "undertraining") for i in range(12)]
    args = argparse.Namespace(out=tmp_path / "rows.jsonl", demos=2, trials=1, val_size=4, optimize=optimizer)
    # the task LM sends the grammar as the bench's does; the proposer / reflection LM does not
    task = DummyLM([_ANY_ANSWER] * 500).copy(extra_body={"grammar": "root ::= ..."})
    prompt = DummyLM([_ANY_ANSWER] * 500)
    program, details = bench.compile_instructions(args, None, None, dev, task, prompt, "dummy")
    assert details["optimizer"] == {"mipro": "dspy.MIPROv2", "gepa": "dspy.GEPA"}[optimizer]
    assert (details["train"], details["val"]) == (8, 4) and details["task_calls"] > 0 and details["other_calls"] > 0
    # a constant answer scores the same whatever the instructions: a tie the margin rule refuses
    assert details["active_val"] == details["new_val"] > 0
    assert details["promoted"] is False and "the active version stays" in details["decision"]
    # the compiled program is what the bench scores on the holdout: it fits the diagnoser's description program
    assert program.signature is bench.ChooseCauseFromDescription
    with dspy.context(lm=DummyLM([{"causes": "undertraining"}] * 4), adapter=dspy.ChatAdapter()):
        gold = [dspy.Example(**_inputs(i), truth=["undertraining"]).with_inputs(*_inputs(i)) for i in range(2)]
        assert bench.val_scores(program, gold) == [1.0, 1.0]
    # a rerun with the same settings loads the saved program: no LM call
    again, saved = bench.compile_instructions(args, None, None, dev, DummyLM([]), DummyLM([]), "dummy")
    assert saved == json.loads(json.dumps(details))
    assert again.choose.signature.instructions == details["instructions"]


def _inputs(i: int) -> dict[str, str]:
    return {
        "description": f"holdout {i}",
        "environment": "-",
        "symptom_reading": "-",
        "similar_cases": "-",
        "rules": "-",
    }


def test_the_proposer_answers_under_a_field_grammar_and_the_task_lm_keeps_its_own(bench_script) -> None:
    import dspy

    bench = bench_script("llm_diagnosis")

    class Recording(DummyLM):
        def forward(self, prompt=None, messages=None, **kwargs):  # type: ignore[no-untyped-def]
            self.sent = kwargs.get("extra_body")
            return super().forward(prompt=prompt, messages=messages, **kwargs)

    prompt, task = Recording([{"proposed_instruction": "x"}]), Recording([{"causes": "sparse_reward"}])
    task.kwargs["extra_body"] = {"grammar": "the choose grammar"}
    with dspy.context(adapter=bench.field_grammar_adapter()):
        with dspy.context(lm=prompt):
            dspy.Predict("task -> proposed_instruction")(task="t")
        with dspy.context(lm=task):
            dspy.Predict("task -> causes")(task="t")
    assert prompt.sent == {"grammar": bench.field_grammar(["proposed_instruction"])}
    assert '"[[ ## proposed_instruction ## ]]\\n" text' in prompt.sent["grammar"]
    assert task.sent is None  # the request's own settings carry no grammar: the LM's (the choose grammar) applies
