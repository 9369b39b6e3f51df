"""The state of one fix loop, and how it picks the candidates of a round (the top of the diagnosis, with a
seeded share of slots given to lower-ranked candidates when it explores). The loop is :func:`remedy.kb.fixloop.fix`.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from remedy.cases.evidence.rollcache import RolloutCache
from remedy.cases.evidence.rundir import RunDir
from remedy.cases.model import Case, Source
from remedy.cases.verify.executors import Executor
from remedy.cases.verify.racing import RaceSettings
from remedy.cases.verify.verification import ScenarioLike, VerifyConfig
from remedy.retrieval.diagnosis import Attempt, CandidatePatch, DiagnosisReport

from .attempts import AttemptRecord, AttemptStore

if TYPE_CHECKING:
    from .facade import KnowledgeBase

__all__ = ["CONFIRMATIONS", "Chosen", "FixProgress", "LoopState", "fresh_candidates", "chosen_tags", "how_chosen"]


class Chosen(TypedDict):
    """How a candidate was chosen: ``diagnosis`` or ``exploration``, its rank (1 = top) and score in the diagnosis."""

    chosen_by: str
    rank: int | None
    score: float | None


#: confirmations a fix loop may run by default: 2 × 2.5% one-sided bounds its false-fix chance by 5% at 95%
CONFIRMATIONS = 2


#: ``progress(message, done, total)``: each stage and each verification job as it finishes.
FixProgress = Callable[[str, int, int], None]


@dataclass
class LoopState:
    """State of one fix loop (what :func:`remedy.kb.fixloop.fix` builds and its steps share)."""

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


def fresh_candidates(report: DiagnosisReport, loop: LoopState, k: int, rnd: int = 1) -> list[CandidatePatch]:
    """The top ``k`` candidates whose patch this loop has not verified yet; with ``loop.explore`` a seeded share
    of the slots goes to a random lower-ranked fresh candidate instead (recorded as chosen by exploration)."""
    seen = {c.patch.model_dump_json() for c in loop.cases}
    fresh = [c for c in report.candidates if c.patch.model_dump_json() not in seen]
    chosen, rest = fresh[:k], fresh[k:]
    if loop.explore <= 0 or not rest:
        return chosen
    rng = random.Random(f"{loop.explore_seed}:{loop.run.path}:{rnd}")  # same run, same round: same choice
    for slot in range(len(chosen)):
        if rest and rng.random() < loop.explore:
            pick = rest.pop(rng.randrange(len(rest)))
            loop.explored.add(pick.patch.model_dump_json())
            chosen[slot] = pick
    return chosen


def chosen_tags(chosen: Chosen) -> list[str]:
    """How the candidate was chosen, as case tags (``chosen:diagnosis``/``chosen:exploration``, ``rank:N``,
    ``score:X``), so an export keeps it beside the outcome."""
    tags = [f"chosen:{chosen['chosen_by']}"]
    if chosen["rank"] is not None:
        tags.append(f"rank:{chosen['rank']}")
    if chosen["score"] is not None:
        tags.append(f"score:{chosen['score']:.4g}")
    return tags


def how_chosen(loop: LoopState, report: DiagnosisReport, cand: CandidatePatch) -> Chosen:
    """The candidate's rank (1 = top) and score in the diagnosis that proposed it, and whether exploration chose it."""
    key = cand.patch.model_dump_json()
    ranks = [i for i, c in enumerate(report.candidates, start=1) if c.patch.model_dump_json() == key]
    return {
        "chosen_by": "exploration" if key in loop.explored else "diagnosis",
        "rank": ranks[0] if ranks else None,
        "score": cand.score,
    }
