"""The fix loop: diagnose → screen the top candidates → confirm → store every attempt → diagnose again.

Each round diagnoses the run (with what earlier rounds tried and what happened),
screens the top ``candidates`` patches not tried yet one after another, and
stores every attempt as a case — refused, crashed and useless patches too, since
a patch that did nothing is knowledge. A candidate whose screen clears is
re-verified once on fresh training seeds (a confirmation, stored as its own case
linked to the screen); only a confirmation can be ``improved``, and at most
``confirmations`` are run per loop, so the chance that the loop reports a false
fix is at most ``confirmations × (1 − confidence) / 2`` (5% with the defaults;
see :mod:`remedy.cases.verify.stats`). The loop stops at the first confirmed
fix that makes the agent work (``fixed``, :mod:`remedy.cases.verify.fixed`; an
``improved`` confirmation that leaves it failing does not stop it) unless
``exhaustive`` (then every screen that clears is confirmed, within the cap, and a
fix that works, then the largest CONFIRMED effect, wins); the winning patch is
written as a YAML file the user can apply with ``remedy verify --patch``.

With racing (on by default; :mod:`remedy.cases.verify.racing`) every round first runs stage 1:
each candidate on a third of its budget (a budget-only patch: a third of its extra steps) and two
seeds; those that show no gain (difference ≤ 0) or cannot win are stored as ``stopped_early`` and
the others go on to the full screen. Stage 1 never yields ``improved`` and only selects before the
confirmation, whose seeds and episodes it never touched, so the bound above holds as it is.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from remedy.cases.errors import RemedyError, VerificationError
from remedy.cases.evidence.rollcache import RolloutCache, RolloutSavings
from remedy.cases.evidence.rundir import RunDir
from remedy.cases.model import Case, Effect, Provenance, RaceStage, Source, Stage, Status, Verification, new_case_id
from remedy.cases.patches.io import save_patch
from remedy.cases.patches.spec import Patch
from remedy.cases.verify import racing
from remedy.cases.verify.budgets import BudgetChoice, choose_budget
from remedy.cases.verify.executors import Executor, get_executor
from remedy.cases.verify.racing import RaceSettings
from remedy.cases.verify.verification import (
    Resume,
    ScenarioLike,
    VerifyConfig,
    declared_budget,
    verify_patch,
    versions,
)
from remedy.retrieval.diagnosis import Attempt, CandidatePatch, Diagnoser, DiagnosisReport

from .diagnose import diagnose_run
from .fixed_agent import write_fixed_agent

#: shared control arms live in this folder of the KB (cases.verify.controls)
CONTROLS_DIR = "controls"

if TYPE_CHECKING:
    from .facade import KnowledgeBase

__all__ = [
    "AttemptRecord",
    "AttemptStore",
    "FixResult",
    "FixProgress",
    "fix",
    "stored_case",
    "one_torch_thread",
    "CONFIRMATIONS",
]

#: confirmations a fix loop may run by default: 2 × 2.5% one-sided bounds its false-fix chance by 5% at 95%
CONFIRMATIONS = 2

#: ``progress(message, done, total)``: each stage and each verification job as it finishes.
FixProgress = Callable[[str, int, int], None]


class AttemptStore(Protocol):
    """Where the fix loop stores its attempts: the KB facade, or a benchmark's in-memory collector."""

    def add(self, case: Case) -> bool:
        """Store ``case``; True when it was new."""
        ...


def one_torch_thread() -> None:
    """Run this process's rollouts on one torch thread.

    Evidence rollouts push one observation at a time through a tiny MLP: a second
    thread buys nothing, and on a shared 2-core machine the threads' spin-waits made
    each rollout several times slower. Entry points (CLI, bench, demo) call this.
    """
    import torch

    torch.set_num_threads(1)


