"""Diagnosis at the service level: a run directory, a signature or a description in, a DiagnosisReport out.

Collects evidence, computes the signature, retrieves similar cases from the KB
(hybrid search, same action-space type, the evaluated scenario's own cases
excluded so a benchmark never sees its answer), and runs the chosen backend.
:class:`KBRetriever` adapts the facade to the ``CaseRetriever`` protocol that
the backends in ``remedy.retrieval`` depend on.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from remedy.cases.evidence.rollouts import EpisodeRecord, EvidenceBundle, collect_evidence
from remedy.cases.evidence.rundir import RunDir, visible_wrappers
from remedy.cases.evidence.signature import compute_signature
from remedy.cases.model import EpisodeSummary, Signature, Subject
from remedy.retrieval.budgets import size_candidates
from remedy.retrieval.diagnosis import (
    Attempt,
    CaseRetriever,
    CauseReading,
    Diagnoser,
    DiagnosisContext,
    DiagnosisReport,
    RetrievedCase,
    RuleLike,
    SymptomReading,
    get_diagnoser,
    program_kind,
)
from remedy.retrieval.neighbours import by_patient, pool_size

if TYPE_CHECKING:
    from remedy.cases.evidence.rollcache import RolloutCache
    from remedy.retrieval.cause_ranker import CauseRanker
    from remedy.retrieval.describe import SymptomReader

    from .facade import KnowledgeBase

__all__ = [
    "KBRetriever",
    "diagnose_run",
    "diagnose_signature",
    "diagnose_description",
    "failure_episodes",
    "reward_text",
    "matching_rules",
]

#: what a diagnosis retrieves by default: the k most similar distinct past failures with their attempts
NEIGHBOURS = "patients"
_NEIGHBOURS = ("patients", "cases")
#: most failure episodes shown to a backend (structured context, not raw logs).
MAX_FAILURE_EPISODES = 5
_MAX_CODE_CHARS = 4000


class KBRetriever:
    """The KB facade as a ``CaseRetriever``: ``similar(signature, k, action_space=, exclude_scenario=)``."""

    def __init__(self, kb: KnowledgeBase, mode: str = "hybrid") -> None:
        self.kb, self.mode = kb, mode

    def similar(
        self,
        signature: Signature,
        k: int,
        *,
        action_space: str | None = None,
        exclude_scenario: str | None = None,
        exclude_ids: Iterable[str] = (),
    ) -> list[RetrievedCase]:
        """Nearest stored cases to ``signature`` with their cosine similarity, best first."""
        hits = self.kb.similar(
            signature,
            k=k,
            action_space=action_space,
            exclude_scenario=exclude_scenario,
            exclude_ids=exclude_ids,
            mode=self.mode,
        )
        return [RetrievedCase(case=h.case, similarity=float(h.similarity)) for h in hits]


def failure_episodes(bundle: EvidenceBundle, n: int = MAX_FAILURE_EPISODES) -> tuple[EpisodeSummary, ...]:
    """Up to ``n`` failed deterministic episodes (all episodes when none failed), as summaries."""
    eps: Sequence[EpisodeRecord] = bundle.deterministic or bundle.stochastic
    failed = [e for e in eps if not e.success] or list(eps)
    return tuple(
        EpisodeSummary(
            seed=e.seed,
            ret=e.ret if math.isfinite(e.ret) else 0.0,
            length=e.length,
            termination=e.termination,
            success=e.success,
        )
        for e in failed[:n]
    )


def reward_text(run: RunDir) -> str:
    """What the agent was trained on: the reward reference's source when it resolves, plus setup wrappers."""
    cfg, parts = run.config, []
    if cfg.reward_ref:
        parts.append(_resolve_reward_ref(run.path, cfg.reward_ref))
    shown = visible_wrappers(cfg)  # a bench patient's fault wrappers are the answer key, never shown
    if shown:
        specs = [w.model_dump(mode="json") for w in shown]
        parts.append("setup wrappers applied during training: " + json.dumps(specs, default=str))
    return "\n".join(parts)[:_MAX_CODE_CHARS]


