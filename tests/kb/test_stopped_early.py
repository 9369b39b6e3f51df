"""A candidate a race stopped early (``stopped_early``) travels whole and is never read as a verdict.

Hand-built cases: a fix loop's round where a race dropped a time-limit patch at stage 1 and
screened a normalization patch at the full budget (``no_effect``). Export/import keeps the
stage-1 evidence; the miner, the optimizer's dataset and metric, the offline vote and the
trust weights read the dropped candidate as no verdict, while the screened one stays a loss.
"""

from __future__ import annotations

import pytest

from remedy.cases.io import read_cases, write_cases
from remedy.cases.model import (
    ActionSpaceType,
    Case,
    Cause,
    Diagnosis,
    Effect,
    EnvTraits,
    RaceStage,
    RemedyFamily,
    RootCause,
    Signature,
    Source,
    Stage,
    Status,
    Subject,
    Verification,
)
from remedy.cases.patches.spec import Normalization, Patch, TimeLimit
from remedy.miners.facts import final_attempts
from remedy.optimizer.dataset import build_examples
from remedy.optimizer.metric import score_prediction
from remedy.retrieval.offline import OfflineDiagnoser
from remedy.retrieval.trust import outcome_sign

STAGE_ONE = Effect(
    metric="return_iqm", treatment=10.0, control=40.0, diff=-30.0, ci_low=-80.0, ci_high=20.0, method="welch_seeds"
)
SCREEN = Effect(metric="return_iqm", treatment=41.0, control=40.0, diff=1.0, ci_low=-9.0, ci_high=11.0)


def _case(case_id: str, patch: Patch, verification: Verification, parent: str | None = None) -> Case:
    return Case(
        case_id=case_id,
        source=Source.bench,
        subject=Subject(
            env_id="CartPole-v1",
            algo="PPO",
            traits=EnvTraits(action_space=ActionSpaceType.discrete, obs_dim=4, action_dim=2),
        ),
        signature=Signature(summary="the pole falls early", symptoms=["premature_convergence"]),
        diagnosis=Diagnosis(causes=[Cause(cause=RootCause.undertraining, confidence=0.6)], backend="offline"),
        patch=patch,
        verification=verification,
        scenario="tiny_race",
        parent_id=parent,
    )


def stopped() -> Case:
    race = RaceStage(
        effect=STAGE_ONE,
        seeds=2,
        budget_steps=400,
        full_budget_steps=1200,
        env_steps=2400,
        score=-0.6,
        rank=2,
        of=2,
        survived=False,
        rule="ranked 2 of 2 (top 1 go on)",
        controls=["ctl-a", "ctl-b"],
    )
    v = Verification(
        status=Status.stopped_early,
        effect=STAGE_ONE,
        seeds=2,
        budget_steps=400,
        env_steps=2400,
        stage=Stage.race,
        reason="stopped early at stage 1 of a race",
        race=race,
        controls=["ctl-a", "ctl-b"],
    )
    return _case("race-dropped", Patch(parts=[TimeLimit(max_episode_steps=300)]), v)


def screened() -> Case:
    v = Verification(status=Status.no_effect, effect=SCREEN, seeds=2, budget_steps=1200, env_steps=4800)
    return _case("race-screen", Patch(parts=[Normalization(obs=True)]), v, parent="race-dropped")


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet"])
def test_a_stopped_case_round_trips_through_export_and_import(tmp_path, suffix):
    path = tmp_path / f"cases{suffix}"
    cases = [stopped(), screened()]
    write_cases(path, cases)
    back, problems = read_cases(path)
    assert back == cases and not problems
    assert back[0].verification.race == cases[0].verification.race


def test_a_kb_keeps_and_counts_stopped_cases_apart(kb, tmp_path):
    cases = [stopped(), screened()]
    kb.add_many(cases)
    kb.export(tmp_path / "out.jsonl")
    kb.delete(["race-dropped", "race-screen"])
    kb.import_file(tmp_path / "out.jsonl")
    back = kb.get("race-dropped")
    assert back == cases[0] and back.verification.race.rule.startswith("ranked 2 of 2")
    by_status = kb.stats(index=False).store.by_status
    assert by_status.get("stopped_early") == 1 and by_status.get("no_effect") == 1


def test_the_miner_counts_no_verdict_for_a_stopped_case():
    attempts = final_attempts([stopped(), screened()])
    assert [a.case.case_id for a in attempts] == ["race-screen"]  # the loss at full budget is still one


def test_the_optimizer_reads_a_stopped_family_as_not_failed():
    (example,) = build_examples([stopped(), screened()])  # one group: the parent link holds
    assert {t.status for t in example.tried} == {"stopped_early", "no_effect"}
    # unsolved, no answer key: only families verified NOT to help cost score
    top_stopped = score_prediction(example, [], [RemedyFamily.time_limit])
    top_failed = score_prediction(example, [], [RemedyFamily.normalization])
    assert top_stopped.score == pytest.approx(1.0) and top_failed.score == pytest.approx(0.5)


def test_the_vote_and_trust_weights_take_a_stopped_case_as_neither_way():
    vote = OfflineDiagnoser()
    assert vote._outcome_weight(stopped()) == (0.0, "stopped_early")
    assert vote._outcome_weight(screened())[0] < 0
    assert outcome_sign(stopped()) == 0 and outcome_sign(screened()) == -1