@dataclass(frozen=True)
class AttemptRecord:
    """One verified (or refused) candidate: where it came from, what it did, where it is stored."""

    round: int
    case_id: str
    patch: Patch
    family: str
    status: str
    effect: Effect | None
    env_steps: int
    wall_time_s: float
    reason: str = ""
    parent_id: str | None = None
    stage: str = Stage.screen.value
    passed_screen: bool = False
    confirms: str | None = None  # on a confirmation: the screen's case id
    budget_steps: int = 0  # fine-tuning env steps per arm it was verified at
    budget_source: str | None = None  # user | kb | scenario | prior | patch (Verification.budget_source)
    budget_cases: tuple[str, ...] = ()  # the confirmed fixes a kb budget was learned from
    race: RaceStage | None = None  # stage 1 of a race, when this candidate ran one
    #: the agent now works (:mod:`remedy.cases.verify.fixed`); None: not judged
    fixed: bool | None = None
    gap_closed: float | None = None  # share of the patient's gap to its success threshold the treatment closed
    #: how the candidate was chosen: its rank in the diagnosis (1 = top) and score, or "exploration"
    chosen_by: str = "diagnosis"
    rank: int | None = None
    score: float | None = None

    @property
    def improved(self) -> bool:
        """True when a confirmation on fresh seeds found the task metric clearly better than the control."""
        return self.status == Status.improved.value and self.stage == Stage.confirm.value

    @property
    def works(self) -> bool:
        """True when the confirmation is ``improved`` AND the agent now works (``fixed``; stops the loop)."""
        return self.improved and bool(self.fixed)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary (the patch as its parts)."""
        e = self.effect
        return {
            "round": self.round,
            "case_id": self.case_id,
            "parent_id": self.parent_id,
            "family": self.family,
            "patch": self.patch.summary(),
            "patch_parts": [p.model_dump(mode="json") for p in self.patch.parts],
            "status": self.status,
            "stage": self.stage,
            "passed_screen": self.passed_screen,
            "confirms": self.confirms,
            "env_steps": self.env_steps,
            "wall_time_s": round(self.wall_time_s, 2),
            "budget_steps": self.budget_steps,
            "budget_source": self.budget_source,
            "budget_cases": list(self.budget_cases),
            "effect": None
            if e is None
            else {
                "metric": e.metric,
                "diff": e.diff,
                "ci_low": e.ci_low,
                "ci_high": e.ci_high,
                "treatment": e.treatment,
                "control": e.control,
            },
            "reason": self.reason,
            "race": None if self.race is None else self.race.model_dump(mode="json"),
            "fixed": self.fixed,
            "gap_closed": self.gap_closed,
            "chosen_by": self.chosen_by,
            "rank": self.rank,
            "score": self.score,
        }


@dataclass(frozen=True)
class FixResult:
    """What a fix loop tried, what won, and what reaching the first verified fix cost."""

    run_dir: Path
    scenario: str | None
    attempts: tuple[AttemptRecord, ...]
    diagnoses: tuple[DiagnosisReport, ...]
    rounds_used: int
    winner: AttemptRecord | None = None
    patch_path: Path | None = None
    #: the winner's fine-tuned agent, written as a run directory (:mod:`remedy.kb.fixed_agent`)
    fixed_dir: Path | None = None
    env_steps_to_fix: int | None = None
    wall_time_to_fix_s: float | None = None
    attempts_to_fix: int | None = None
    total_env_steps: int = 0
    total_wall_time_s: float = 0.0
    stop_reason: str = ""
    warnings: tuple[str, ...] = field(default_factory=tuple)
    #: rollouts of the unmodified checkpoint this loop reused instead of recomputing (evidence, checkpoint controls)
    rollouts: RolloutSavings = field(default_factory=RolloutSavings)
    race: RaceSettings = field(default_factory=RaceSettings)

    @property
    def stopped_early(self) -> int:
        """Candidates dropped at stage 1 of a race (stored ``stopped_early``, no verdict)."""
        return sum(a.status == Status.stopped_early.value for a in self.attempts)

    @property
    def improved(self) -> bool:
        """True when some candidate was confirmed ``improved`` on fresh seeds (the agent may still fail)."""
        return self.winner is not None

    @property
    def fixed(self) -> bool:
        """True when the winner is ``fixed``: confirmed improved AND the agent now works (meets the success
        definition or closes the declared share of its gap; :mod:`remedy.cases.verify.fixed`)."""
        return self.winner is not None and self.winner.works

    @property
    def first_diagnosis(self) -> DiagnosisReport | None:
        """The diagnosis of round 1 (what benchmarks score against the ground truth)."""
        return self.diagnoses[0] if self.diagnoses else None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready result (what ``remedy fix --json`` prints)."""
        first = self.first_diagnosis
        return {
            "run_dir": str(self.run_dir),
            "scenario": self.scenario,
            "fixed": self.fixed,
            "improved": self.improved,
            "rounds_used": self.rounds_used,
            "stop_reason": self.stop_reason,
            "first_diagnosis": None
            if first is None
            else {
                "causes": [{"cause": c.cause.value, "confidence": c.confidence} for c in first.diagnosis.causes],
                "cited_cases": list(first.diagnosis.cited_cases),
                "cited_rules": list(first.diagnosis.cited_rules),
            },
            "attempts": [a.as_dict() for a in self.attempts],
            "winner": None if self.winner is None else self.winner.as_dict(),
            "patch_path": None if self.patch_path is None else str(self.patch_path),
            "fixed_dir": None if self.fixed_dir is None else str(self.fixed_dir),
            "attempts_to_fix": self.attempts_to_fix,
            "env_steps_to_fix": self.env_steps_to_fix,
            "wall_time_to_fix_s": None if self.wall_time_to_fix_s is None else round(self.wall_time_to_fix_s, 2),
            "total_env_steps": self.total_env_steps,
            "total_wall_time_s": round(self.total_wall_time_s, 2),
            "warnings": list(self.warnings),
            "rollouts": self.rollouts.as_dict(),
            "race": self.race.as_dict(),
            "stopped_early": self.stopped_early,
        }


