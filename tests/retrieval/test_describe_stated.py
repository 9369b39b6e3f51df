"""A description's stated causes, description priors, family-level proposals and the text knobs of the vote."""

from __future__ import annotations

import pytest

from remedy.cases.model import RemedyFamily, RootCause
from remedy.kb.diagnose import diagnose_description
from remedy.retrieval.describe import SymptomReader, split_clauses, text_signature, text_subject
from remedy.retrieval.diagnosis import CauseReading, DiagnosisContext, SymptomReading
from remedy.retrieval.offline import OfflineDiagnoser
from remedy.retrieval.priors import match_priors
from remedy.retrieval.text_priors import STATED_FAMILIES, TEXT_PRIORS


@pytest.fixture(scope="module")
def reader(embedder) -> SymptomReader:
    return SymptomReader(embedder)


@pytest.fixture(scope="module")
def kb_with_examples(tmp_path_factory, embedder):
    """A KB of the bundled example cases, shared read-only by a module's tests."""
    from remedy.kb.facade import KnowledgeBase

    with KnowledgeBase.open(tmp_path_factory.mktemp("examples") / "kb", create=True, embedder=embedder) as kb:
        kb.load_examples()
        yield kb


def _ctx(text: str, tags: list[str], *, stated=(), description: bool = True, **subject) -> DiagnosisContext:
    subj, notes = text_subject(tags=tags, **subject)
    return DiagnosisContext(
        subject=subj,
        signature=text_signature(text, tags),
        notes=tuple(notes),
        description=text if description else "",
        reading=tuple(SymptomReading(tag=t, clause="set by the user") for t in tags),
        stated=tuple(stated),
    )


# ---- reading ---------------------------------------------------------------------------------


def test_numbers_do_not_split_clauses():
    assert split_clauses("After 12,000 iterations the return is 0.8. It falls, but very slowly.") == [
        "After 12,000 iterations the return is 0.8",
        "It falls",
        "very slowly",
    ]


@pytest.mark.parametrize(
    "text, cause",
    [
        ("I think my learning rate is far too high.", RootCause.unstable_optimization),
        ("The humanoid learned a bizarre, unnatural looking gait.", RootCause.reward_misspecification),
        ("My epsilon decays much too quickly.", RootCause.insufficient_exploration),
        ("I only trained it for a few thousand steps.", RootCause.undertraining),
    ],
)
def test_a_cause_stated_outright_is_read(reader, text, cause):
    stated = reader.read_causes(text)
    assert stated and stated[0].cause == cause, [(s.cause, s.similarity) for s in stated]
    assert stated[0].similarity >= reader.cause_threshold and stated[0].clause


def test_a_plain_symptom_states_no_cause(reader):
    for text in ("The lander hovers above the pad until the time limit.", "The torque chatters between the extremes."):
        assert reader.read_causes(text) == [], text
    assert SymptomReader(reader.embedder, cause_threshold=1.01).read_causes("the learning rate is too high") == []


@pytest.mark.parametrize(
    "text, tag",
    [
        ("Training is unstable.", "unstable_learning"),  # an antonym phrasing must not cancel the literal claim
        ("The policy picks one single action in almost every step.", "collapsed_entropy"),
        ("The reward is sparse.", "sparse_signal"),
        ("The robot just stands still instead of walking to the target.", "hovering"),
    ],
)
def test_more_phrasings_read_common_wordings(reader, text, tag):
    assert tag in [r.tag for r in reader.read(text)], [(r.tag, r.similarity) for r in reader.read(text)]


# ---- description priors and family-level proposals ---------------------------------------------


def test_description_priors_fire_on_one_tag_and_only_for_descriptions():
    ctx = _ctx("the reward is zero almost everywhere", ["sparse_signal"])
    assert [m.rule.id for m in match_priors(ctx.subject, ctx.signature)] == []  # the rulebook needs two tags
    assert [m.rule.id for m in match_priors(ctx.subject, ctx.signature, TEXT_PRIORS)] == ["text-sparse-reward"]
    described = OfflineDiagnoser().diagnose(ctx)
    measured = OfflineDiagnoser().diagnose(
        _ctx("the reward is zero almost everywhere", ["sparse_signal"], description=False)
    )
    assert described.top_cause == RootCause.sparse_reward
    assert "text-sparse-reward" in described.diagnosis.cited_rules
    assert measured.top_cause == RootCause.unknown and measured.families == []  # a run-dir vote is unchanged


