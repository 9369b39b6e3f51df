"""What a fix loop produces: one record per verified (or refused) candidate, the loop's result, and the
case as the loop stores it. The loop itself is :func:`remedy.kb.fixloop.fix`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from remedy.cases.evidence.rollcache import RolloutSavings
from remedy.cases.model import Case, Effect, RaceStage, Source, Stage, Status, new_case_id
from remedy.cases.patches.spec import Patch
from remedy.cases.verify.racing import RaceSettings
from remedy.retrieval.diagnosis import DiagnosisReport

__all__ = ["AttemptStore", "AttemptRecord", "FixResult", "stored_case"]


class AttemptStore(Protocol):
    """Where the fix loop stores its attempts: the KB facade, or a benchmark's in-memory collector."""

    def add(self, case: Case) -> bool:
        """Store ``case``; True when it was new."""
        ...


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