@dataclass
class _Loop:
    """State of one fix loop (internal)."""

    kb: KnowledgeBase | None  # retrieval source, or None (cold: priors only)
    store: AttemptStore | None  # where attempts are stored, or None
    run: RunDir
    config: VerifyConfig
    executor: Executor
    scenario: ScenarioLike | None
    source: Source
    progress: FixProgress | None
    started: float = field(default_factory=time.perf_counter)
    attempts: list[AttemptRecord] = field(default_factory=list)
    cases: list[Case] = field(default_factory=list)
    diagnoses: list[DiagnosisReport] = field(default_factory=list)
    steps: int = 0
    fix_at: tuple[int, float, int] | None = None  # (env steps, wall s, attempts) at the first improvement
    max_confirmations: int = CONFIRMATIONS
    confirmations: int = 0
    rollouts: RolloutCache = field(default_factory=RolloutCache)  # one session: the checkpoint rolled out once
    race: RaceSettings = field(default_factory=RaceSettings)
    #: where stage-1 arms are kept for the survivors to go on from (made on first use, removed at the end)
    arms_root: Path | None = None
    #: an improved confirmation's case id -> the folder its trained arms are kept in (for the fixed agent)
    kept: dict[str, Path] = field(default_factory=dict)
    #: share of candidate slots given on purpose to a lower-ranked candidate (counterfactual data), and its seed
    explore: float = 0.0
    explore_seed: int = 0
    explored: set[str] = field(default_factory=set)  # patches (JSON) chosen by exploration

    def arms_dir(self, name: str) -> Path:
        """A folder for one stage-1 candidate's trained arms, under this loop's temporary root."""
        if self.arms_root is None:
            self.arms_root = Path(tempfile.mkdtemp(prefix="remedy-race-"))
        return self.arms_root / name

    def say(self, message: str, done: int = 0, total: int = 0) -> None:
        if self.progress is not None:
            self.progress(message, done, total)

    @property
    def scenario_name(self) -> str | None:
        return self.scenario.name if self.scenario is not None else None

    def tried(self) -> tuple[Attempt, ...]:
        return tuple(Attempt.from_case(c) for c in self.cases)


def stored_case(
    case: Case, report: DiagnosisReport | None, *, source: Source, parent_id: str | None, scenario: str | None
) -> Case:
    """The case as the fix loop stores it: the diagnosis that proposed it, the loop's source, its parent.

    The id is the verifier's id, re-derived when the source or parent differ so that a
    bench attempt never overwrites a user's verified case of the same patch.
    """
    case_id = case.case_id
    if source != case.source or parent_id is not None:
        case_id = new_case_id(case.case_id, source.value, parent_id)
    update: dict[str, Any] = {
        "case_id": case_id,
        "source": source,
        "parent_id": parent_id,
        "scenario": scenario or case.scenario,
    }
    if report is not None:
        update["diagnosis"] = report.diagnosis
        # the program version that proposed the patch, where provenance readers look for it
        update["provenance"] = case.provenance.model_copy(update={"program_version": report.diagnosis.program_version})
    return case.model_copy(update=update)