def _resolve_reward_ref(root: Path, ref: str) -> str:
    path = (root / ref) if not Path(ref).is_absolute() else Path(ref)
    if path.is_file():
        return f"# {ref}\n{path.read_text(errors='replace')}"
    if ":" in ref:  # "package.module:function"
        import importlib

        module, _, attr = ref.partition(":")
        try:
            return f"# {ref}\n{inspect.getsource(getattr(importlib.import_module(module), attr))}"
        except (ImportError, AttributeError, OSError, TypeError):
            pass
    return f"reward reference: {ref} (source not available)"


def matching_rules(kb: KnowledgeBase | None, subject: Subject, signature: Signature) -> list[RuleLike]:
    """The KB's ACCEPTED rules whose conditions hold for this subject and signature (none without a KB).

    Root-cause conditions are not tested (a cause is what the diagnosis looks for): the
    rule's ``cause`` votes instead (``remedy.miners.facts.rule_holds``).
    """
    if kb is None:
        return []
    from remedy.miners import RuleStore, rule_holds, subject_facts

    facts = subject_facts(subject, signature)
    accepted = RuleStore(kb.store, create=False).accepted()  # a diagnosis never writes to the KB
    return [r for r in accepted if rule_holds(r.conditions, facts)]


def _resolve(diagnoser: str | Diagnoser, params: dict[str, Any], kb: KnowledgeBase | None = None) -> Diagnoser:
    backend = get_diagnoser(diagnoser, **params) if isinstance(diagnoser, str) else diagnoser
    return _with_active_program(backend, kb)


def _with_active_program(backend: Diagnoser, kb: KnowledgeBase | None) -> Diagnoser:
    """A backend that runs stored program versions (asked through its ``program_kind``) runs the KB's
    active version of its kind instead of its built-in one, and names it in the diagnosis
    (``remedy optimize``, ``remedy programs activate``). Settings or a program chosen explicitly
    (knobs passed in, a version already) are left alone."""
    adopt = _ACTIVE_VERSION.get(program_kind(backend) or "")
    return backend if kb is None or adopt is None else adopt(backend, kb)


def _with_active_offline(backend: Any, kb: KnowledgeBase) -> Diagnoser:
    """The offline backend at its built-in defaults runs the active offline version and the active ranker."""
    from remedy.optimizer.ranker import active_ranker
    from remedy.optimizer.versions import active_offline
    from remedy.retrieval.offline import OfflineDiagnoser, OfflineSettings

    # the KB's active remedy ranker (remedy optimize --backend ranker) orders the vote; one passed in stays
    ranker = backend.ranker or active_ranker(kb.store)
    active = None
    if backend.program_id is None and backend.settings == OfflineSettings():
        active = active_offline(kb.store)
    if active is None and ranker is backend.ranker:
        return backend
    settings, pid = (backend.settings, backend.program_id) if active is None else (active.offline_settings(), active.id)
    return OfflineDiagnoser(settings, priors=backend.priors, program_id=pid, ranker=ranker)


def _with_active_llm_program(backend: Any, kb: KnowledgeBase) -> Diagnoser:
    """The llm backend on its built-in program runs the KB's active llm version (named in the diagnosis),
    and its ranked remedies come from the KB's active offline version and remedy ranker."""
    from remedy.retrieval.offline import OfflineDiagnoser

    if hasattr(backend, "with_vote"):  # it shows a vote's ranked remedies (retrieval.llm.LLMDiagnoser)
        base = backend.vote or OfflineDiagnoser()
        vote = _with_active_offline(base, kb)
        if vote is not base:  # an active offline version or ranker to adopt
            backend = backend.with_vote(vote)
    if backend.program_chosen or backend.program_id is not None:
        return backend
    from remedy.optimizer.versions import ProgramStore

    active = ProgramStore(kb.store).active("llm")
    if active is None or not active.program:
        return backend
    from remedy.optimizer.llm import load_program

    return backend.with_program(load_program(active.program), active.id)


#: program kind (a stored version's ``backend``) -> how a backend of that kind adopts the KB's active version
_ACTIVE_VERSION = {"offline": _with_active_offline, "llm": _with_active_llm_program}


def _retrieval_k(k: int, backend: Diagnoser) -> int:
    """Neighbours to retrieve: ``k``, or more when an active program version's vote uses more."""
    settings = getattr(backend, "settings", None)
    if getattr(backend, "program_id", None) is None or settings is None:
        return k
    return max(k, int(getattr(settings, "k", 0)))