def test_a_family_is_advised_even_when_no_patch_can_be_built():
    # reward code needs a named env: no concrete reward_shaping patch, but the family leads the ranking
    report = OfflineDiagnoser().diagnose(_ctx("the reward is zero almost everywhere", ["sparse_signal"]))
    fams = [f.family for f in report.families]
    assert fams[0] == RemedyFamily.reward_shaping and RemedyFamily.exploration_bonus in fams
    assert report.families[0].example is None and report.families[0].cites == ["text-sparse-reward"]
    assert RemedyFamily.reward_shaping not in [c.family for c in report.candidates]
    by_family = {f.family: f for f in report.families}
    for cand in report.candidates:  # a family with a fitting patch shows it as the example
        assert by_family[cand.family].example == cand.patch
    scores = [f.score for f in report.families]
    assert scores == sorted(scores, reverse=True)


def test_without_family_level_votes_a_vague_subject_gets_no_such_family():
    report = OfflineDiagnoser().diagnose(
        _ctx("it works in one simulator and fails in another", ["poor_generalization"])
    )
    assert report.top_cause == RootCause.generalization_gap
    assert report.families[0].family == RemedyFamily.curriculum and report.families[0].example is None
    named = OfflineDiagnoser().diagnose(
        _ctx("it works in calm air and fails in wind", ["poor_generalization"], env_id="LunarLander-v3")
    )
    assert named.families[0].family == RemedyFamily.curriculum and named.families[0].example is not None


# ---- stated causes in the vote ----------------------------------------------------------------


def test_a_stated_cause_votes_for_itself_and_its_families():
    stated = [CauseReading(cause=RootCause.unstable_optimization, similarity=0.8, clause="lr far too high")]
    report = OfflineDiagnoser().diagnose(_ctx("my learning rate is far too high", [], stated=stated))
    assert report.top_cause == RootCause.unstable_optimization
    assert "stated: 'lr far too high'" in report.diagnosis.causes[0].rationale
    assert [f.family for f in report.families][:2] == list(STATED_FAMILIES[RootCause.unstable_optimization])
    silent = OfflineDiagnoser(w_stated=0.0).diagnose(_ctx("my learning rate is far too high", [], stated=stated))
    assert silent.top_cause == RootCause.unknown


def test_diagnose_description_reports_stated_causes_and_families(reader):
    report = diagnose_description(
        None, "The learning rate is far too high and the reward is always zero.", reader=reader
    )
    assert RootCause.unstable_optimization in [s.cause for s in report.stated]
    assert report.families and {RootCause.unstable_optimization, RootCause.sparse_reward} <= {
        c.cause for c in report.diagnosis.causes
    }
    forced = diagnose_description(None, "The learning rate is far too high.", tags=["hovering"], reader=reader)
    assert forced.stated == []  # --tags overrides the whole reading


def test_retrieved_cases_weigh_by_text_case_weight(kb_with_examples, reader):
    text = "The pendulum torque chatters between the extremes every step."
    full = diagnose_description(kb_with_examples, text, tags=[], reader=reader)
    none = diagnose_description(kb_with_examples, text, tags=[], reader=reader, text_case_weight=0.0)
    assert full.diagnosis.causes[0].cause != RootCause.unknown
    assert none.top_cause == RootCause.unknown  # no tags, no stated cause, cases muted: nothing votes


# ---- reranking retrieved cases by their best clause match -------------------------------------


def test_rerank_lifts_the_case_that_shares_one_claim(embedder, make_case):
    from remedy.retrieval.describe import rerank_by_clauses
    from remedy.retrieval.diagnosis import RetrievedCase

    text = "I use PPO on my own env. The reward is zero on almost every step."
    sharing = make_case(
        "a", "Acrobot on the default settings. The reward is zero on nearly every step, so nothing is learned."
    )
    other = make_case("b", "The lander hovers above the pad until the time limit; the engines chatter.")
    cases = [RetrievedCase(case=other, similarity=0.5), RetrievedCase(case=sharing, similarity=0.5)]
    ranked = rerank_by_clauses(embedder, text, cases, weight=0.5)
    assert [r.case.case_id for r in ranked] == ["a", "b"]
    assert ranked[0].similarity > 0.5 and all(0.0 <= r.similarity <= 1.0 for r in ranked)
    assert rerank_by_clauses(embedder, text, cases, weight=0.0) == cases  # weight 0: retrieval order kept
    assert rerank_by_clauses(embedder, text, cases) == rerank_by_clauses(embedder, text, cases)