def _failed_case(loop: _Loop, cand: CandidatePatch, report: DiagnosisReport, err: Exception) -> Case:
    """A ``failed`` case for a candidate whose verification raised instead of returning a case."""
    v = versions()
    reason = f"verification raised {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return Case(
        case_id=new_case_id(
            "fix-failed",
            loop.run.config.model_dump(mode="json"),
            cand.patch.model_dump(mode="json"),
            loop.scenario_name,
        ),
        source=Source.verified,
        subject=loop.run.subject(),
        signature=report.signature,
        patch=cand.patch,
        verification=Verification(status=Status.failed, reason=reason, seeds=loop.config.seeds),
        provenance=Provenance(remedy_version=v.get("remedy", ""), versions=v),
        scenario=loop.scenario_name,
    )


def _verify(
    loop: _Loop,
    cand: CandidatePatch,
    report: DiagnosisReport,
    label: str,
    confirms: AttemptRecord | None = None,
    race: VerifyConfig | None = None,
    arms_dir: Path | None = None,
    resume: Resume | None = None,
) -> Case:
    """Screen one candidate, run stage 1 of a race with the config ``race``, or confirm the screen ``confirms``
    on the next fresh seed block; any exception becomes a ``failed`` case (the loop records it and goes on)."""

    def tick(message: str, done: int, total: int) -> None:
        loop.say(f"{label}: {message}", done, total)

    config, stage = loop.config, Stage.screen
    if race is not None:
        config, stage = race, Stage.race
    if confirms is not None:
        config, stage = loop.config.confirmation(loop.confirmations), Stage.confirm
        loop.confirmations += 1  # counted even if it crashes: its seeds are spent
    try:
        return verify_patch(
            loop.run,
            cand.patch,
            config,
            executor=loop.executor,
            scenario=loop.scenario,
            progress=tick,
            stage=stage,
            confirms=confirms.case_id if confirms else None,
            budget=cand.budget,
            rollouts=loop.rollouts,
            arms_dir=arms_dir,
            resume=resume,
        )
    except Exception as err:
        failed = _failed_case(loop, cand, report, err)
        v = failed.verification
        if v is not None:  # always: _failed_case records one
            v = v.model_copy(
                update={
                    "stage": stage,
                    "confirms": confirms.case_id if confirms else None,
                    "seed_base": config.seed_base,
                    "eval_seed": config.arms_eval_seed,
                }
            )
        return failed.model_copy(update={"case_id": new_case_id(failed.case_id, stage.value), "verification": v})


def _record(loop: _Loop, rnd: int, cand: CandidatePatch, report: DiagnosisReport, case: Case) -> AttemptRecord:
    parent = loop.cases[-1].case_id if loop.cases else None
    case = stored_case(case, report, source=loop.source, parent_id=parent, scenario=loop.scenario_name)
    chosen = _how_chosen(loop, report, cand)
    case = case.model_copy(update={"tags": [*case.tags, *_chosen_tags(chosen)]})
    if loop.store is not None:
        loop.store.add(case)
    loop.cases.append(case)
    v = case.verification
    rec = AttemptRecord(
        round=rnd,
        case_id=case.case_id,
        patch=case.patch,
        family=cand.family.value,
        status=case.status,
        effect=v.effect if v else None,
        env_steps=v.env_steps if v else 0,
        wall_time_s=v.wall_time_s if v else 0.0,
        reason=v.reason if v else "",
        parent_id=parent,
        stage=v.stage.value if v else Stage.screen.value,
        passed_screen=bool(v and v.passed_screen),
        confirms=v.confirms if v else None,
        budget_steps=v.budget_steps if v else 0,
        budget_source=v.budget_source if v else None,
        budget_cases=tuple(v.budget_cases) if v else (),
        race=v.race if v else None,
        fixed=v.fixed if v else None,
        gap_closed=v.gap_closed if v else None,
        **chosen,
    )
    loop.attempts.append(rec)
    loop.steps += rec.env_steps
    if rec.improved and loop.fix_at is None:
        loop.fix_at = (loop.steps, time.perf_counter() - loop.started, len(loop.attempts))
    return rec


def _fresh(report: DiagnosisReport, loop: _Loop, k: int, rnd: int = 1) -> list[CandidatePatch]:
    """The top ``k`` candidates whose patch this loop has not verified yet; with ``loop.explore`` a seeded share
    of the slots goes to a random lower-ranked fresh candidate instead (recorded as chosen by exploration)."""
    seen = {c.patch.model_dump_json() for c in loop.cases}
    fresh = [c for c in report.candidates if c.patch.model_dump_json() not in seen]
    chosen, rest = fresh[:k], fresh[k:]
    if loop.explore <= 0 or not rest:
        return chosen
    import random

    rng = random.Random(f"{loop.explore_seed}:{loop.run.path}:{rnd}")  # same run, same round: same choice
    for slot in range(len(chosen)):
        if rest and rng.random() < loop.explore:
            pick = rest.pop(rng.randrange(len(rest)))
            loop.explored.add(pick.patch.model_dump_json())
            chosen[slot] = pick
    return chosen


