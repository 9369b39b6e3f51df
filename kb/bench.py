"""The benchmark: run the fix loop on every fault scenario and score it; the cold-vs-warm curve.

For each scenario the patient is built (shipped, cached, or trained once) and the
fix loop runs on it with the scenario's own cases excluded from retrieval, so
the diagnosis never sees its answer. Scored per scenario and overall:

- top-1 / top-3 root-cause accuracy of the FIRST diagnosis: the top cause (any
  of the top three) is one of the scenario's ground-truth causes;
- verified-fix rate: the loop found a patch verified ``improved``;
- attempts, env steps and wall time to the first verified fix.

**Honest splits.** Every figure is reported per split (``dev``: priors and weights
may be tuned on it; ``holdout``: never tuned on) next to trivial baselines
(:mod:`remedy.kb.baselines`): the most frequent cause and a fixed top-3 (both
computed on the bundled dev split), and, with ``BenchSettings.baselines``, two
no-diagnosis fixing arms at the same number of verified candidates and the same
budget per candidate (RL Zoo tuned defaults; seeded random search). Fix rates
count only scenarios whose oracle fixes them (``remedy bench build`` records
that in ``bench/data/oracle.jsonl``); unsolvable ones are listed, and fixes that
are only more training are reported apart from the others. Bundled example cases
that mirror a scenario (its declared ``examples_excluded``) are hidden from
retrieval while that scenario is evaluated.

Attempts are stored as cases (source ``bench``, scenario set). Reports are
written as JSON and Markdown under ``reports/bench/`` (a timestamped file plus
``latest.json`` / ``latest.md``). :func:`run_curve` runs the suite cold (an empty
KB) and then warm (a KB holding the cold pass's cases: each scenario sees only
the OTHER scenarios' cases) — the meta-learning curve.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from remedy.cases.errors import ScenarioError
from remedy.cases.model import Case, RootCause, Source
from remedy.cases.verify.executors import Executor
from remedy.cases.verify.racing import RACE_FRACTION, RACE_SEEDS, RaceSettings
from remedy.cases.verify.scenarios import Scenario, build, load_scenarios
from remedy.cases.verify.verification import CONFIRM_SEEDS, SCREEN_CONFIDENCE, VerifyConfig

from .baselines import FIX_BASELINES, BaselineFix, most_frequent_causes, run_fix_baseline, score_constant
from .facade import KnowledgeBase
from .fixloop import AttemptStore, FixResult, fix, one_torch_thread, with_control_cache

__all__ = [
    "CaseCollector",
    "BenchSettings",
    "ScenarioResult",
    "BenchSummary",
    "BenchReport",
    "CurveReport",
    "BenchProgress",
    "SplitSummary",
    "split_summaries",
    "dev_baseline_answer",
    "select_scenarios",
    "lofo_split",
    "lofo_families",
    "score_causes",
    "run_bench",
    "run_curve",
    "summarize",
    "DEFAULT_REPORT_DIR",
]

DEFAULT_REPORT_DIR: Path = Path("reports") / "bench"

#: ``progress(scenario, message, done, total)``.
BenchProgress = Callable[[str, str, int, int], None]


@dataclass(frozen=True)
class BenchSettings:
    """How much the bench spends per scenario (``budget`` None: each scenario's own fine-tune budget)."""

    diagnoser: str = "offline"
    rounds: int = 3
    candidates: int = 2
    seeds: int = 3
    confirm_seeds: int = CONFIRM_SEEDS
    screen_confidence: float = SCREEN_CONFIDENCE
    budget: int | None = None
    eval_episodes: int | None = None  # None: the scenario's eval_episodes
    n_envs: int = 8
    executor: str = "local"
    exhaustive: bool = False
    k: int = 10
    diagnose_episodes: int = 20
    baselines: bool = False  # also run the no-diagnosis fixing arms (tuned defaults, random search)
    baseline_seed: int = 0
    oracle_results: str | None = None  # None: bench/data/oracle.jsonl
    race: bool = True  # race each round's candidates (cases.verify.racing)
    race_fraction: float = RACE_FRACTION
    race_seeds: int = RACE_SEEDS
    explore: float = 0.0  # share of candidate slots given to a lower-ranked candidate (the factory's negatives)
    explore_seed: int = 0
    seed_base: int = 0  # first training seed of the screens (another block: another, independent measurement)

    def race_settings(self) -> RaceSettings:
        """How the fix loop races each round's candidates."""
        return RaceSettings(enabled=self.race, fraction=self.race_fraction, seeds=self.race_seeds)

    def verify_config(self, scenario: Scenario) -> VerifyConfig:
        """The verification settings for ``scenario``."""
        # no explicit budget unless the user gave one: verification then takes the scenario's declared
        # budget (or the prior fraction, equal to ``scenario.budget``), or one learned from the KB, and
        # records which (``verification.budget_source``)
        return VerifyConfig(
            seeds=self.seeds,
            confirm_seeds=self.confirm_seeds,
            screen_confidence=self.screen_confidence,
            budget_steps=self.budget,
            eval_episodes=self.eval_episodes or scenario.eval_episodes,
            n_envs=self.n_envs,
            executor=self.executor,
            seed_base=self.seed_base,
        )


@dataclass(frozen=True)
class ScenarioResult:
    """One scenario's score."""

    scenario: str
    env_id: str
    ground_truth: list[str]
    expected_families: list[str]
    first_causes: list[str]
    top1: bool
    top3: bool
    fixed: bool  # a confirmed ``improved`` (the name predates the strict sense below; stored results keep it)
    attempts: int
    attempts_to_fix: int | None
    env_steps_to_fix: int | None
    wall_time_to_fix_s: float | None
    total_env_steps: int
    total_wall_time_s: float
    winning_patch: str | None
    winning_effect: dict[str, float | str] | None  # metric (name), diff, ci_low, ci_high
    cited_cases: list[str]
    case_ids: list[str]
    statuses: list[str]
    error: str = ""
    split: str = "dev"
    solvable: bool | None = None  # the oracle's verdict from `bench build`; None: not checked
    budget_only_fix: bool = False  # the winning patch only added training steps
    baselines: dict[str, dict[str, Any]] | None = None  # arm -> BaselineFix as a dict
    stopped_early: int = 0  # candidates a race dropped at stage 1 (no verdict)
    #: fixed in the strict sense: the confirmed winner makes the agent work (cases.verify.fixed); None: not judged
    works: bool | None = None


@dataclass(frozen=True)
class BenchSummary:
    """Overall figures: accuracies and fix rate over all scenarios; costs over the fixed ones (means)."""

    n: int
    top1_accuracy: float
    top3_accuracy: float
    fix_rate: float
    mean_attempts_to_fix: float | None
    mean_env_steps_to_fix: float | None
    mean_wall_time_to_fix_s: float | None
    total_env_steps: int
    total_wall_time_s: float
    stopped_early: int = 0  # candidates a race dropped at stage 1, over all scenarios
    works_rate: float = 0.0  # share of scenarios whose confirmed winner makes the agent work (strict "fixed")


@dataclass(frozen=True)
class SplitSummary:
    """One split's figures next to its baselines.

    Fix rates are over the ``solvable`` scenarios (oracle verified) plus the unchecked ones;
    ``unsolvable`` (oracle did not fix it, or the patient did not fail) are listed and left out.
    """

    split: str
    n: int
    top1_accuracy: float
    top3_accuracy: float
    baseline_answer: list[str]  # the most frequent dev causes, ranked
    baseline_top1: float  # always answering baseline_answer[0]
    baseline_top3: float  # always answering baseline_answer[:3]
    fix_denominator: int
    unsolvable: list[str]
    unchecked: list[str]
    fix_rate: float
    budget_only_fix_rate: float
    other_fix_rate: float
    baseline_fix_rates: dict[str, float]
    works_rate: float = 0.0  # over the same denominator: the confirmed winner makes the agent work


@dataclass(frozen=True)
class BenchReport:
    """One pass of the suite."""

    label: str  # "kb", "cold" or "warm"
    kb: str | None
    settings: BenchSettings
    scenarios: list[ScenarioResult]
    summary: BenchSummary
    started_at: str
    wall_time_s: float
    splits: list[SplitSummary] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready report."""
        return asdict(self)


@dataclass(frozen=True)
class CurveReport:
    """The same suite cold then warm."""

    cold: BenchReport
    warm: BenchReport

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready report."""
        return {"kind": "curve", "cold": self.cold.as_dict(), "warm": self.warm.as_dict()}


def select_scenarios(pattern: str | None = None, quick: bool = False, split: str = "all") -> list[Scenario]:
    """Bundled scenarios matching ``pattern`` (a name glob, or a YAML path/dir/glob); only quick ones if asked;
    only one split unless ``split`` is ``all``: ``dev`` / ``holdout`` (whole env x family cells), or a
    leave-one-family-out split: ``lofo:<family>`` (that fault family only: the held-out test) and
    ``lofo-train:<family>`` (every other family: what may be trained on)."""
    scenarios = [s for s in load_scenarios(pattern) if s.quick or not quick]
    kind, _, family = split.partition(":")
    if kind in ("lofo", "lofo-train"):
        return lofo_split(scenarios, family, train=kind == "lofo-train")
    if split not in ("all", "dev", "holdout"):
        raise ScenarioError(f"unknown split '{split}'; use dev, holdout, all, lofo:<family> or lofo-train:<family>")
    return [s for s in scenarios if split in ("all", s.split)]


def lofo_families(scenarios: Sequence[Scenario]) -> list[str]:
    """The fault families of ``scenarios``, sorted (a scenario with no declared family is its own)."""
    return sorted({s.family or s.name for s in scenarios})


def lofo_split(scenarios: Sequence[Scenario], family: str, *, train: bool = False) -> list[Scenario]:
    """Leave one family out: the scenarios of fault ``family`` (dev and holdout alike), or, with ``train``, those
    of every other family, so a whole family is never in training."""
    if family not in lofo_families(scenarios):
        known = ", ".join(lofo_families(scenarios)) or "none"
        raise ScenarioError(f"unknown fault family '{family}' for a lofo split; choose one of: {known}")
    return [s for s in scenarios if ((s.family or s.name) == family) != train]


def score_causes(causes: Sequence[RootCause | str], ground_truth: Sequence[RootCause | str]) -> tuple[bool, bool]:
    """``(top1, top3)``: the top cause, or any of the top three, is a ground-truth cause."""
    truth = {str(getattr(g, "value", g)) for g in ground_truth}
    ranked = [str(getattr(c, "value", c)) for c in causes]
    return bool(ranked[:1]) and ranked[0] in truth, any(c in truth for c in ranked[:3])


def _mean(values: Sequence[float | int | None]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return statistics.fmean(kept) if kept else None


def summarize(results: Sequence[ScenarioResult]) -> BenchSummary:
    """Overall figures of a pass (scenarios that errored count as not diagnosed right and not fixed)."""
    n = len(results)

    def frac(xs):
        return sum(xs) / n if n else 0.0

    fixed = [r for r in results if r.fixed]
    return BenchSummary(
        n=n,
        top1_accuracy=frac([r.top1 for r in results]),
        top3_accuracy=frac([r.top3 for r in results]),
        fix_rate=frac([r.fixed for r in results]),
        mean_attempts_to_fix=_mean([r.attempts_to_fix for r in fixed]),
        mean_env_steps_to_fix=_mean([r.env_steps_to_fix for r in fixed]),
        mean_wall_time_to_fix_s=_mean([r.wall_time_to_fix_s for r in fixed]),
        total_env_steps=sum(r.total_env_steps for r in results),
        total_wall_time_s=sum(r.total_wall_time_s for r in results),
        stopped_early=sum(r.stopped_early for r in results),
        works_rate=frac([bool(r.works) for r in results]),
    )


def dev_baseline_answer(k: int = 3) -> list[str]:
    """The ``k`` most frequent ground-truth causes over the bundled **dev** scenarios (the diagnosis baselines)."""
    return most_frequent_causes([[g.value for g in s.ground_truth] for s in load_scenarios() if s.split == "dev"], k)


def _split_summary(split: str, rows: Sequence[ScenarioResult], answer: list[str]) -> SplitSummary:
    n = len(rows)

    def frac(xs, d):
        return sum(xs) / d if d else 0.0

    b1, b3 = score_constant(answer, [r.ground_truth for r in rows])
    counted = [r for r in rows if r.solvable is not False]
    arms = sorted({a for r in counted for a in (r.baselines or {})})
    return SplitSummary(
        split=split,
        n=n,
        top1_accuracy=frac([r.top1 for r in rows], n),
        top3_accuracy=frac([r.top3 for r in rows], n),
        baseline_answer=answer,
        baseline_top1=b1,
        baseline_top3=b3,
        fix_denominator=len(counted),
        unsolvable=[r.scenario for r in rows if r.solvable is False],
        unchecked=[r.scenario for r in rows if r.solvable is None],
        fix_rate=frac([r.fixed for r in counted], len(counted)),
        budget_only_fix_rate=frac([r.fixed and r.budget_only_fix for r in counted], len(counted)),
        other_fix_rate=frac([r.fixed and not r.budget_only_fix for r in counted], len(counted)),
        baseline_fix_rates={
            a: frac([bool((r.baselines or {}).get(a, {}).get("fixed")) for r in counted], len(counted)) for a in arms
        },
        works_rate=frac([bool(r.works) for r in counted], len(counted)),
    )


def split_summaries(results: Sequence[ScenarioResult], answer: list[str] | None = None) -> list[SplitSummary]:
    """Per split (dev, then holdout; only splits present) figures with the diagnosis and fixing baselines."""
    answer = dev_baseline_answer() if answer is None else answer
    return [
        _split_summary(sp, [r for r in results if r.split == sp], answer)
        for sp in ("dev", "holdout")
        if any(r.split == sp for r in results)
    ]


def _scenario_result(s: Scenario, res: FixResult) -> ScenarioResult:
    first = res.first_diagnosis
    causes = [c.cause.value for c in first.diagnosis.causes] if first is not None else []
    top1, top3 = score_causes(causes, s.ground_truth)
    w = res.winner
    eff: dict[str, float | str] | None = None
    if w is not None and w.effect is not None:
        eff = {"metric": w.effect.metric, "diff": w.effect.diff, "ci_low": w.effect.ci_low, "ci_high": w.effect.ci_high}
    return ScenarioResult(
        scenario=s.name,
        env_id=s.env_id,
        ground_truth=[g.value for g in s.ground_truth],
        expected_families=[f.value for f in s.expected_families],
        first_causes=causes,
        top1=top1,
        top3=top3,
        fixed=res.improved,
        works=res.fixed,
        attempts=len(res.attempts),
        attempts_to_fix=res.attempts_to_fix,
        env_steps_to_fix=res.env_steps_to_fix,
        wall_time_to_fix_s=None if res.wall_time_to_fix_s is None else round(res.wall_time_to_fix_s, 2),
        total_env_steps=res.total_env_steps,
        total_wall_time_s=round(res.total_wall_time_s, 2),
        winning_patch=None if w is None else w.patch.summary(),
        winning_effect=eff,
        cited_cases=list(first.diagnosis.cited_cases) if first is not None else [],
        case_ids=[a.case_id for a in res.attempts],
        statuses=[a.status for a in res.attempts],
        split=s.split,
        budget_only_fix=w is not None and w.patch.kinds == ["training_budget"],
        stopped_early=res.stopped_early,
    )


def _errored(s: Scenario, err: Exception) -> ScenarioResult:
    return ScenarioResult(
        scenario=s.name,
        env_id=s.env_id,
        ground_truth=[g.value for g in s.ground_truth],
        expected_families=[f.value for f in s.expected_families],
        first_causes=[],
        top1=False,
        top3=False,
        fixed=False,
        attempts=0,
        attempts_to_fix=None,
        env_steps_to_fix=None,
        wall_time_to_fix_s=None,
        total_env_steps=0,
        total_wall_time_s=0.0,
        winning_patch=None,
        winning_effect=None,
        cited_cases=[],
        case_ids=[],
        statuses=[],
        error=f"{type(err).__name__}: {err}",
        split=s.split,
    )


def run_bench(
    kb: KnowledgeBase | None,
    scenarios: Sequence[Scenario],
    settings: BenchSettings = BenchSettings(),
    *,
    store: AttemptStore | None,
    label: str = "kb",
    cache_dir: str | Path | None = None,
    progress: BenchProgress | None = None,
    executor: Executor | None = None,
) -> BenchReport:
    """Run the fix loop on each scenario against ``kb`` (None: cold) and score it (``executor``: a running one to
    reuse, e.g. a Ray cluster's; None: each loop builds ``settings.executor``).

    Attempts are stored as ``bench`` cases in ``store`` (usually ``kb``; None: nowhere).
    A scenario that cannot be built or crashes the loop is scored as not fixed, with the
    error, and the suite goes on.
    """
    started, t0 = datetime.now(UTC).isoformat(timespec="seconds"), time.perf_counter()
    one_torch_thread()
    solvable = _solvability(scenarios, settings)
    results = []
    for s in scenarios:
        say = (lambda msg, d, t, name=s.name: progress(name, msg, d, t)) if progress else None
        try:
            if say:
                say("building the patient", 0, 0)
            run = build(s, cache_dir=cache_dir)
            res = fix(
                kb,
                run,
                store=store,
                config=patient_controls(settings.verify_config(s), s.name, store, kb),
                exclude_ids=s.examples_excluded,
                rounds=settings.rounds,
                candidates=settings.candidates,
                diagnoser=settings.diagnoser,
                exhaustive=settings.exhaustive,
                scenario=s,
                exclude_scenario=s.name,
                source=Source.bench,
                progress=say,
                k=settings.k,
                n_episodes=settings.diagnose_episodes,
                out_dir=_fix_dir(store),
                race=settings.race_settings(),
                explore=settings.explore,
                explore_seed=settings.explore_seed,
                executor=executor,
            )
            row = _scenario_result(s, res)
            arms = _baselines(s, run, settings, say) if settings.baselines else None
            results.append(replace(row, solvable=solvable.get(s.name), baselines=arms))
        except Exception as err:
            results.append(replace(_errored(s, err), solvable=solvable.get(s.name)))
    kb_root = getattr(kb, "root", None)
    return BenchReport(
        label=label,
        kb=None if kb_root is None else str(kb_root),
        settings=settings,
        scenarios=results,
        summary=summarize(results),
        started_at=started,
        wall_time_s=round(time.perf_counter() - t0, 2),
        splits=split_summaries(results),
    )


def _solvability(scenarios: Sequence[Scenario], settings: BenchSettings) -> dict[str, bool]:
    """Scenario name -> solvable, from the oracle records of `remedy bench build` (absent: not checked)."""
    from remedy.cases.verify.solvability import ORACLE_FILE, latest_results

    records = latest_results(scenarios, settings.oracle_results or ORACLE_FILE)
    return {name: r.verdict == "solvable" for name, r in records.items() if r.verdict != "error"}


def _baselines(s: Scenario, run: Any, settings: BenchSettings, say: Any) -> dict[str, dict[str, Any]]:
    """The no-diagnosis fixing arms at the loop's candidate count and per-candidate budget."""
    n = settings.rounds * settings.candidates
    out = {}
    for arm in FIX_BASELINES:
        if say:
            say(f"baseline {arm}", 0, n)
        try:
            out[arm] = asdict(run_fix_baseline(arm, s, run, n, settings.verify_config(s), settings.baseline_seed))
        except Exception as err:
            out[arm] = asdict(BaselineFix(arm, False, False, 0, 0, [], None, f"{type(err).__name__}: {err}"))
    return out


def patient_controls(config: VerifyConfig, scenario: str, *bases: object) -> VerifyConfig:
    """``config`` caching control arms for this patient's loop only, under ``<KB>/controls/bench/<scenario>``
    of the first KB in ``bases``, emptied first.

    The bench measures each patient as a first run: its rounds share the controls they train (as a
    user's loop does), but a patient rerun after a kill, or a later patient, never takes controls an
    earlier run trained, so every run counts the env steps of all the controls it uses.
    """
    shared = with_control_cache(config, *bases).control_cache
    if config.control_cache is not None or shared is None:
        return config  # a cache the caller chose, or no KB to keep one beside
    folder = Path(shared) / "bench" / scenario
    shutil.rmtree(folder, ignore_errors=True)
    return replace(config, control_cache=str(folder))


def _fix_dir(store: AttemptStore | None) -> Path:
    """Winning patches go beside the KB that stores the attempts, else to a temporary folder."""
    if isinstance(store, KnowledgeBase):
        return store.root / "fixes"
    return Path(tempfile.gettempdir()) / "remedy-bench-fixes"


def run_curve(
    scenarios: Sequence[Scenario],
    settings: BenchSettings = BenchSettings(),
    *,
    work_kb: KnowledgeBase,
    cache_dir: str | Path | None = None,
    progress: BenchProgress | None = None,
) -> CurveReport:
    """Cold pass (retrieval sees nothing; attempts stored in ``work_kb``), then warm pass against ``work_kb``.

    ``work_kb`` must start empty: warm diagnoses then see exactly the cold pass's cases of
    the OTHER scenarios (each scenario's own are excluded). Warm attempts are not stored in
    ``work_kb``, so every warm scenario sees the same KB whatever the order; they are
    returned as the warm report's case ids and kept by the caller if wanted.
    """
    tag = (lambda phase: lambda name, msg, d, t: progress(f"{phase} {name}", msg, d, t)) if progress else None
    cold = run_bench(
        None,
        scenarios,
        settings,
        store=work_kb,
        label="cold",
        cache_dir=cache_dir,
        progress=tag("cold") if tag else None,
    )
    warm_store = CaseCollector()
    # the no-diagnosis arms do not depend on the KB: run once (cold) and shown for both passes
    warm = run_bench(
        work_kb,
        scenarios,
        replace(settings, baselines=False),
        store=warm_store,
        label="warm",
        cache_dir=cache_dir,
        progress=tag("warm") if tag else None,
    )
    work_kb.add_many(warm_store.cases)  # kept after the pass, so the pass itself never saw them
    arms = {r.scenario: r.baselines for r in cold.scenarios}
    rows = [replace(r, baselines=arms.get(r.scenario)) for r in warm.scenarios]
    warm = replace(warm, settings=settings, scenarios=rows, splits=split_summaries(rows))
    return CurveReport(cold=cold, warm=warm)


class CaseCollector:
    """An :class:`AttemptStore` that only collects cases in memory (the warm pass stores them after it
    finishes; the case factory ships a unit's cases in a chunk when the unit ends)."""

    def __init__(self) -> None:
        self.cases: list[Case] = []

    def add(self, case: Case) -> bool:
        self.cases.append(case)
        return True
