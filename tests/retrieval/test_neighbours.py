from __future__ import annotations

from remedy.cases.model import Case, EnvTraits, Patch, Signature, Source, Subject
from remedy.cases.patches.spec import TrainingBudget
from remedy.retrieval.diagnosis import RetrievedCase
from remedy.retrieval.neighbours import MAX_POOL, by_patient, patient_key, pool_size

SUBJECT = Subject(
    env_id="CartPole-v1",
    algo="PPO",
    train_steps=10_000,
    traits=EnvTraits(action_space="discrete", obs_dim=4, action_dim=2),
)
SIG = Signature(features={"success_rate": 0.0}, symptoms=["low_success"], summary="falls over")


def _case(cid: str, scenario: str | None = None, sha: str | None = None) -> Case:
    return Case(
        case_id=cid,
        source=Source("verified"),
        subject=SUBJECT.model_copy(update={"checkpoint_sha256": sha}),
        signature=SIG,
        patch=Patch(parts=[TrainingBudget(extra_steps=1_000)]),
        scenario=scenario,
    )


def test_a_patient_is_its_scenario_else_its_checkpoint_else_the_case():
    assert patient_key(_case("c-1", scenario="cartpole_lr", sha="ab")) == "scenario:cartpole_lr"
    assert patient_key(_case("c-1", sha="ab")) == patient_key(_case("c-2", sha="ab")) == "checkpoint:ab"
    assert patient_key(_case("c-1")) != patient_key(_case("c-2"))


def test_k_patients_are_kept_with_every_attempt_in_order():
    hits = [
        RetrievedCase(_case("c-a1", "a"), 0.99),
        RetrievedCase(_case("c-a2", "a"), 0.98),
        RetrievedCase(_case("c-b1", "b"), 0.97),
        RetrievedCase(_case("c-a3", "a"), 0.96),
        RetrievedCase(_case("c-c1", "c"), 0.95),
        RetrievedCase(_case("c-b2", "b"), 0.94),
    ]
    assert [r.case.case_id for r in by_patient(hits, 2)] == ["c-a1", "c-a2", "c-b1", "c-a3", "c-b2"]
    assert [r.case.case_id for r in by_patient(hits, 1)] == ["c-a1", "c-a2", "c-a3"]
    assert by_patient(hits, 0) == [] and by_patient(hits, 10) == hits


def test_the_search_pool_widens_with_k_and_is_bounded():
    assert pool_size(1) > 1 and pool_size(10) > pool_size(5) >= 10
    assert pool_size(1_000) == 1_000 and pool_size(100) == MAX_POOL


def test_a_prompt_shows_a_few_attempts_of_each_similar_failure():
    from remedy.retrieval.diagnosis import DiagnosisContext
    from remedy.retrieval.llm_io import MAX_CASE_ROWS, MAX_CASES_PER_PATIENT, _cases_text

    hits = [RetrievedCase(_case(f"c-a{i}", "a"), 0.99) for i in range(5)]
    hits += [RetrievedCase(_case(f"c-x{i}"), 0.9) for i in range(30)]
    text = _cases_text(DiagnosisContext(subject=SUBJECT, signature=SIG, cases=tuple(hits)))
    rows = text.splitlines()
    assert len(rows) == MAX_CASE_ROWS
    assert sum("c-a" in r for r in rows) == MAX_CASES_PER_PATIENT and rows[0].startswith("- c-a0")
