"""The remedy ranker: rows from every outcome, a seeded fit, the stored version, the margin rule, and diagnosis with it.

The KB is the small fix-loop corpus of ``test_job`` (real DuckDB, LanceDB and embedder): every third
scenario was fixed by a time limit (screened, then confirmed), the other attempts did nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dspy.utils.dummies import DummyLM

from remedy.cases.errors import OptimizeError
from remedy.cases.model import RemedyFamily
from remedy.kb.diagnose import KBRetriever, diagnose_signature
from remedy.kb.facade import KnowledgeBase
from remedy.optimizer.job import OptimizeOptions, run_optimize
from remedy.optimizer.ranker import RankerSettings, active_ranker, attempt_rows, fit_ranker
from remedy.optimizer.versions import ProgramStore, promotion_decision
from remedy.retrieval import default_embedder
from remedy.retrieval.llm import LLMDiagnoser
from remedy.retrieval.remedy_ranker import Outcomes, attempt_features

from .conftest import PATCHES, fix_loop, make_case
from .test_job import corpus


@pytest.fixture(scope="module")
def ranker_kb(tmp_path_factory):
    with KnowledgeBase.open(tmp_path_factory.mktemp("ranker") / "kb", embedder=default_embedder()) as kb:
        kb.add_many(corpus())
        yield kb


def _p(ranker, case, family: str) -> float:
    fam = RemedyFamily(family)
    return ranker.probability(attempt_features(case.subject, case.signature, PATCHES[family], fam, None))


def test_rows_count_every_outcome_with_its_weight() -> None:
    cases = [
        *fix_loop("a", fixed="time_limit", failed=("hyperparameters",)),
        make_case("b-screen-only", family="time_limit", status="improved", scenario="b"),  # never confirmed
        make_case("c-raced", family="normalization", status="stopped_early", scenario="c"),
        make_case("lit", source="example", scenario=None),  # literature: not evidence
    ]
    rows = {r.case_id: r for r in attempt_rows(cases)}
    assert set(rows) == {"a-hyperparameters", "a-time_limit-confirm", "b-screen-only", "c-raced"}
    assert rows["a-time_limit-confirm"].positive("improved") and not rows["a-hyperparameters"].positive("improved")
    assert rows["b-screen-only"].status == "inconclusive" and not rows["b-screen-only"].positive("improved")
    s = RankerSettings()
    assert [s.weight(rows[i].status) for i in ("a-hyperparameters", "b-screen-only", "c-raced")] == [1.0, 0.5, 0.25]
    assert rows["a-hyperparameters"].group == "scenario:a"


def test_the_fit_is_seeded_learns_from_failures_and_falls_back_to_the_base_rate() -> None:
    cases = corpus(12)
    rows = attempt_rows(cases)
    ranker = fit_ranker(rows)
    assert ranker == fit_ranker(rows)  # same rows and seed: the same model
    assert (
        ranker.meta["positives"] == 4 and ranker.meta["rows"] == len(rows) and ranker.meta["C"] in RankerSettings().cs
    )
    assert ranker.meta["oof_log_loss"] <= ranker.meta["base_log_loss"]  # grouped out-of-fold: better than the base rate
    # the experience behind the fit, by family (what the LLM diagnoser shows beside the ranked remedies)
    assert ranker.experience() == {
        RemedyFamily.hyperparameters: Outcomes(attempts=12),
        RemedyFamily.time_limit: Outcomes(attempts=4, improved=4),
        RemedyFamily.training_budget: Outcomes(attempts=12),
    }
    case = cases[0]
    assert _p(ranker, case, "time_limit") > _p(ranker, case, "hyperparameters")
    flat = fit_ranker(rows, RankerSettings(label="fixed"))  # no attempt was judged fixed: nothing to learn
    assert flat.coef == [] and flat.meta["positives"] == 0 and 0 < _p(flat, case, "time_limit") < 0.05


def test_optimize_promotes_or_refuses_by_the_margin_and_diagnose_uses_the_active_ranker(ranker_kb, tmp_path) -> None:
    case = ranker_kb.get("sc1-hyperparameters")
    vote = diagnose_signature(ranker_kb, case.subject, case.signature)
    opts = OptimizeOptions(backend="ranker", reports=tmp_path / "reports")
    refused = run_optimize(
        ranker_kb.store, KBRetriever(ranker_kb), OptimizeOptions(**{**opts.__dict__, "margin": 0.99})
    )
    assert refused.version is not None and not refused.promoted and refused.version.backend == "ranker"
    assert active_ranker(ranker_kb.store) is None  # refused: the vote keeps its order
    assert diagnose_signature(ranker_kb, case.subject, case.signature).diagnosis == vote.diagnosis
    assert refused.details["vote_val"] == refused.active_val  # no ranker was active: the bar is the vote
    assert "deterministic vote alone" in refused.report.read_text()
    kept = run_optimize(ranker_kb.store, KBRetriever(ranker_kb), OptimizeOptions(**{**opts.__dict__, "margin": 0.0}))
    assert kept.promoted == promotion_decision(kept.active_val, kept.new_val, 0.0)[0]
    if not kept.promoted:  # the rule refused it on this tiny KB: activate by hand to test the diagnosis path
        ProgramStore(ranker_kb.store).activate(kept.version.id)
    loaded = active_ranker(ranker_kb.store)
    assert loaded is not None and loaded.version == kept.version.id and loaded.coef == kept.version.parameters["coef"]
    ranked = diagnose_signature(ranker_kb, case.subject, case.signature)
    assert ranked.diagnosis.program_version.endswith(f"+ranker:{kept.version.id}")
    scores = [c.score for c in ranked.candidates]
    assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)
    ProgramStore(ranker_kb.store).rollback("ranker")
    assert diagnose_signature(ranker_kb, case.subject, case.signature).diagnosis == vote.diagnosis


def test_a_tampered_stored_ranker_is_one_clear_error(ranker_kb) -> None:
    programs = ProgramStore(ranker_kb.store)
    bad = {"names": ["a"], "center": [0.0], "scale": [-1.0], "coef": [1.0], "intercept": 0.0}
    v = programs.add(backend="ranker", optimizer="logistic-l2", train_size=1, val_size=1, active_val=None,
                     new_val=1.0, promote=True, reason="test", parameters=bad)  # fmt: skip
    with pytest.raises(OptimizeError, match=f"{v.id} is malformed.*programs rollback --backend ranker"):
        active_ranker(ranker_kb.store)
    programs.rollback("ranker")


def test_the_cli_accepts_the_ranker_backend_and_refuses_an_optimizer_for_it(tmp_path: Path) -> None:
    OptimizeOptions(backend="ranker").check()
    with pytest.raises(OptimizeError, match="--optimizer applies to --backend llm only"):
        OptimizeOptions(backend="ranker", optimizer="gepa").check()
    with pytest.raises(OptimizeError, match="choose offline, llm or ranker"):
        OptimizeOptions(backend="forest").check()


def test_the_llm_diagnoser_is_shown_the_active_rankers_ranked_remedies(ranker_kb) -> None:
    case = ranker_kb.get("sc1-hyperparameters")
    answer = {
        "reasoning": "r", "observations": "o", "candidate_causes": "c", "evidence": "e",
        "root_causes": json.dumps([{"cause": "undertraining", "confidence": 0.6}]), "patches": "[]",
    }  # fmt: skip

    def prompt() -> str:
        lm = DummyLM([answer])
        diagnose_signature(ranker_kb, case.subject, case.signature, diagnoser=LLMDiagnoser(lm=lm))
        return "\n".join(m["content"] for m in lm.history[-1]["messages"])

    assert "no remedy ranker is active" in prompt()
    ranker = fit_ranker(attempt_rows(ranker_kb.store.iter_cases()))
    programs = ProgramStore(ranker_kb.store)
    v = programs.add(backend="ranker", optimizer="logistic-l2", train_size=1, val_size=1, active_val=None,
                     new_val=1.0, promote=True, reason="test", parameters=ranker.model_dump(mode="json"))  # fmt: skip
    try:
        shown = prompt()
    finally:
        programs.rollback("ranker")
    assert f"remedy ranker {v.id}" in shown and "P(confirmed fix)" in shown
    assert f"in the {ranker.meta['rows']} KB attempts it was fitted on" in shown
    # 3 of the 8 loops were fixed by a time limit (confirmed); the other families never helped
    assert "1. time_limit (" in shown and "KB: 3 attempts, 3 confirmed improved, 0 fixed" in shown
    # the ten nearest past failures are all 8 loops, each with its attempts (by case: 4 of the 8 failures)
    assert "not proposed: hyperparameters (8 attempts, 0 confirmed improved, 0 fixed)" in shown
