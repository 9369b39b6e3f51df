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
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from remedy.cases.errors import RemedyError, VerificationError
from remedy.cases.evidence.rundir import RunDir
from remedy.cases.model import Case, Provenance, Source, Stage, Status, Verification, new_case_id
from remedy.cases.patches.io import save_patch
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
from remedy.retrieval.diagnosis import CandidatePatch, Diagnoser, DiagnosisReport

from .attempts import AttemptRecord, AttemptStore, FixResult, stored_case
from .diagnose import diagnose_run
from .facade import KnowledgeBase
from .fix_state import CONFIRMATIONS, FixProgress, LoopState, chosen_tags, fresh_candidates, how_chosen
from .fixed_agent import write_fixed_agent

#: shared control arms live in this folder of the KB (cases.verify.controls)
CONTROLS_DIR = "controls"

# the records live in .attempts; the loop's callers import them from here with fix()
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


def one_torch_thread() -> None:
    """Run this process's rollouts on one torch thread.

    Evidence rollouts push one observation at a time through a tiny MLP: a second
    thread buys nothing, and on a shared 2-core machine the threads' spin-waits made
    each rollout several times slower. Entry points (CLI, bench, demo) call this.
    """
    import torch

    torch.set_num_threads(1)


def _failed_case(loop: LoopState, cand: CandidatePatch, report: DiagnosisReport, err: Exception) -> Case:
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
    loop: LoopState,
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


def _record(loop: LoopState, rnd: int, cand: CandidatePatch, report: DiagnosisReport, case: Case) -> AttemptRecord:
    parent = loop.cases[-1].case_id if loop.cases else None
    case = stored_case(case, report, source=loop.source, parent_id=parent, scenario=loop.scenario_name)
    chosen = how_chosen(loop, report, cand)
    case = case.model_copy(update={"tags": [*case.tags, *chosen_tags(chosen)]})
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


def with_control_cache(config: VerifyConfig, *bases: object) -> VerifyConfig:
    """``config`` sharing control arms under ``<KB>/controls`` of the first KB in ``bases`` (unless it names a cache)."""
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
    loop = LoopState(
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
    loop: LoopState,
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
        chosen = fresh_candidates(report, loop, k_cands, rnd)
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


def _full_choice(loop: LoopState, cand: CandidatePatch) -> BudgetChoice:
    """The fine-tuning budget per arm of ``cand``'s full screen and its source: the user's budget, else the
    one its diagnosis learned from the KB, else the scenario's or the default (as its screen chooses it)."""
    declared = declared_budget(loop.run, loop.scenario)
    return choose_budget(loop.config, loop.run.config.train_steps, declared, cand.budget)


def _full_budget(loop: LoopState, cand: CandidatePatch) -> int:
    """What a race's stage 1 takes a share of: the screen's budget per arm, or a budget-only patch's extra steps."""
    return racing.full_budget(cand.patch, _full_choice(loop, cand).steps)


def _race(
    loop: LoopState, rnd: int, rounds: int, chosen: list[CandidatePatch], report: DiagnosisReport
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
    loop: LoopState, rnd: int, rounds: int, i: int, n: int, cand: CandidatePatch, report: DiagnosisReport, arms: Path
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
    loop: LoopState, rnd: int, report: DiagnosisReport, rest: list[tuple[CandidatePatch, _StageOne | None]]
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
    loop: LoopState,
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


def _keep_agents(loop: LoopState, rec: AttemptRecord, arms: Path) -> None:
    """Keep an improved confirmation's treatment agents (one may be handed back); drop everything else now."""
    if not rec.improved:
        shutil.rmtree(arms, ignore_errors=True)
        return
    for control in arms.glob("control-*"):
        shutil.rmtree(control, ignore_errors=True)
    loop.kept[rec.case_id] = arms


def _resume(loop: LoopState, stage_one: _StageOne | None) -> Resume | None:
    """Where a survivor's screen goes on from (its stage-1 runs), or None: not raced, resuming off, or nothing kept."""
    if stage_one is None or not loop.race.resume:
        return None
    return racing.resume_from(stage_one[0], stage_one[2], loop.config.control_cache)


def _budget_text(loop: LoopState, cand: CandidatePatch) -> str:
    """Where this candidate's fine-tuning budget comes from, for the progress line."""
    if cand.patch.budget_only:
        return "its own extra steps (more training vs none)"
    if loop.config.budget_steps is not None:
        return f"the user's budget ({loop.config.budget_steps:,} steps)"
    if cand.budget is not None:
        return f"a budget from the KB ({cand.budget.steps:,} steps: {cand.budget.text()})"
    return "the default budget"


def _patch_path(loop: LoopState, winner: AttemptRecord, out_dir: str | Path | None) -> Path:
    base = Path(out_dir) if out_dir is not None else Path("remedy-fixes")
    name = loop.scenario_name or Path(loop.run.path).resolve().name
    path = base / f"{name}-{winner.family}-{winner.case_id}.yaml"
    save_patch(winner.patch, path)
    return path


def _fixed_agent(loop: LoopState, winner: AttemptRecord, out: Path) -> Path | None:
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


def _result(loop: LoopState, stop: str, out_dir: str | Path | None) -> FixResult:
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