def _chosen_tags(chosen: dict[str, Any]) -> list[str]:
    """How the candidate was chosen, as case tags (``chosen:diagnosis``/``chosen:exploration``, ``rank:N``,
    ``score:X``), so an export keeps it beside the outcome."""
    tags = [f"chosen:{chosen['chosen_by']}"]
    if chosen["rank"] is not None:
        tags.append(f"rank:{chosen['rank']}")
    if chosen["score"] is not None:
        tags.append(f"score:{chosen['score']:.4g}")
    return tags


def _how_chosen(loop: _Loop, report: DiagnosisReport, cand: CandidatePatch) -> dict[str, Any]:
    """The candidate's rank (1 = top) and score in the diagnosis that proposed it, and whether exploration chose it."""
    key = cand.patch.model_dump_json()
    ranks = [i for i, c in enumerate(report.candidates, start=1) if c.patch.model_dump_json() == key]
    return {
        "chosen_by": "exploration" if key in loop.explored else "diagnosis",
        "rank": ranks[0] if ranks else None,
        "score": cand.score,
    }


def with_control_cache(config: VerifyConfig, *bases: object) -> VerifyConfig:
    """``config`` sharing control arms under ``<KB>/controls`` of the first KB in ``bases`` (unless it names a cache)."""
    from dataclasses import replace

    from .facade import KnowledgeBase

    if config.control_cache is not None:
        return config
    root = next((b.root for b in bases if isinstance(b, KnowledgeBase)), None)
    return config if root is None else replace(config, control_cache=str(root / CONTROLS_DIR))


def fix(
    kb: KnowledgeBase | None,
    run_dir: str | Path | RunDir,
    *,
    store: AttemptStore | None,
    config: VerifyConfig | None = None,
    executor: Executor | None = None,
    rounds: int = 3,
    candidates: int = 2,
    diagnoser: str | Diagnoser = "offline",
    exhaustive: bool = False,
    scenario: ScenarioLike | None = None,
    progress: FixProgress | None = None,
    out_dir: str | Path | None = None,
    exclude_scenario: str | None = None,
    exclude_ids: Iterable[str] = (),
    source: Source = Source.verified,
    k: int = 10,
    n_episodes: int = 20,
    seed: int = 0,
    confirmations: int = CONFIRMATIONS,
    race: RaceSettings | None = None,
    explore: float = 0.0,
    explore_seed: int = 0,
) -> FixResult:
    """Diagnose, verify the top ``candidates`` patches, store every attempt, repeat up to ``rounds`` times.

    ``kb`` is what retrieval sees (None: an empty KB, built-in priors only); attempts are
    stored in ``store`` (usually the same KB; None: nowhere). ``config`` says how much each
    verification spends (seeds, budget, executor name); ``executor`` (optional) is a running
    executor to reuse, else one is built from ``config.executor`` and shut down at the end.
    ``scenario`` (a Scenario, or a :class:`ScenarioRef` for a name only) names the stored cases
    and supplies shifted-env variants; benchmarks pass its name as ``exclude_scenario`` so
    retrieval never sees the scenario's own cases (and ``exclude_ids``, e.g. example cases that
    mirror it). A screen that clears is confirmed on fresh
    seeds, at most ``confirmations`` times per loop; only a confirmed candidate wins. The
    winning patch is written under ``out_dir`` (default ``./remedy-fixes``). Control arms are
    shared through ``config.control_cache``, by default ``controls/`` beside the KB that stores
    the attempts (or, with no store, the one retrieval reads). Each candidate is verified at the
    budget its diagnosis learned from similar confirmed fixes in the KB (``CandidatePatch.budget``),
    unless ``config.budget_steps`` is set; the case records the source. The checkpoint's rollouts
    (evidence at the same seeds, a budget patch's checkpoint control) are computed once per loop
    (``FixResult.rollouts`` counts what was reused). ``race`` (default: on, a third of the budget
    on two seeds) races the candidates of a round (:mod:`remedy.cases.verify.racing`);
    ``RaceSettings(enabled=False)`` screens every candidate at the full budget. ``explore`` (0..1) gives that
    share of candidate slots, drawn with ``explore_seed``, to a random lower-ranked candidate (the data then holds
    counterfactual negatives, not only the diagnoser's choices); each attempt records how it was chosen.
    The loop stops at the first confirmed fix that makes the agent work (``fixed``); a confirmed improvement that
    leaves it failing is kept (and wins if nothing better comes) while the loop goes on.
    """
    run = run_dir if isinstance(run_dir, RunDir) else RunDir.load(run_dir)
    config = with_control_cache(config or VerifyConfig(), store, kb)
    config.check()
    race = race or RaceSettings()
    race.check()
    if not 0.0 <= explore <= 1.0:
        raise VerificationError(f"the exploration share must be between 0 and 1, not {explore}")
    config.budget_for(run.config.train_steps)  # no budget at all is the user's to fix, not every candidate's failure
    runner = executor or get_executor(config.executor)
    loop = _Loop(
        kb=kb,
        store=store,
        run=run,
        config=config,
        executor=runner,
        scenario=scenario,
        source=source,
        progress=progress,
        max_confirmations=confirmations,
        race=race,
        explore=explore,
        explore_seed=explore_seed,
    )
    try:
        stop = _rounds(
            loop, rounds, candidates, diagnoser, exhaustive, exclude_scenario, tuple(exclude_ids), k, n_episodes, seed
        )
        return _result(loop, stop, out_dir)  # before the kept arms go: the winner's agent is written from them
    finally:
        if executor is None:
            runner.shutdown()
        if loop.arms_root is not None:
            shutil.rmtree(loop.arms_root, ignore_errors=True)


