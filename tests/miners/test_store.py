"""The rule store: round trip in the KB's DuckDB file, re-mining without duplicates, review lifecycle, flags."""

from __future__ import annotations

import pytest

from remedy.cases.errors import RuleNotFoundError, ValidationError
from remedy.cases.store import CaseStore
from remedy.miners import RuleStatus, RuleStore, mine
from remedy.miners.store import NOT_FOUND


@pytest.fixture
def rules(tmp_path) -> RuleStore:
    return RuleStore(CaseStore(tmp_path / "remedy.duckdb"))


def _smoothing(result):
    return next(r for r in result.rules if r.family.value == "action_smoothness")


def test_rules_round_trip_through_the_kb_file(rules, planted, tmp_path):
    result = mine(planted)
    report = rules.upsert_mined(result)
    assert sorted(report.new) == sorted(r.id for r in result.rules) and not report.updated
    again = RuleStore(CaseStore(tmp_path / "remedy.duckdb"))  # a fresh handle reads what was written
    assert {r.id: r for r in again.all()} == {r.id: r for r in result.rules}
    rule = _smoothing(result)
    assert again.get(rule.id) == rule
    assert all(r.status == RuleStatus.proposed for r in again.all())


def test_re_mining_updates_evidence_and_keeps_reviews_without_duplicates(rules, planted, make_measured):
    first = mine(planted)
    rules.upsert_mined(first)
    rid = _smoothing(first).id
    rules.review(rid, "accepted", reviewer="ada", note="matches CAPS")
    more = [
        *planted,
        make_measured(
            90,
            family="action_smoothness",
            symptoms=("jerky_actions", "low_success"),
            action_space="continuous",
            env_id="Pendulum-v1",
            cause="action_jitter",
        ),
    ]
    second = mine(more)
    report = rules.upsert_mined(second)
    assert rid in report.updated and not report.new
    stored = rules.all()
    assert len(stored) == len({r.id for r in stored}) == len(first.rules)
    rule = rules.get(rid)
    assert rule.evidence.support == 7 and rule.evidence.wins == 6
    assert rule.status == RuleStatus.accepted and [r.reviewer for r in rule.reviews] == ["ada"]
    assert rule.flag == ""


def test_accept_and_reject_record_who_when_and_why(rules, planted, monkeypatch):
    result = mine(planted)
    rules.upsert_mined(result)
    rid = _smoothing(result).id
    monkeypatch.setenv("USER", "grace")
    accepted = rules.review(rid, "accepted")
    assert accepted.status == RuleStatus.accepted and accepted.reviews[-1].reviewer == "grace"
    assert [r.id for r in rules.accepted()] == [rid]
    with pytest.raises(ValidationError, match="--note"):
        rules.review(rid, "rejected", reviewer="ada")
    rejected = rules.review(rid, "rejected", reviewer="ada", note="one env only")
    assert [(r.decision.value, r.reviewer, r.note) for r in rejected.reviews] == [
        ("accepted", "grace", ""),
        ("rejected", "ada", "one env only"),
    ]
    assert rejected.reviews[0].at <= rejected.reviews[1].at
    assert rules.accepted() == [] and rules.all("rejected") == [rejected]


def test_an_accepted_rule_whose_evidence_turned_is_flagged(rules, planted, make_measured):
    result = mine(planted)
    rules.upsert_mined(result)
    rid = _smoothing(result).id
    rules.review(rid, "accepted", reviewer="ada")
    losses = [
        make_measured(
            100 + i,
            family="action_smoothness",
            status="worse",
            diff=-0.4,
            symptoms=("jerky_actions", "low_success"),
            action_space="continuous",
            env_id="Pendulum-v1",
            cause="action_jitter",
        )
        for i in range(2)
    ]
    report = rules.upsert_mined(mine([*planted, *losses]))
    rule = rules.get(rid)
    assert "win rate fell from 83% to 62%" in rule.flag and report.flagged[rid] == rule.flag
    assert rule.status == RuleStatus.accepted  # a flag asks for a new look; it decides nothing
    assert rules.review(rid, "accepted", reviewer="ada").flag == ""  # a fresh review clears it


def test_a_rule_no_longer_found_keeps_its_record_with_a_flag(rules, planted, make_measured):
    result = mine(planted)
    rules.upsert_mined(result)
    rid = _smoothing(result).id
    losses = [
        make_measured(
            200 + i,
            family="action_smoothness",
            status="no_effect",
            diff=0.0,
            symptoms=("jerky_actions",),
            action_space="continuous",
            env_id="Pendulum-v1",
            cause="action_jitter",
        )
        for i in range(60)
    ]
    report = rules.upsert_mined(mine([*planted, *losses]))
    rule = rules.get(rid)
    assert rule.flag.startswith(NOT_FOUND) and "q " in rule.flag and rid in report.flagged
    assert rule.evidence.support == 66  # fresher evidence from the candidates the run still tested


def test_unknown_rule_id_names_close_ids(rules, planted):
    result = mine(planted)
    rules.upsert_mined(result)
    rid = _smoothing(result).id
    typo = rid[:-1] + ("0" if rid[-1] != "0" else "1")
    with pytest.raises(RuleNotFoundError, match=f"did you mean '{rid}'"):
        rules.get(typo)
    with pytest.raises(RuleNotFoundError, match=f"did you mean '{rid}'"):
        rules.review(rid[:6], "accepted")  # a prefix, like a short git hash
    with pytest.raises(RuleNotFoundError, match="remedy rules list"):
        RuleStore(rules.store).get("zzz-nothing-like-it")


def test_a_reader_of_a_kb_without_rules_writes_nothing(tmp_path):
    store = CaseStore(tmp_path / "remedy.duckdb")
    assert RuleStore(store, create=False).accepted() == []
    with store.connection() as con:
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert "rules" not in tables
    assert RuleStore(store).all() == []  # a writer makes the table on first use
