"""The miner on the real dev-scenario export (``reports/kb/dev-cases.jsonl``), whatever its size."""

from __future__ import annotations

from pathlib import Path

import pytest

from remedy.cases.errors import TooFewCasesError
from remedy.cases.io import read_cases
from remedy.miners import MIN_ATTEMPTS, final_attempts, mine

EXPORT = Path(__file__).resolve().parents[2] / "reports" / "kb" / "dev-cases.jsonl"

pytestmark = pytest.mark.skipif(
    not EXPORT.is_file(), reason=f"{EXPORT} is missing: the dev bench export is committed to main by the lead"
)


@pytest.fixture(scope="module")
def cases():
    return read_cases(EXPORT)[0]


def test_each_attempt_counts_once_at_its_final_verdict(cases):
    finals = final_attempts(cases)
    ids = [a.case.case_id for a in finals]
    assert len(ids) == len(set(ids))
    confirmed = {c.verification.confirms for c in cases if c.verification and c.verification.confirms}
    assert not confirmed & set(ids)  # a confirmed screen never counts beside its confirmation
    assert all(a.case.source.value in ("bench", "verified", "imported") for a in finals)
    improved = [a for a in finals if a.improved]
    assert all(a.case.verification.stage.value == "confirm" for a in improved)  # only confirmations can win


def test_mined_rules_hold_up_to_their_own_evidence(cases):
    finals = final_attempts(cases)
    if len(finals) < MIN_ATTEMPTS:
        with pytest.raises(TooFewCasesError, match=f"the KB has {len(finals)}"):
            mine(cases)
        return
    result = mine(cases, min_support=3, fdr=0.1, seed=0)
    by_id = {a.case.case_id: a for a in finals}
    assert result.n_attempts == len(finals) and result.n_tested >= len(result.rules)
    for rule in result.rules:
        e = rule.evidence
        assert e.support >= 3 and e.q_value <= 0.1 and e.wins >= 1
        assert e.wins == len(e.supporting) and e.support == e.wins + len(e.counter)
        refs = [*e.supporting, *e.counter]
        assert all(by_id[r.case_id].family == rule.family for r in refs)
        assert all(all(c in by_id[r.case_id].facts for c in rule.conditions) for r in refs)
        assert all(by_id[r.case_id].improved for r in e.supporting)
    # every candidate with no win is tested but never kept
    assert all(r.evidence.wins > 0 for r in result.rules)
    again = mine(cases, min_support=3, fdr=0.1, seed=0)
    assert [r.model_dump_json() for r in again.rules] == [r.model_dump_json() for r in result.rules]