def _rounds(
    loop: _Loop,
    rounds: int,
    k_cands: int,
    diagnoser: str | Diagnoser,
    exhaustive: bool,
    exclude: str | None,
    exclude_ids: tuple[str, ...],
    k: int,
    n_episodes: int,
    seed: int,
) -> str:
    """Run the rounds; returns why the loop stopped."""
    for rnd in range(1, rounds + 1):
        loop.say(f"round {rnd}/{rounds}: diagnosing")
        report = diagnose_run(
            loop.kb,
            loop.run,
            diagnoser=diagnoser,
            k=k,
            n_episodes=n_episodes,
            seed=seed,
            exclude_scenario=exclude,
            exclude_ids=exclude_ids,
            tried=loop.tried(),
            rollouts=loop.rollouts,
        )
        loop.diagnoses.append(report)
        chosen = _fresh(report, loop, k_cands, rnd)
        if not chosen:
            return f"round {rnd}: the diagnosis offered no candidate that was not tried already"
        staged = _race(loop, rnd, rounds, chosen, report)
        for i, (cand, stage_one) in enumerate(staged, start=1):
            if stage_one is not None and not stage_one[1].survived:
                continue  # dropped at stage 1 and stored as such by _race
            label = f"round {rnd}/{rounds}, candidate {i}/{len(chosen)} ({cand.patch.summary()})"
            rec = _screen_then_confirm(loop, rnd, cand, report, label, stage_one)
            if rec is not None and rec.works and not exhaustive:  # improved but still failing: keep looking
                _unscreened(loop, rnd, report, staged[i:])
                return f"round {rnd}: fix confirmed on fresh seeds (the agent now works)"
    if any(a.works for a in loop.attempts):
        return f"{rounds} round(s) done"
    return f"{rounds} round(s) done" + (
        " with a confirmed improvement, but the agent still fails"
        if loop.fix_at
        else " without a confirmed improvement"
    )


#: a raced candidate's stage-1 case, its standing, and the folder its stage-1 arms were kept in
_StageOne = tuple[Case, racing.Standing, Path]


def _full_choice(loop: _Loop, cand: CandidatePatch) -> BudgetChoice:
    """The fine-tuning budget per arm of ``cand``'s full screen and its source: the user's budget, else the
    one its diagnosis learned from the KB, else the scenario's or the default (as its screen chooses it)."""
    declared = declared_budget(loop.run, loop.scenario)
    return choose_budget(loop.config, loop.run.config.train_steps, declared, cand.budget)


def _full_budget(loop: _Loop, cand: CandidatePatch) -> int:
    """What a race's stage 1 takes a share of: the screen's budget per arm, or a budget-only patch's extra steps."""
    return racing.full_budget(cand.patch, _full_choice(loop, cand).steps)


