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


def _loop(
    work, cell: str, arm: str, name: str, fixed: bool, steps: int, to_fix: int | None = None, **more: object
) -> None:
    import json

    folder = work / cell / arm
    folder.mkdir(parents=True, exist_ok=True)
    row = {"scenario": name, "solvable": True, "fixed": fixed, "total_env_steps": steps, "env_steps_to_fix": to_fix}
    row.update(more)
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
    # and each subset on its own: subset 0 fixes both (200 steps / 2), subset 1 fixes a only (200 / 1)
    assert by[("vote", 50)]["by_subset"] == [{"rate": 1.0, "per_fix": 100.0}, {"rate": 0.5, "per_fix": 200.0}]
    assert by[("vote", 100)]["by_subset"] == []  # one subset: its point is the curve's
    assert by[("vote", 100)]["patients"] == 2 and by[("vote", 100)]["per_fix"] == 50
    assert by[("random_search", 0)]["rate"] == 0.0 and by[("random_search", 0)]["per_fix"] == float("inf")
    lofo_points = {p["share"]: p for p in curve["lofo"]}
    assert lofo_points[0]["rate"] == 0.5 and lofo_points[100]["rate"] == 1.0 and lofo_points[100]["patients"] == 2

    text = lc.fix_curve_table(curve)
    assert "| holdout | vote | 50% | 2 | 2 | 0.75 [" in text
    assert "| holdout | random_search | none (no diagnosis) | 1 | 2 | 0.00 [0.00, 0.00] | - | - |" in text
    assert "| 1.00 (100), 0.50 (200) |" in text
    lc.fix_plot(curve, tmp_path / "fix.png")
    assert (tmp_path / "fix.png").stat().st_size > 1000


def test_an_unfinished_subset_stays_out_of_the_curve_and_is_shown_apart(bench_script, tmp_path) -> None:
    lc = bench_script("learning_curve")
    holdout, lofo = tmp_path / "holdout", tmp_path / "lofo"
    for name in ("a", "b"):
        _loop(holdout, "holdout-holdout-0-0", "vote", name, name == "a", 100)
        _loop(holdout, "holdout-holdout-50-0", "vote", name, True, 100)
    _loop(holdout, "holdout-holdout-50-1", "vote", "a", False, 300)  # a chunk: b not written yet
    # leave one family out at 50%: fold gamma finished, fold tau not started
    _loop(lofo, "lofo-gamma-0-0", "vote", "g", False, 40)
    _loop(lofo, "lofo-tau-0-0", "vote", "t", True, 40)
    _loop(lofo, "lofo-gamma-50-0", "vote", "g", True, 20)

    curve = lc.fix_curve([holdout, lofo])
    by = {(p["arm"], p["share"]): p for p in curve["holdout"]}
    # the chunk would have made a's rate 0.5 and dropped b from every share; it does neither
    assert by[("vote", 50)]["subsets"] == 1 and by[("vote", 50)]["rate"] == 1.0 and by[("vote", 50)]["patients"] == 2
    assert [p["share"] for p in curve["lofo"]] == [0]  # one fold of two is not a point of the curve

    partial = lc.partial_subsets([holdout, lofo])
    assert set(partial) == {("holdout", 50, 1), ("lofo", 50, 0)}
    assert partial[("lofo", 50, 0)]["folds_done"] == 1 and partial[("lofo", 50, 0)]["patients"] == 2
    text = lc.partial_table(partial)
    assert "| holdout | 50% | 1 | 0 of 1 | 1 of 2 | 0 / 1 | - |" in text  # no fix: no steps per fix
    assert "| lofo | 50% | 0 | 1 of 2 | 1 of 2 | 1 / 0 | - |" in text  # cold has no fix on g
    _loop(holdout, "holdout-holdout-50-1", "vote", "b", True, 100)
    assert ("holdout", 50, 1) not in lc.partial_subsets([holdout]) and lc.partial_table({}) == ""
    assert lc.fix_curve([holdout])["holdout"][1]["subsets"] == 2