def diagnose_signature(
    kb: KnowledgeBase | None,
    subject: Subject,
    signature: Signature,
    *,
    diagnoser: str | Diagnoser = "offline",
    k: int = 10,
    exclude_scenario: str | None = None,
    exclude_ids: Iterable[str] = (),
    tried: Sequence[Attempt] = (),
    episodes: Sequence[EpisodeSummary] = (),
    reward_code: str = "",
    rules: Sequence[RuleLike] | None = None,
    notes: Sequence[str] = (),
    constraints: Sequence[str] = (),
    neighbours: str = NEIGHBOURS,
    **diagnoser_params: Any,
) -> DiagnosisReport:
    """Diagnose a signature already computed: retrieve from ``kb`` (None: cold, priors only), then run the backend.

    ``rules`` None: the KB's accepted rules that match (:func:`matching_rules`); pass ``()`` for none.
    ``neighbours``: ``patients`` retrieves the ``k`` most similar distinct past failures with their
    attempts (:mod:`remedy.retrieval.neighbours`), ``cases`` the ``k`` most similar cases.
    """
    if neighbours not in _NEIGHBOURS:
        raise ValueError(f"unknown neighbours {neighbours!r}; use one of {', '.join(_NEIGHBOURS)}")
    if rules is None:
        rules = matching_rules(kb, subject, signature)
    cases: list[RetrievedCase] = []
    notes = list(notes)
    backend = _resolve(diagnoser, diagnoser_params, kb)
    if kb is not None and k > 0:
        retriever: CaseRetriever = KBRetriever(kb)
        wanted = _retrieval_k(k, backend)
        cases = retriever.similar(
            signature,
            pool_size(wanted) if neighbours == "patients" else wanted,
            action_space=subject.traits.action_space.value,
            exclude_scenario=exclude_scenario,
            exclude_ids=exclude_ids,
        )
        if neighbours == "patients":  # k distinct past failures with their attempts, not k cases
            cases = by_patient(cases, wanted)
    ctx = DiagnosisContext(
        subject=subject,
        signature=signature,
        failure_episodes=tuple(episodes),
        reward_code=reward_code,
        cases=tuple(cases),
        rules=tuple(rules),
        tried=tuple(tried),
        constraints=tuple(constraints),
        notes=tuple(notes),
    )
    # budgets from experience: the neighbours retrieved above also say how much fine-tuning fixed them
    return size_candidates(backend.diagnose(ctx), cases, subject, ctx.tried)


def diagnose_run(
    kb: KnowledgeBase | None,
    run_dir: str | Path | RunDir,
    *,
    diagnoser: str | Diagnoser = "offline",
    k: int = 10,
    n_episodes: int = 20,
    seed: int = 0,
    exclude_scenario: str | None = None,
    exclude_ids: Iterable[str] = (),
    tried: Sequence[Attempt] = (),
    rules: Sequence[RuleLike] | None = None,
    rollouts: RolloutCache | None = None,
    **diagnoser_params: Any,
) -> DiagnosisReport:
    """Roll out the run's agent, compute its signature, and diagnose it against ``kb``.

    ``rules`` None: the KB's accepted rules that match; ``()``: none. ``rollouts`` (a session's
    cache, as in the fix loop) reuses rollouts already computed at the same seeds.
    """
    run = run_dir if isinstance(run_dir, RunDir) else RunDir.load(run_dir)
    subject = run.subject()
    bundle = collect_evidence(run, n_episodes=n_episodes, seed=seed, cache=rollouts)
    signature = compute_signature(bundle, subject)
    return diagnose_signature(
        kb,
        subject,
        signature,
        diagnoser=diagnoser,
        k=k,
        exclude_scenario=exclude_scenario,
        exclude_ids=exclude_ids,
        tried=tried,
        rules=rules,
        episodes=failure_episodes(bundle),
        reward_code=reward_text(run),
        notes=tuple(bundle.notes),
        constraints=tuple(c.expr for c in run.config.constraints),
        **diagnoser_params,
    )


