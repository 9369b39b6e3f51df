"""The learning curve's slope reading: points per 100 attempts and the KB size a line needs for the aim."""

from __future__ import annotations

import pytest


def _per(rise: list[float], fall: list[float]) -> dict:
    fr = ("0.0", "0.25", "0.5", "1.0")
    return {
        "empty_kb": {"0.0": {"a": 0.5, "b": 0.5}},
        "vote": {f: {"a": 0.5 + r, "b": 0.5 + r} for f, r in zip(fr, rise, strict=True)},
        "ranker": {f: {"a": 0.5 + r, "b": 0.5 + r} for f, r in zip(fr, fall, strict=True)},
    }


def test_rising_line_reaches_the_aim_and_falling_never(bench_script) -> None:
    lc = bench_script("learning_curve")
    out = lc.slopes(_per([0.0, 0.025, 0.05, 0.1], [0.0, -0.05, -0.1, -0.2]), {"a": 200, "b": 200})
    vote, ranker = out["vote"], out["ranker"]
    assert vote["per_100"] == pytest.approx(0.05)  # +0.1 over 200 attempts
    assert vote["at_full"] == pytest.approx(0.1)
    # from 0.10 at 200 attempts, 0.05 more at 0.05 per 100 attempts: 100 attempts more
    assert vote["attempts_to_aim"] == pytest.approx(300)
    assert ranker["per_100"] == pytest.approx(-0.1)
    assert ranker["attempts_to_aim"] is None and ranker["attempts_to_aim_hopeful"] is None
    text = lc.slope_table({"holdout": out})
    assert "| holdout | vote | 2 | 200 | +10 | +5.0 [+5.0, +5.0] | 300 | 300 |" in text
    assert "| holdout | ranker |" in text and "never" in text


def test_the_vote_is_paired_with_the_vote_by_case_on_the_same_patients(bench_script) -> None:
    lc = bench_script("learning_curve")
    fr = ("0.0", "0.25", "0.5", "1.0")
    per = {
        "empty_kb": {"0.0": {"a": 0.0, "b": 1.0}},
        "vote": {f: {"a": 1.0, "b": 1.0} for f in fr},
        "vote_by_case": {f: {"a": 0.0, "b": 1.0} for f in fr},
        "ranker": {f: {"a": 0.0, "b": 1.0} for f in fr},
    }
    s = lc.summarize(per)
    assert s["vote"]["1.0"]["minus_by_case"] == pytest.approx(0.5)
    assert "minus_by_case" not in s["ranker"]["1.0"] and "minus_by_case" not in s["vote_by_case"]["1.0"]
    text = lc.table(s, "holdout")
    assert "vote − vote by case" in text.splitlines()[2]
    full = next(line for line in text.splitlines() if line.startswith("| 100% |"))
    assert full.endswith("| +0.50 [+0.00, +1.00] |")