def test_fix_slopes_read_the_fix_rate_and_the_steps_ratio_against_attempts(bench_script, tmp_path) -> None:
    lc = bench_script("learning_curve")
    work = tmp_path / "holdout"
    # a and b: cold fixes a; at 100 attempts both; at 200 both, with half the steps per fix of 100 attempts
    for name, cold, half, full in (("a", 400, 400, 100), ("b", 400, 400, 100)):
        _loop(work, "holdout-holdout-0-0", "vote", name, name == "a", cold)
        _loop(work, "holdout-holdout-50-0", "vote", name, True, half)
        _loop(work, "holdout-holdout-100-0", "vote", name, True, full)
    sizes = {"holdout-holdout-0-0": 0, "holdout-holdout-50-0": 100, "holdout-holdout-100-0": 200}
    out = lc.fix_slopes([work], sizes)["holdout"]
    assert out["attempts"] == [0, 100, 200] and out["patients"] == 2
    assert out["rate_at_full"] == pytest.approx(0.5)  # b fixed, a was already
    # least squares per patient: a 0, 0, 0 -> 0; b 0, 1, 1 at 0, 100, 200 -> 0.5 per 100 attempts; mean 0.25
    assert out["rate_per_100"] == pytest.approx(0.25)
    assert out["attempts_to_aim"] == 0.0  # +50 points: the aim is there
    # per fix / cold: cold 800 steps for 1 fix; 800 for 2 (0.5); 200 for 2 (0.125)
    assert out["ratio"] == pytest.approx([1.0, 0.5, 0.125])
    assert out["ratio_per_100"] < 0 and out["attempts_to_half"] is not None
    text = lc.fix_slope_table({"holdout": out})
    assert (
        "| holdout | 2 | 0 / 100 / 200 | +50 | +25.0 [" in text and "| reached; reached | 1.00 / 0.50 / 0.12 |" in text
    )


def test_fix_report_counts_steps_to_the_first_confirmed_fix_beside_all_steps(bench_script, tmp_path) -> None:
    lc = bench_script("learning_curve")
    # both fixed; cold at 100 of 100 steps, warm at 50 of 300 (it went on looking for a working agent)
    _loop(tmp_path, "holdout-holdout-0-0", "vote", "a", True, 100, to_fix=100)
    _loop(tmp_path, "holdout-holdout-100-0", "vote", "a", True, 300, to_fix=50)
    row = next(
        line
        for line in lc.fix_report(tmp_path).splitlines()
        if line.startswith("| holdout-holdout-100-0 | vote | 1 | +")
    )
    assert row.endswith("| 3.00 [3.00, 3.00] | 0.50 [0.50, 0.50] | 0.50 [0.50, 0.50] (1) |")


def test_floor_table_says_how_cheap_the_rest_must_be_where_cold_fixed_with_its_first_candidate(
    bench_script, tmp_path
) -> None:
    lc = bench_script("learning_curve")
    first = {"attempts_to_fix": 2, "statuses": ["inconclusive", "improved"]}
    later = {"attempts_to_fix": 4, "statuses": ["no_effect", "no_effect", "inconclusive", "improved"]}
    # cold: a at its first candidate (100 steps), b at its fourth (300); warm: both at the first
    _loop(tmp_path, "holdout-holdout-0-0", "vote", "a", True, 100, to_fix=100, **first)
    _loop(tmp_path, "holdout-holdout-0-0", "vote", "b", True, 300, to_fix=300, **later)
    _loop(tmp_path, "holdout-holdout-100-0", "vote", "a", True, 100, to_fix=100, **first)
    _loop(tmp_path, "holdout-holdout-100-0", "vote", "b", True, 50, to_fix=50, **first)
    # a screen that failed first, then a fix: not a first-candidate fix
    assert not lc.first_candidate_fix({"fixed": True, "attempts_to_fix": 2, "statuses": ["no_effect", "improved"]})
    assert lc.first_candidate_fix({"fixed": True, "attempts_to_fix": 1, "statuses": ["improved"]})
    # 0.5x of 400 is 200; a costs 100 at cold's first candidate, so b may cost at most 100 of cold's 300
    assert "| holdout-holdout-100-0 | vote | 2 | 2 / 1 | 100 / 300 | 100 (0.33) |" in lc.fix_report(tmp_path)
    _loop(tmp_path, "holdout-holdout-0-0", "vote", "b", True, 50, to_fix=50, **first)
    assert "| 2 / 2 | 150 / 0 | none: 150 alone is over half |" in lc.fix_report(tmp_path)


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