def diagnose_description(
    kb: KnowledgeBase | None,
    text: str,
    *,
    env_id: str | None = None,
    algo: str | None = None,
    action_space: str | None = None,
    tags: str | Sequence[str] | None = None,
    diagnoser: str | Diagnoser = "offline",
    k: int = 10,
    reader: SymptomReader | None = None,
    exclude_ids: Iterable[str] = (),
    rules: Sequence[RuleLike] | None = None,
    stated: Sequence[CauseReading] | None = None,
    rerank: float | None = None,
    ranker: CauseRanker | None = None,
    **diagnoser_params: Any,
) -> DiagnosisReport:
    """Diagnose a failure described in words (no run directory): the same report as :func:`diagnose_run`.

    The text is read as symptom tags (``tags`` overrides the reading), the subject is what the
    user named (``env_id``, ``algo``, ``action_space``; unknowns stay unspecified), the nearest
    cases are retrieved by the text itself, and the chosen backend votes as for a measured
    signature. ``report.reading`` says which tags the text was read as, with their similarity, and
    ``report.stated`` which root causes it states outright (read with the tags; none when ``tags``
    overrides the reading, unless ``stated`` is given). ``rerank`` > 0 reranks retrieved cases by
    their best clause-to-clause match with the text (the weight of that match; default
    ``DEFAULT_RERANK_WEIGHT``, which is 0: off, it did not help on the dev split). A fitted
    ``ranker`` (:mod:`remedy.retrieval.cause_ranker`) reorders the offline vote's causes; None, the
    default, keeps the vote's own order (the ranker did not beat it in leave-one-out on dev).
    """
    from remedy.retrieval.describe import (
        DEFAULT_RERANK_WEIGHT,
        SymptomReader,
        parse_tags,
        rerank_by_clauses,
        text_signature,
        text_subject,
    )

    if tags is not None:
        reading = [SymptomReading(tag=t, clause="set by the user") for t in parse_tags(tags)]
    else:
        text_signature(text, ())  # an empty description fails here, before the embedder loads
        reader = reader or SymptomReader()
        reading = reader.read(text)
        stated = reader.read_causes(text) if stated is None else stated
    names = [r.tag for r in reading]
    subject, notes = text_subject(env_id, algo, action_space, names)
    signature = text_signature(text, names)
    if rules is None:
        rules = matching_rules(kb, subject, signature)
    if not names:
        notes.append(
            "no symptom tag was read off the description (pass --tags to set them); "
            "the diagnosis rests on similar cases only"
        )
    cases: list[RetrievedCase] = []
    backend = _resolve(diagnoser, diagnoser_params, kb)
    if kb is not None and k > 0:
        # the action space filters retrieval only when the user said it (or named an env or algo that fixes it)
        space = subject.traits.action_space.value if action_space or env_id or _fixes_space(subject.algo) else None
        cases = KBRetriever(kb).similar(
            signature, _retrieval_k(k, backend), action_space=space, exclude_ids=exclude_ids
        )
        weight = DEFAULT_RERANK_WEIGHT if rerank is None else rerank
        cases = rerank_by_clauses(kb.embedder, text, cases, weight) if weight > 0 else cases
    ctx = DiagnosisContext(
        subject=subject,
        signature=signature,
        cases=tuple(cases),
        rules=tuple(rules),
        notes=tuple(notes),
        description=signature.summary,
        reading=tuple(reading),
        stated=tuple(stated or ()),
    )
    report = backend.diagnose(ctx).model_copy(update={"reading": list(reading), "stated": list(stated or ())})
    return _rank_causes(report, ranker, backend, kb, text)


def _rank_causes(report: DiagnosisReport, ranker: Any, backend: Any, kb: Any, text: str) -> DiagnosisReport:
    """The offline vote's causes reordered by a fitted cause ranker (other backends rank their own)."""
    if ranker is None or getattr(backend, "name", "") != "offline":
        return report
    from remedy.retrieval.cause_ranker import evidence_from_report, rerank_report
    from remedy.retrieval.embedder import default_embedder

    embedder = kb.embedder if kb is not None else default_embedder()
    return rerank_report(report, ranker, evidence_from_report(report, embedder, text))


def _fixes_space(algo: str) -> bool:
    from remedy.retrieval.describe import algo_fixes_action_space

    return algo_fixes_action_space(algo)