def _race(
    loop: _Loop, rnd: int, rounds: int, chosen: list[CandidatePatch], report: DiagnosisReport
) -> list[tuple[CandidatePatch, _StageOne | None]]:
    """Stage 1 of a race over ``chosen`` (when it applies); stores the dropped candidates as ``stopped_early``.

    Returns every candidate in diagnosis order with its stage-1 case and standing (None: not raced).
    """
    if not loop.race.applies(loop.config, [c.patch for c in chosen]):
        return [(c, None) for c in chosen]
    raced = [c for c in chosen if racing.raceable(c.patch, loop.race.fraction)]
    dirs = [loop.arms_dir(f"round{rnd}-candidate{i}") for i in range(1, len(raced) + 1)]
    cases = [
        _stage_one(loop, rnd, rounds, i, len(raced), cand, report, arms)
        for i, (cand, arms) in enumerate(zip(raced, dirs), start=1)
    ]
    standings = racing.rank_stage_one(
        [c.verification.effect if c.verification else None for c in cases],
        [c.verification.secondary.get("return_iqm") if c.verification else None for c in cases],
        rule=loop.race.drop,
    )
    out: dict[int, _StageOne] = {}
    for cand, case, standing, arms in zip(raced, cases, standings, dirs):
        out[id(cand)] = (case, standing, arms)
        if not standing.survived:
            rec = _record(loop, rnd, cand, report, racing.stopped_early(case, standing, _full_budget(loop, cand)))
            loop.say(f"round {rnd}/{rounds}, stage 1 ({cand.patch.summary()}): {standing.rule}, {rec.status}")
    return [(c, out.get(id(c))) for c in chosen]


def _stage_one(
    loop: _Loop, rnd: int, rounds: int, i: int, n: int, cand: CandidatePatch, report: DiagnosisReport, arms: Path
) -> Case:
    """Stage 1 of one candidate: its share of the full budget (a budget-only patch: of its extra steps) on the
    race seeds, its trained arms kept in ``arms``; the case keeps the candidate's own patch and the full
    budget's source."""
    full = _full_choice(loop, cand)
    stage_cfg = racing.stage_config(loop.config, racing.full_budget(cand.patch, full.steps), loop.race)
    staged = cand.model_copy(update={"patch": racing.stage_patch(cand.patch, loop.race)})
    label = f"round {rnd}/{rounds}, stage 1, candidate {i}/{n} ({cand.patch.summary()})"
    what = staged.patch.summary() if cand.patch.budget_only else f"{stage_cfg.budget_steps:,} env steps per arm"
    loop.say(f"{label}: {what} on {stage_cfg.seeds} seeds")
    case = _verify(loop, staged, report, label, race=stage_cfg, arms_dir=arms if loop.race.resume else None)
    return racing.as_stage_one(case, cand.patch, full)


def _unscreened(
    loop: _Loop, rnd: int, report: DiagnosisReport, rest: list[tuple[CandidatePatch, _StageOne | None]]
) -> None:
    """Store the survivors of stage 1 the loop will not screen (it stopped at a fix): their stage-1 steps
    were spent, so they are cases too, ``stopped_early`` with the evidence they reached."""
    for cand, stage_one in rest:
        if stage_one is None or not stage_one[1].survived:
            continue
        case, standing, _ = stage_one
        why = replace(standing, rule=f"{standing.rule}; survived stage 1, but the loop stopped at a confirmed fix")
        _record(loop, rnd, cand, report, racing.stopped_early(case, why, _full_budget(loop, cand)))


def _screen_then_confirm(
    loop: _Loop,
    rnd: int,
    cand: CandidatePatch,
    report: DiagnosisReport,
    label: str,
    stage_one: _StageOne | None = None,
) -> AttemptRecord | None:
    """Screen one candidate (carrying its stage-1 evidence, if it raced) and, if it clears and the cap allows,
    confirm it; the confirmation's record (or None)."""
    resume = _resume(loop, stage_one)
    went_on = f", going on from stage 1 on {len(resume.starts)} seed(s)" if resume is not None else ""
    loop.say(f"{label}: screening at {_budget_text(loop, cand)}{went_on}")
    screened = _verify(loop, cand, report, label, resume=resume)
    if stage_one is not None:
        screened = racing.with_stage_one(screened, stage_one[0], stage_one[1], _full_budget(loop, cand))
    screen = _record(loop, rnd, cand, report, screened)
    loop.say(f"{label}: screen {'cleared, ' if screen.passed_screen else ''}{screen.status}")
    if not screen.passed_screen:
        return None
    if loop.confirmations >= loop.max_confirmations:
        loop.say(f"{label}: cleared the screen, but the loop's {loop.max_confirmations} confirmation(s) are spent")
        return None
    loop.say(f"{label}: confirming on fresh seeds")
    arms = loop.arms_dir(f"confirm-{loop.confirmations + 1}")  # its agents: the fixed agent, if it wins
    rec = _record(
        loop, rnd, cand, report, _verify(loop, cand, report, f"{label} confirm", confirms=screen, arms_dir=arms)
    )
    _keep_agents(loop, rec, arms)
    loop.say(f"{label}: confirmation {rec.status}")
    return rec


