"""The root-cause registry agrees with the enum, the remedy families, the prior rulebooks, the bench
scenarios and the labelled reports; nothing names a cause that does not exist."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remedy.cases.errors import ValidationError
from remedy.cases.model import RemedyFamily, RootCause
from remedy.cases.verify.scenarios import load_scenarios
from remedy.retrieval import cause_ranker, describe, text_priors
from remedy.retrieval.priors import PRIORS
from remedy.retrieval.taxonomy import (
    CAUSE_PHRASES,
    CAUSE_TEXT,
    DIAGNOSABLE,
    FAMILY_CAUSES,
    STATED_FAMILIES,
    TAXONOMY,
    cause_entry,
)
from remedy.retrieval.text_priors import TEXT_PRIORS

REPORTS = Path(__file__).resolve().parents[2] / "bench" / "data" / "describe_reports.jsonl"


def test_every_cause_has_one_entry_with_a_description_and_families():
    assert list(TAXONOMY) == list(RootCause)
    assert all(cause is entry.cause for cause, entry in TAXONOMY.items())
    assert all(entry.description.strip() for entry in TAXONOMY.values())
    assert all(entry.families for entry in TAXONOMY.values() if entry.diagnosable)
    assert TAXONOMY[RootCause.unknown].families == ()  # not a diagnosis: nothing fixes "unknown"
    assert tuple(c.value for c in RootCause if c is not RootCause.unknown) == DIAGNOSABLE


def test_every_family_addresses_some_cause():
    assert set(FAMILY_CAUSES) == {f.value for f in RemedyFamily}
    assert all(FAMILY_CAUSES[f] for f in FAMILY_CAUSES)


def test_a_cause_a_description_can_state_proposes_families():
    assert set(CAUSE_PHRASES) == set(STATED_FAMILIES)
    assert all(phrases and all(p.strip() for p in phrases) for phrases in CAUSE_PHRASES.values())


def test_every_diagnosable_cause_can_be_named_by_a_cold_kb():
    """A prior rule (measured signatures) suggests each cause, and every rule names registered causes."""
    suggested = {cause for rule in PRIORS for cause, _ in rule.causes}
    assert suggested == {c for c in RootCause if c is not RootCause.unknown}
    assert {cause for rule in TEXT_PRIORS for cause, _ in rule.causes} <= set(TAXONOMY)


def test_the_modules_that_read_causes_read_the_registry():
    assert cause_ranker.CAUSES == DIAGNOSABLE and cause_ranker.CAUSE_TEXT is CAUSE_TEXT
    assert cause_ranker.FAMILY_CAUSES is FAMILY_CAUSES
    assert describe.CAUSE_PHRASES is CAUSE_PHRASES and text_priors.STATED_FAMILIES is STATED_FAMILIES
    assert list(CAUSE_TEXT) == list(DIAGNOSABLE)


def test_every_scenario_expects_a_family_that_addresses_one_of_its_causes():
    for s in load_scenarios():
        addressed = {f for c in s.ground_truth for f in TAXONOMY[c].families}
        assert addressed & set(s.expected_families), s.name


def test_labelled_reports_name_only_registered_causes_and_families():
    for line in REPORTS.read_text().splitlines():
        report = json.loads(line)
        assert {RootCause(c) for c in report["causes"]} <= set(TAXONOMY), report["id"]
        assert {RemedyFamily(f) for f in report["families"]} <= set(RemedyFamily), report["id"]


def test_an_unknown_cause_is_refused_with_a_suggestion():
    assert cause_entry("sparse_reward").cause is RootCause.sparse_reward
    with pytest.raises(ValidationError, match="did you mean 'sparse_reward'"):
        cause_entry("sparse_rewards")
