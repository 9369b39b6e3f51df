"""The demo (``remedy demo``, ``make demo``): the whole loop on the quick fault scenarios, end to end.

On a fresh KB (the bundled example cases loaded first) each quick scenario's
shipped patient is diagnosed, its top candidates verified against a same-budget
control, every attempt stored, and the KB then queried with one scenario's
signature. Budgets are sized so the result means something on a 2-core machine
in under ten minutes (:class:`DemoSettings`); tests shrink them.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from remedy.cases.errors import KBPathError
from remedy.cases.verify.scenarios import Scenario, build, load_scenarios
from remedy.cases.verify.verification import VerifyConfig

from .facade import DB_FILE, KnowledgeBase, SimilarCase
from .fixloop import FixResult, fix, one_torch_thread

__all__ = ["DemoSettings", "DemoRow", "DemoResult", "DemoProgress", "run_demo", "demo_scenarios"]

#: ``progress(scenario, message, done, total)``; scenario "" for the demo's own stages.
DemoProgress = Callable[[str, str, int, int], None]


@dataclass(frozen=True)
class DemoSettings:
    """How much the demo spends. The defaults are what ``make demo`` runs."""

    scenarios: str | None = None  # name glob; None: the quick subset
    rounds: int = 2
    candidates: int = 1
    # Eight training seeds per arm, not three: the quick fixes help most seeds but not all
    # (acrobot +10k steps: per-seed success 0 to 1), and at 3 seeds one weak seed widens the
    # Welch interval (t at 2 df = 4.3) past zero, so every confirmation came out no_effect.
    # More seeds is more evidence, never a looser test; the quick fine-tunes are cheap enough.
    seeds: int = 8
    eval_episodes: int | None = None  # None: each scenario's own
    budget: int | None = None  # None: each scenario's own fine-tune budget
    n_envs: int = 8
    diagnose_episodes: int = 10
    query_k: int = 5

    def verify_config(self, s: Scenario) -> VerifyConfig:
        """Verification settings for ``s``."""
        budget = self.budget if self.budget is not None else s.budget
        return VerifyConfig(
            seeds=self.seeds,
            budget_steps=budget,
            eval_episodes=self.eval_episodes or s.eval_episodes,
            n_envs=self.n_envs,
        )


@dataclass(frozen=True)
class DemoRow:
    """One scenario's outcome for the summary table."""

    scenario: str
    diagnosis: list[str]
    ground_truth: list[str]
    result: FixResult


@dataclass(frozen=True)
class DemoResult:
    """Everything the demo did and wrote."""

    kb_path: Path
    examples_loaded: int
    rows: list[DemoRow]
    query_scenario: str | None
    similar: list[SimilarCase]
    written: list[Path]
    wall_time_s: float
    cases_stored: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def any_improved(self) -> bool:
        """True when at least one scenario ended with a fix verified ``improved``."""
        return any(r.result.improved for r in self.rows)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary (what the demo writes to ``<kb>/demo-summary.json``)."""
        return {
            "kb": str(self.kb_path),
            "examples_loaded": self.examples_loaded,
            "cases_stored": self.cases_stored,
            "wall_time_s": round(self.wall_time_s, 1),
            "any_improved": self.any_improved,
            "scenarios": [
                {"scenario": r.scenario, "ground_truth": r.ground_truth, "diagnosis": r.diagnosis, **r.result.as_dict()}
                for r in self.rows
            ],
            "query_scenario": self.query_scenario,
            "similar": [h.as_dict() for h in self.similar],
            "written": [str(p) for p in self.written],
            "notes": self.notes,
        }


def demo_scenarios(pattern: str | None = None) -> list[Scenario]:
    """The demo's scenarios: those matching ``pattern``, else the quick default subset."""
    chosen = load_scenarios(pattern)
    return chosen if pattern is not None else [s for s in chosen if s.quick]


def _fresh_kb(path: Path) -> None:
    """Remove the KB at ``path`` — only when it is one (or an empty folder), never any other directory."""
    if not path.exists():
        return
    if not path.is_dir():
        raise KBPathError(f"{path} is a file, not a KB directory; pass --kb DIR")
    if (path / DB_FILE).exists() or not any(path.iterdir()):
        shutil.rmtree(path)
        return
    raise KBPathError(f"{path} exists and is not a Remedy KB; refusing to delete it (pass another --kb, or --keep)")


def run_demo(
    kb_path: str | Path = ".remedy",
    *,
    fresh: bool = True,
    settings: DemoSettings = DemoSettings(),
    progress: DemoProgress | None = None,
    cache_dir: str | Path | None = None,
) -> DemoResult:
    """Fresh KB + examples → fix loop on each quick scenario → query; writes ``<kb>/demo-summary.json``."""
    t0, kb_path = time.perf_counter(), Path(kb_path)
    say = progress or (lambda *_: None)
    one_torch_thread()
    if fresh:
        _fresh_kb(kb_path)
    rows: list[DemoRow] = []
    with KnowledgeBase.open(kb_path, create=True) as kb:
        say("", "loading the example cases", 0, 0)
        examples = sum(r.added for r in kb.load_examples())
        for s in demo_scenarios(settings.scenarios):
            rows.append(_one(kb, s, settings, say, cache_dir))
        query, similar = _query(kb, rows, settings.query_k)
        stored = kb.count()
    written = [kb_path / DB_FILE] + [r.result.patch_path for r in rows if r.result.patch_path is not None]
    result = DemoResult(
        kb_path=kb_path,
        examples_loaded=examples,
        rows=rows,
        query_scenario=query,
        similar=similar,
        written=written,
        wall_time_s=time.perf_counter() - t0,
        cases_stored=stored,
    )
    summary = kb_path / "demo-summary.json"
    summary.write_text(json.dumps(result.as_dict(), indent=2, default=str) + "\n")
    return replace(result, written=[*written, summary])


def _one(kb: KnowledgeBase, s: Scenario, settings: DemoSettings, say: DemoProgress, cache_dir: Any) -> DemoRow:
    say(s.name, "building the patient", 0, 0)
    run = build(s, cache_dir=cache_dir)
    res = fix(
        kb,
        run,
        store=kb,
        config=settings.verify_config(s),
        rounds=settings.rounds,
        candidates=settings.candidates,
        scenario=s,
        out_dir=kb.root / "fixes",
        n_episodes=settings.diagnose_episodes,
        progress=lambda msg, d, t: say(s.name, msg, d, t),
    )
    first = res.first_diagnosis
    causes = [c.cause.value for c in first.diagnosis.causes] if first is not None else []
    return DemoRow(scenario=s.name, diagnosis=causes, ground_truth=[g.value for g in s.ground_truth], result=res)


def _query(kb: KnowledgeBase, rows: list[DemoRow], k: int) -> tuple[str | None, list[SimilarCase]]:
    """Similar cases for the signature of the first scenario that was fixed (else the first one)."""
    pick = next((r for r in rows if r.result.improved), rows[0] if rows else None)
    if pick is None or pick.result.first_diagnosis is None:
        return None, []
    return pick.scenario, kb.similar(pick.result.first_diagnosis.signature, k=k)
