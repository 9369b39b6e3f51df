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


def _loop(work, cell: str, arm: str, name: str, fixed: bool, steps: int) -> None:
    import json

    folder = work / cell / arm
    folder.mkdir(parents=True, exist_ok=True)
    row = {"scenario": name, "solvable": True, "fixed": fixed, "total_env_steps": steps}
    (folder / f"{name}.json").write_text(json.dumps(row))


def test_fix_curve_compares_the_same_patients_at_every_share(bench_script, tmp_path) -> None:
    lc = bench_script("learning_curve")
    holdout, lofo = tmp_path / "holdout", tmp_path / "lofo"
    for name, fixed in (("a", True), ("b", False)):
        _loop(holdout, "holdout-holdout-0-0", "vote", name, fixed, 100)
        _loop(holdout, "holdout-holdout-0-0", "random_search", name, False, 300)
        _loop(holdout, "holdout-holdout-100-0", "vote", name, True, 50)
    # two subsets at 50%, one fixing b: b's rate there is 0.5; c has no cold result and stays out
    _loop(holdout, "holdout-holdout-50-0", "vote", "a", True, 100)
    _loop(holdout, "holdout-holdout-50-0", "vote", "b", True, 100)
    _loop(holdout, "holdout-holdout-50-1", "vote", "a", True, 100)
    _loop(holdout, "holdout-holdout-50-1", "vote", "b", False, 100)
    _loop(holdout, "holdout-holdout-100-0", "vote", "c", True, 10)
    # leave one family out: two folds pool into one split
    _loop(lofo, "lofo-gamma-0-0", "vote", "g", False, 40)
    _loop(lofo, "lofo-gamma-100-0", "vote", "g", True, 40)
    _loop(lofo, "lofo-tau-0-0", "vote", "t", True, 40)
    _loop(lofo, "lofo-tau-100-0", "vote", "t", True, 40)

    curve = lc.fix_curve([holdout, lofo])
    by = {(p["arm"], p["share"]): p for p in curve["holdout"]}
    assert [p["share"] for p in curve["holdout"] if p["arm"] == "vote"] == [0, 50, 100]
    assert by[("vote", 0)]["rate"] == 0.5 and by[("vote", 0)]["per_fix"] == 200
    assert by[("vote", 50)]["rate"] == 0.75 and by[("vote", 50)]["subsets"] == 2
    assert by[("vote", 50)]["per_fix"] == 400 / 3  # steps of both subsets over their three fixes
    assert by[("vote", 100)]["patients"] == 2 and by[("vote", 100)]["per_fix"] == 50
    assert by[("random_search", 0)]["rate"] == 0.0 and by[("random_search", 0)]["per_fix"] == float("inf")
    lofo_points = {p["share"]: p for p in curve["lofo"]}
    assert lofo_points[0]["rate"] == 0.5 and lofo_points[100]["rate"] == 1.0 and lofo_points[100]["patients"] == 2

    text = lc.fix_curve_table(curve)
    assert "| holdout | vote | 50% | 2 | 2 | 0.75 [" in text
    assert "| holdout | random_search | none (no diagnosis) | 1 | 2 | 0.00 [0.00, 0.00] | - |" in text
    lc.fix_plot(curve, tmp_path / "fix.png")
    assert (tmp_path / "fix.png").stat().st_size > 1000


def test_knob_top1_reads_knobs_and_refuses_unknown_ones(bench_script) -> None:
    kt = bench_script("knob_top1")
    assert kt.parse_set(["budget_failure_reach=none", "k=5", "repeat_share=false"]) == {
        "budget_failure_reach": None,
        "k": 5,
        "repeat_share": False,
    }
    with pytest.raises(SystemExit, match="not an OfflineSettings knob"):
        kt.parse_set(["no_such_knob=1"])
    with pytest.raises(SystemExit, match="name=value"):
        kt.parse_set(["budget_failure_reach"])
    with pytest.raises(SystemExit, match="not JSON"):
        kt.parse_set(["k=five"])
