"""`remedy verify` as one library call: screen, confirm when the screen clears, store both cases.

The CLI (local) and the service's verify job both call :func:`verify` with a
:class:`~remedy.kb.settings.VerifySettings`, so a patch verified through
``--server`` is screened and confirmed exactly as it is locally, and both print
:meth:`VerifyOutcome.as_dict` for ``--json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remedy.cases.evidence.rollcache import RolloutCache
from remedy.cases.evidence.rundir import RunDir
from remedy.cases.io import case_to_json
from remedy.cases.model import Case
from remedy.cases.patches.spec import Patch
from remedy.cases.verify.executors import Executor, get_executor
from remedy.cases.verify.verification import VerifyProgress, verify_and_confirm, verify_patch

from .settings import VerifySettings

__all__ = ["VerifyOutcome", "verify", "StoreFn"]

#: stores one case; True when it was new (``KnowledgeBase.add``, or a function that opens the KB for it)
StoreFn = Callable[[Case], bool]


@dataclass(frozen=True)
class VerifyOutcome:
    """The screen, the confirmation (None when the screen did not clear or ``confirm`` was off), what was stored."""

    screen: Case
    confirmation: Case | None
    stored: tuple[bool, ...]
    next_seed_base: int

    @property
    def cases(self) -> list[Case]:
        """The screen, then the confirmation if there is one."""
        return [c for c in (self.screen, self.confirmation) if c is not None]

    @property
    def final(self) -> Case:
        """The case that carries the verdict: the confirmation when there is one, else the screen."""
        return self.confirmation or self.screen

    def as_dict(self) -> dict[str, Any]:
        """What ``remedy verify --json`` prints: the final case at the top level, the screen under ``screen``."""

        def one(case: Case, was_stored: bool) -> dict[str, Any]:
            return {
                "case_id": case.case_id,
                "status": case.status,
                "stored": was_stored,
                "case": json.loads(case_to_json(case)),
            }

        cases = self.cases
        out = one(cases[-1], self.stored[-1])
        out["stage"] = _stage(cases[-1])
        out["screen"] = one(cases[0], self.stored[0]) if len(cases) > 1 else None
        out["next_seed_base"] = self.next_seed_base
        return out


def _stage(case: Case) -> str:
    if case.verification is None:
        raise ValueError(f"case {case.case_id} carries no verification")
    return case.verification.stage.value


def verify(
    run_dir: str | Path | RunDir,
    patch: Patch,
    settings: VerifySettings,
    *,
    store: StoreFn | None,
    control_cache: str | Path | None = None,
    executor: Executor | None = None,
    progress: VerifyProgress | None = None,
) -> VerifyOutcome:
    """Screen ``patch`` on the run and, unless ``settings.confirm`` is off, confirm a screen that clears on fresh
    seeds; store each case with ``store`` (None: nowhere). ``control_cache`` shares control arms (usually
    ``<KB>/controls``); ``executor`` (optional) is a running executor, else one is built from the settings and
    shut down at the end."""
    config = settings.config(None if control_cache is None else str(control_cache))
    owned = executor is None
    runner = executor or get_executor(settings.executor)
    rollouts = RolloutCache()  # the confirmation's evidence is the screen's: rolled out once
    try:
        if settings.confirm:
            screen, confirmation = verify_and_confirm(
                run_dir, patch, config, executor=runner, progress=progress, rollouts=rollouts
            )
        else:
            screen = verify_patch(run_dir, patch, config, executor=runner, progress=progress, rollouts=rollouts)
            confirmation = None
    finally:
        if owned:
            runner.shutdown()
    cases = [c for c in (screen, confirmation) if c is not None]
    if progress is not None and store is not None:
        progress("storing the case(s)", 0, 0)
    stored = tuple(False if store is None else store(c) for c in cases)
    return VerifyOutcome(screen, confirmation, stored, settings.seed_base + config.seeds_spent(len(cases) - 1))
