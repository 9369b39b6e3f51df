"""Offline tuning on the bench's real verified dev cases (real KB, embedder, LanceDB, offline vote)."""

from __future__ import annotations

import pytest

from remedy.cases.errors import OptimizeError
from remedy.kb.diagnose import KBRetriever
from remedy.kb.facade import KnowledgeBase
from remedy.optimizer.dataset import build_examples, dev_answer_keys, split_examples
from remedy.optimizer.job import _group_ids
from remedy.optimizer.offline import evaluate, prepare, tune_offline
from remedy.optimizer.versions import ProgramStore, promotion_decision
from remedy.retrieval.offline import OfflineSettings

from .conftest import DEV_CASES

WORSE = OfflineSettings(k=1, w_prior=0.0)  # one neighbour's word, and the prior rulebook silenced


@pytest.fixture(scope="module")
def dev_kb(tmp_path_factory, dev_cases):
    kb = KnowledgeBase.open(tmp_path_factory.mktemp("dev") / "kb")
    kb.import_file(DEV_CASES)
    return kb


@pytest.fixture(scope="module")
def split(dev_kb):
    """(train, validation) prepared examples: retrieval done once, leave-group-out."""
    cases = list(dev_kb.cases())
    examples = build_examples(cases, answer_keys=dev_answer_keys({c.scenario for c in cases if c.scenario}))
    if len({e.group for e in examples}) < 3:
        pytest.skip("the dev export has fewer than 3 scenarios yet")
    train, _ = split_examples(examples, seed=0)
    prepared = prepare(examples, KBRetriever(dev_kb), _group_ids(cases))
    keys = {e.key for e in train}
    return [p for p in prepared if p.example.key in keys], [p for p in prepared if p.example.key not in keys]


def test_retrieval_never_sees_the_examples_own_group(split) -> None:
    for p in [*split[0], *split[1]]:
        assert p.context.cases, "a KB of other scenarios' cases retrieves something"
        assert all(f"scenario:{rc.case.scenario}" != p.example.group for rc in p.context.cases)
        assert not {rc.case.case_id for rc in p.context.cases} & set(p.example.case_ids)


def test_tuned_settings_score_at_least_the_defaults_on_validation(split) -> None:
    train, val = split
    tuning = tune_offline(train, trials=40, seed=0)
    assert tuning.train_score >= tuning.start_score == pytest.approx(evaluate(OfflineSettings(), train))
    assert evaluate(tuning.settings, val) >= evaluate(OfflineSettings(), val)
    again = tune_offline(train, trials=40, seed=0)
    assert again.settings == tuning.settings  # seeded: same examples, same result


def test_a_deliberately_worse_candidate_is_not_promoted(split, dev_kb) -> None:
    _, val = split
    defaults_val, worse_val = evaluate(OfflineSettings(), val), evaluate(WORSE, val)
    assert worse_val < defaults_val
    promote, reason = promotion_decision(defaults_val, worse_val, 0.02)
    assert not promote and "stays" in reason
    programs = ProgramStore(dev_kb.store)
    before = programs.active()
    v = programs.add(
        backend="offline", optimizer="hand", train_size=len(split[0]), val_size=len(val), active_val=defaults_val,
        new_val=worse_val, promote=promote, reason=reason, parameters=WORSE.model_dump(mode="json"),
    )  # fmt: skip
    assert not v.active and programs.active() == before


def test_tuning_refuses_nothing_to_tune_on() -> None:
    with pytest.raises(OptimizeError, match="no train examples"):
        tune_offline([], trials=5)
    with pytest.raises(OptimizeError, match="--trials"):
        tune_offline([], trials=0)
