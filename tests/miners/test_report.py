"""The heuristics report's Markdown and HTML: sections, evidence, anchors, determinism, bad directories."""

from __future__ import annotations

import datetime as dt
import os
import re
from pathlib import Path

import pytest

from remedy.cases.errors import ReportPathError
from remedy.cases.model import Case
from remedy.miners.model import Rule
from remedy.miners.plots import arm_values, before_after_plot
from remedy.miners.report import HOW_TO_MINE, plot_dir_name, render_report, write_report

from .report_cases import sample_cases, sample_rules


@pytest.fixture
def built_cases() -> list[Case]:
    """Six verified Pendulum cases (see :func:`sample_cases`)."""
    return sample_cases()


@pytest.fixture
def built_rules(built_cases: list[Case]) -> list[Rule]:
    """An accepted, a proposed, a flagged and a rejected rule over ``built_cases``."""
    return sample_rules(built_cases)


DATE = dt.date(2026, 12, 3)
SECTIONS = [
    "Summary",
    "Accepted rules",
    "Rules awaiting review",
    "Flagged rules",
    "Rejected rules",
    "Example cases",
    "Cases",
]


def _sections(markdown: str) -> dict[str, str]:
    """Level-2 section title → its text."""
    parts = re.split(r"^## (.+)$", markdown, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def _rule_ids(section: str) -> set[str]:
    return set(re.findall(r"^### (r-[0-9a-f]+):", section, flags=re.M))


def _by_status(rules: list[Rule]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {"accepted": set(), "flagged": set(), "proposed": set(), "rejected": set()}
    for r in rules:
        out["flagged" if r.flag else r.status.value].add(r.id)
    return out


def _md(rules: list[Rule], cases: list[Case], **kw) -> str:
    return render_report(rules, {c.case_id: c for c in cases}, date=DATE, **kw).markdown


def test_every_section_is_present_in_order(built_rules, built_cases):
    md = _md(built_rules, built_cases, kb_label="test-kb")
    titles = list(_sections(md))
    assert titles == SECTIONS
    assert "| KB | test-kb |" in md and "| date | 2026-12-03 |" in md
    assert "| verified cases in the KB | 6 |" in md


def test_each_rule_appears_only_in_its_review_section(built_rules, built_cases):
    sections = _sections(_md(built_rules, built_cases))
    want = _by_status(built_rules)
    assert _rule_ids(sections["Accepted rules"]) == want["accepted"]
    assert _rule_ids(sections["Rules awaiting review"]) == want["proposed"]
    assert _rule_ids(sections["Flagged rules"]) == want["flagged"]
    assert _rule_ids(sections["Rejected rules"]) == want["rejected"]
    assert all(want.values()), "the fixture has a rule of each kind"
    summary = sections["Summary"]
    assert "| accepted | 1 |" in summary and "| flagged (accepted, evidence turned) | 1 |" in summary


def test_a_rule_shows_its_evidence_counter_evidence_and_reviews(built_rules, built_cases):
    accepted = next(r for r in built_rules if r.status.value == "accepted" and not r.flag)
    text = _sections(_md(built_rules, built_cases))["Accepted rules"]
    assert accepted.condition_text in text and "→ action_smoothness" in text
    assert "**Support**: 3 cases; **wins** 2/3 (67%)" in text
    assert "params: `coef=0.1`" in text
    ev = accepted.evidence
    assert f"{ev.effect:+.3g} [{ev.ci_low:+.3g}, {ev.ci_high:+.3g}] (95% CI)" in text
    # the worse case is counter-evidence, with its status and effect, in the counter table
    assert re.search(r"\| \[c-s3\]\(#case-c-s3\) \| scenario_c-s3 \| Pendulum-v1 \| worse \| -0\.25 success_rate", text)
    assert "[c-s1](#case-c-s1)" in text.split("**Counter-evidence**")[0]
    # the reviewer's note keeps its words, its "|" escaped so it cannot break a table
    assert 'accepted by alice on 2026-12-01: "matches the RL folklore \\| and our runs"' in text


def test_the_flag_says_how_the_evidence_turned(built_rules, built_cases):
    text = _sections(_md(built_rules, built_cases))["Flagged rules"]
    assert "**Flag**: win rate fell from 100% to 40% after re-mining" in text


def test_every_case_link_resolves_to_an_anchor_with_the_case(built_rules, built_cases):
    md = _md(built_rules, built_cases)
    links = set(re.findall(r"\]\(#(case-[^)]+)\)", md))
    anchors = set(re.findall(r'<a id="(case-[^"]+)"></a>', md))
    cited = {ref.case_id for r in built_rules for ref in (*r.evidence.supporting, *r.evidence.counter)}
    assert links == anchors == {f"case-{c}" for c in cited}
    appendix = _sections(md)["Cases"]
    assert "- patch: action smoothness penalty 0.1" in appendix
    assert "per seed: control 0.2, 0.1, 0.3; treatment 0.7, 0.6, 0.5" in appendix
    assert "seeds 3, budget 20000 env steps" in appendix


def test_a_cited_case_missing_from_the_kb_is_said_so(built_rules, built_cases):
    md = _md(built_rules, [c for c in built_cases if c.case_id != "c-s3"])
    block = md.split('<a id="case-c-s3"></a>')[1].split("<a id=")[0]
    assert "not in this KB" in block and "worse" in block


def test_two_renders_are_identical_and_the_files_are_where_it_says(tmp_path, built_rules, built_cases):
    cases = {c.case_id: c for c in built_cases}
    a = write_report(built_rules, cases, tmp_path / "a", date=DATE, seed=3)
    b = write_report(list(reversed(built_rules)), cases, tmp_path / "b", date=DATE, seed=3)
    assert a.markdown.name == "heuristics-2026-12-03.md" and a.html.name == "heuristics-2026-12-03.html"
    assert a.markdown.read_bytes() == b.markdown.read_bytes()
    assert a.html.read_bytes() == b.html.read_bytes()
    assert [p.name for p in a.plots] == [p.name for p in b.plots]
    assert all(p.read_bytes() == q.read_bytes() for p, q in zip(a.plots, b.plots))
    # the Markdown links its plots by relative path, and they exist
    for rel in re.findall(r"!\[[^]]*\]\(([^)]+)\)", a.markdown.read_text()):
        assert (a.markdown.parent / rel).is_file()
    assert a.counts == {"accepted": 1, "flagged": 1, "proposed": 1, "rejected": 1}


def test_rewriting_replaces_the_report_and_leaves_no_temporary_files(tmp_path, built_rules, built_cases):
    cases = {c.case_id: c for c in built_cases}
    write_report(built_rules, cases, tmp_path, date=DATE)
    paths = write_report(built_rules[1:2], cases, tmp_path, date=DATE)  # fewer examples now
    plot_dir = tmp_path / plot_dir_name(DATE)
    assert sorted(plot_dir.iterdir()) == sorted(paths.plots)
    assert not [p for p in tmp_path.rglob("*.tmp")]
    assert built_rules[0].id not in paths.markdown.read_text()
    assert oct(paths.html.stat().st_mode & 0o777) == "0o644"


def test_the_html_is_self_contained_with_one_table_row_per_rule(built_rules, built_cases):
    html = render_report(built_rules, {c.case_id: c for c in built_cases}, date=DATE).html
    table = re.search(r'<table id="rules">(.*?)</table>', html, flags=re.S)
    assert table is not None
    assert table.group(1).count('<tr class="rule-row">') == len(built_rules)
    assert not re.search(r'(src|href)="(https?:|//|[^"#d])', html), "only anchors and data URIs"
    assert "<link" not in html and "<script" not in html
    images = re.findall(r'<img [^>]*src="([^"]+)"', html)
    assert images and all(src.startswith("data:image/png;base64,") for src in images)
    assert "<details>" in html  # rejected rules are collapsed


def test_html_escapes_what_reviewers_write(built_rules, built_cases):
    from remedy.miners.model import Review, RuleStatus

    rule = built_rules[1].model_copy(
        update={"reviews": [Review(decision=RuleStatus.proposed, reviewer="<b>mallory</b>", note="<script>x</script>")]}
    )
    html = render_report([rule], {c.case_id: c for c in built_cases}, date=DATE).html
    assert "<script>x" not in html and "&lt;script&gt;x" in html


def test_no_rules_still_renders_and_says_how_to_mine(tmp_path):
    paths = write_report([], {}, tmp_path, date=DATE)
    md, html = paths.markdown.read_text(), paths.html.read_text()
    assert "**Nothing mined yet**" in md and HOW_TO_MINE in md
    assert "Nothing mined yet" in html and "<code>remedy mine</code>" in html and "`" not in html
    assert list(_sections(md)) == SECTIONS and paths.plots == []
    assert '<table id="rules">' in html


def test_example_plots_come_from_the_accepted_rules_supporting_cases(built_rules, built_cases):
    text = _sections(_md(built_rules, built_cases))["Example cases"]
    shown = re.findall(r"^### (c-[\w-]+) \((supporting|counter-evidence) of (r-\w+)\)", text, flags=re.M)
    accepted = {r.id for r in built_rules if r.status.value == "accepted"}
    assert shown and all(role == "supporting" and rule in accepted for _, role, rule in shown)
    assert {case for case, _, _ in shown} == {"c-s1", "c-s2"}


def test_before_after_uses_seeds_when_stored_and_means_with_ci_otherwise(built_cases):
    by_id = {c.case_id: c for c in built_cases}
    seeds = arm_values(by_id["c-s1"])
    assert seeds is not None and seeds.per_seed and seeds.control == [0.2, 0.1, 0.3]
    means = arm_values(by_id["c-s2"])
    assert means is not None and not means.per_seed and means.treatment_ci == pytest.approx((0.2, 0.8))
    for case in (by_id["c-s1"], by_id["c-s2"]):
        png = before_after_plot(case, seed=0)
        assert png is not None and png.startswith(b"\x89PNG")
    assert before_after_plot(by_id["c-s1"], seed=0) == before_after_plot(by_id["c-s1"], seed=0)


def test_a_file_where_the_directory_should_be_is_refused_and_left_alone(tmp_path, built_rules, built_cases):
    target = tmp_path / "reports"
    target.write_text("not a directory")
    with pytest.raises(ReportPathError, match=r"reports is a file, not a directory; pass --out a writable directory"):
        write_report(built_rules, {c.case_id: c for c in built_cases}, target, date=DATE)
    assert target.read_text() == "not a directory" and sorted(tmp_path.iterdir()) == [target]


def test_a_directory_under_a_file_is_refused(tmp_path, built_rules):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ReportPathError, match=r"cannot write the report to .*file/reports"):
        write_report(built_rules, {}, tmp_path / "file" / "reports", date=DATE)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through directory permissions")
def test_a_read_only_directory_is_refused_with_nothing_written(tmp_path: Path, built_rules):
    target = tmp_path / "ro"
    target.mkdir(mode=0o500)
    try:
        with pytest.raises(ReportPathError, match=r"cannot write the report to .*ro .*fix its permissions"):
            write_report(built_rules, {}, target, date=DATE)
        assert list(target.iterdir()) == []
    finally:
        target.chmod(0o700)


def test_a_rule_whose_point_lies_outside_its_interval_still_plots(built_rules):
    from remedy.miners.plots import forest_plot

    odd = built_rules[0].model_copy(
        update={"evidence": built_rules[0].evidence.model_copy(update={"effect": 2.0, "ci_low": -0.1, "ci_high": 0.5})}
    )
    assert forest_plot([odd, built_rules[1]], "scale").startswith(b"\x89PNG")