def _keep_agents(loop: _Loop, rec: AttemptRecord, arms: Path) -> None:
    """Keep an improved confirmation's treatment agents (one may be handed back); drop everything else now."""
    if not rec.improved:
        shutil.rmtree(arms, ignore_errors=True)
        return
    for control in arms.glob("control-*"):
        shutil.rmtree(control, ignore_errors=True)
    loop.kept[rec.case_id] = arms


def _resume(loop: _Loop, stage_one: _StageOne | None) -> Resume | None:
    """Where a survivor's screen goes on from (its stage-1 runs), or None: not raced, resuming off, or nothing kept."""
    if stage_one is None or not loop.race.resume:
        return None
    return racing.resume_from(stage_one[0], stage_one[2], loop.config.control_cache)


def _budget_text(loop: _Loop, cand: CandidatePatch) -> str:
    """Where this candidate's fine-tuning budget comes from, for the progress line."""
    if cand.patch.budget_only:
        return "its own extra steps (more training vs none)"
    if loop.config.budget_steps is not None:
        return f"the user's budget ({loop.config.budget_steps:,} steps)"
    if cand.budget is not None:
        return f"a budget from the KB ({cand.budget.steps:,} steps: {cand.budget.text()})"
    return "the default budget"


def _patch_path(loop: _Loop, winner: AttemptRecord, out_dir: str | Path | None) -> Path:
    base = Path(out_dir) if out_dir is not None else Path("remedy-fixes")
    name = loop.scenario_name or Path(loop.run.path).resolve().name
    path = base / f"{name}-{winner.family}-{winner.case_id}.yaml"
    save_patch(winner.patch, path)
    return path


def _fixed_agent(loop: _Loop, winner: AttemptRecord, out: Path) -> Path | None:
    """Write the winner's agent to ``out/fixed/`` (:mod:`remedy.kb.fixed_agent`); None, with a warning, if it cannot."""
    case = next((c for c in loop.cases if c.case_id == winner.case_id), None)
    arms = loop.kept.get(winner.case_id)
    if case is None or arms is None:
        return None
    try:
        cfg = loop.config
        agent = write_fixed_agent(
            loop.run,
            case,
            arms,
            out,
            eval_episodes=cfg.eval_episodes,
            learning_rate=cfg.learning_rate,
            n_envs=cfg.n_envs,
        )
    except (RemedyError, OSError) as err:  # the fix stands (its case and patch are stored); only the copy is lost
        loop.say(f"could not write the fixed agent: {err}")
        return None
    return agent.path


def _result(loop: _Loop, stop: str, out_dir: str | Path | None) -> FixResult:
    improved = [a for a in loop.attempts if a.improved]  # confirmations only
    winner = None
    if improved:  # a fix that makes the agent work first, then the largest confirmed effect
        winner = max(improved, key=lambda a: (a.works, a.effect.diff if a.effect is not None else float("-inf")))
    path = _patch_path(loop, winner, out_dir) if winner is not None else None
    fixed_dir = _fixed_agent(loop, winner, path.parent) if winner is not None and path is not None else None
    fix_at = loop.fix_at or (None, None, None)
    warnings = tuple(w for d in loop.diagnoses for w in d.warnings)
    return FixResult(
        run_dir=Path(loop.run.path),
        scenario=loop.scenario_name,
        attempts=tuple(loop.attempts),
        diagnoses=tuple(loop.diagnoses),
        rounds_used=len(loop.diagnoses),
        winner=winner,
        patch_path=path,
        fixed_dir=fixed_dir,
        env_steps_to_fix=fix_at[0],
        wall_time_to_fix_s=fix_at[1],
        attempts_to_fix=fix_at[2],
        total_env_steps=loop.steps,
        total_wall_time_s=time.perf_counter() - loop.started,
        stop_reason=stop,
        warnings=tuple(dict.fromkeys(warnings)),
        rollouts=loop.rollouts.savings,
        race=loop.race,
    )
