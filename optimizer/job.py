"""The periodic optimization job: lock, check for new evidence, tune, decide, store, report.

Safe to run from cron or a systemd timer:

- a lock file next to the KB (``optimize.lock``, taken with ``filelock`` without waiting): a
  second run while one holds it raises :class:`OptimizeError` at once and touches nothing;
- ``min_new``: when fewer verified cases were stored since the last run (the newest stored
  program version), the job says so and returns without tuning (the CLI exits 0);
- the run: examples from the KB, a grouped seeded split, tuning on train starting from the
  active version, both scored on validation; the new version is stored either way and becomes
  active only if it beats the active one by ``margin`` (:func:`~remedy.optimizer.versions.promotion_decision`);
- a short Markdown report ``<reports>/optimize-<date>-<time>.md``.

Too few examples raise :class:`OptimizeError` before anything is stored.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from remedy.cases.errors import OptimizeError
from remedy.cases.model import Case, Source
from remedy.cases.store import CaseStore
from remedy.retrieval.diagnosis import CaseRetriever, diagnoser_names, get_diagnoser, program_kind
from remedy.retrieval.offline import OfflineSettings

from .dataset import Example, build_examples, dev_answer_keys, example_group, split_examples
from .offline import K_MAX, Prepared, evaluate, prepare, tune_offline
from .ranker import RANKER_OPTIMIZER, RankerSettings, active_ranker, attempt_rows, evaluate_ranked, fit_ranker
from .report import render_report
from .versions import BACKENDS, DEFAULT_MARGIN, ProgramStore, ProgramVersion, promotion_decision

__all__ = [
    "OptimizeOptions",
    "OptimizeResult",
    "run_optimize",
    "new_verified_cases",
    "LOCK_FILE",
    "MIN_EXAMPLES",
    "MIN_GROUPS",
    "LLM_OPTIMIZERS",
    "program_kind_for",
]

#: the job's lock, in the KB directory
LOCK_FILE = "optimize.lock"
#: fewest examples, and example groups, a run tunes on (below: an error, nothing stored)
MIN_EXAMPLES = 6
MIN_GROUPS = 3
#: optimizers of the llm backend (``remedy.optimizer.llm.compile_llm``)
LLM_OPTIMIZERS = ("gepa", "mipro", "bootstrap")
#: neighbours the llm backend's prompts show per example: what `remedy diagnose` retrieves by default
LLM_K = 10
_OFFLINE_OPTIMIZER = "optuna-tpe"
#: each kind of stored program (``versions.BACKENDS``): the ``--optimizer`` values it takes (None: the
#: kind's own single optimizer) and the error when another is given ({backend}: the name the user gave)
_OPTIMIZERS: dict[str, tuple[tuple[str | None, ...], str]] = {
    "offline": (
        (None, _OFFLINE_OPTIMIZER),
        "--optimizer applies to --backend llm only (the offline backend uses Optuna TPE)",
    ),
    "ranker": (
        (None, RANKER_OPTIMIZER),
        "--optimizer applies to --backend llm only (the ranker is an L2 logistic model)",
    ),
    "llm": (LLM_OPTIMIZERS, "--backend {backend} needs --optimizer " + "|".join(LLM_OPTIMIZERS)),
}

Progress = Callable[[str], None]


@dataclass(frozen=True)
class OptimizeOptions:
    """What one run does (the ``remedy optimize`` flags)."""

    backend: str = "offline"
    optimizer: str | None = None  # llm: gepa | mipro | bootstrap; offline: always seeded Optuna TPE
    trials: int = 100
    seed: int = 0
    margin: float = DEFAULT_MARGIN
    min_new: int = 0
    val_fraction: float = 0.3
    reports: Path | None = Path("reports")

    def check(self) -> None:
        """Refuse option values that cannot run, naming the flag."""
        allowed, refusal = _OPTIMIZERS[program_kind_for(self.backend)]
        if self.optimizer not in allowed:
            raise OptimizeError(refusal.format(backend=self.backend))
        if self.trials < 1:
            raise OptimizeError(f"--trials must be at least 1, got {self.trials}")
        if self.min_new < 0:
            raise OptimizeError(f"--min-new must be 0 or more, got {self.min_new}")
        if not 0.0 < self.val_fraction < 1.0:
            raise OptimizeError(f"--val-fraction must be between 0 and 1 (exclusive), got {self.val_fraction}")
        if not 0.0 <= self.margin < 1.0:
            raise OptimizeError(f"--margin must be in [0, 1), got {self.margin}")


def program_kind_for(backend: str) -> str:
    """The kind of stored program ``--backend`` optimizes (one of ``versions.BACKENDS``).

    A kind is taken as it is; any other name must be a registered diagnoser, which is asked for its
    ``program_kind`` (:func:`remedy.retrieval.diagnosis.program_kind`): a backend registered under a new
    name that runs ``llm`` programs is optimized as the ``llm`` kind, and its versions are the ones it runs.
    """
    if backend in BACKENDS:
        return backend
    if backend not in diagnoser_names():
        raise OptimizeError(f"unknown --backend {backend!r}; choose offline, llm or ranker")
    kind = program_kind(get_diagnoser(backend))
    if kind not in BACKENDS:
        raise OptimizeError(
            f"the diagnoser {backend!r} runs no stored program versions, so there is nothing to optimize; "
            "choose offline, llm or ranker"
        )
    return kind


@dataclass(frozen=True)
class OptimizeResult:
    """What a run did: ``done`` (a version stored, promoted or not) or ``nothing_to_do``."""

    status: str
    message: str
    new_cases: int
    since: datetime | None
    version: ProgramVersion | None = None
    active_val: float | None = None
    new_val: float | None = None
    train_size: int = 0
    val_size: int = 0
    train_score_before: float | None = None
    train_score_after: float | None = None
    report: Path | None = None
    changed: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)  # llm backend: LMs, inner split, per-example scores

    @property
    def promoted(self) -> bool:
        """True when the run's version became active."""
        return self.version is not None and self.version.promoted

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (what ``remedy optimize --json`` prints)."""
        return {
            "status": self.status,
            "message": self.message,
            "new_cases": self.new_cases,
            "since": None if self.since is None else self.since.isoformat(),
            "version": None if self.version is None else self.version.as_dict(),
            "promoted": self.promoted,
            "active_val": self.active_val,
            "new_val": self.new_val,
            "train_size": self.train_size,
            "val_size": self.val_size,
            "train_score_before": self.train_score_before,
            "train_score_after": self.train_score_after,
            "changed": {k: list(v) for k, v in self.changed.items()},
            "report": None if self.report is None else str(self.report),
            "details": self.details,
        }


def new_verified_cases(store: CaseStore, since: datetime | None) -> int:
    """Measured cases (with a verification; bundled examples aside) stored after ``since`` (all when None)."""
    sql = "SELECT count(*) FROM cases WHERE status NOT IN ('unverified', 'literature') AND source <> ?"
    args: list[Any] = [Source.example.value]
    if since is not None:
        sql, args = sql + " AND created_at > ?", [*args, since]
    with store.connection() as con:
        row = con.execute(sql, args).fetchone()
    return int(row[0]) if row else 0


def run_optimize(
    store: CaseStore,
    retriever: CaseRetriever | None,
    options: OptimizeOptions,
    *,
    progress: Progress | None = None,
) -> OptimizeResult:
    """One locked run of the job against the KB whose store is ``store`` (``retriever``: its similarity search)."""
    options.check()
    lock_path = store.path.parent / LOCK_FILE
    try:
        with FileLock(str(lock_path), timeout=0):
            return _run(store, retriever, options, progress or (lambda _m: None))
    except Timeout:
        raise OptimizeError(
            f"another `remedy optimize` is running on {store.path.parent} (it holds {lock_path}); "
            "this run exits without doing anything"
        ) from None


def _run(store: CaseStore, retriever: CaseRetriever | None, opts: OptimizeOptions, say: Progress) -> OptimizeResult:
    programs = ProgramStore(store)
    since = programs.last_run_at()
    new = new_verified_cases(store, since)
    when = "the start" if since is None else since.strftime("%Y-%m-%d %H:%M UTC")
    if new < opts.min_new:
        msg = f"nothing to do: {new} new verified cases since {when}, need {opts.min_new}"
        return OptimizeResult("nothing_to_do", msg, new, since)
    cases = list(store.iter_cases())
    examples = build_examples(cases, answer_keys=dev_answer_keys({c.scenario for c in cases if c.scenario}))
    _check_enough(examples)
    train, val = split_examples(examples, val_fraction=opts.val_fraction, seed=opts.seed)
    say(f"{len(examples)} examples: {len(train)} train, {len(val)} validation")
    kind = program_kind_for(opts.backend)
    job = _Job(store, retriever, programs, cases, examples, train, val, programs.active(kind), opts, new, since, say)
    return _RUNNERS[kind](job)


@dataclass(frozen=True)
class _Job:
    """What every kind's run works from: the KB, its examples and split, the active version, the options."""

    store: CaseStore
    retriever: CaseRetriever | None
    programs: ProgramStore
    cases: list[Case]
    examples: list[Example]
    train: list[Example]
    val: list[Example]
    active: ProgramVersion | None  # the active version of the kind being optimized
    opts: OptimizeOptions
    new: int
    since: datetime | None
    say: Progress


def _run_offline(job: _Job) -> OptimizeResult:
    """The offline kind: tune the vote's settings with Optuna on train, starting from the active version."""
    retriever, programs, cases, examples = job.retriever, job.programs, job.cases, job.examples
    train, val, active, opts, new, since, say = job.train, job.val, job.active, job.opts, job.new, job.since, job.say
    start = active.offline_settings() if active is not None else OfflineSettings()
    say(f"retrieving neighbours for {len(examples)} examples (leave-group-out)")
    prepared = prepare(examples, retriever, _group_ids(cases), k_max=max(K_MAX, start.k), mirrors=_mirrors(examples))
    train_keys = {e.key for e in train}
    train_p = [p for p in prepared if p.example.key in train_keys]
    val_p = [p for p in prepared if p.example.key not in train_keys]
    tuning = tune_offline(
        train_p, start=start, trials=opts.trials, seed=opts.seed,
        progress=lambda i, n, best: say(f"trial {i}/{n}: best train score {best:.3f}"),
    )  # fmt: skip
    active_val, new_val = evaluate(start, val_p), evaluate(tuning.settings, val_p)
    promote, reason = promotion_decision(active_val, new_val, opts.margin)
    if tuning.settings == start:
        promote, reason = False, f"no trial beat the active settings on train ({tuning.start_score:.3f}); " + reason
    version = programs.add(
        backend="offline", optimizer=_OFFLINE_OPTIMIZER, train_size=len(train), val_size=len(val),
        active_val=active_val, new_val=new_val, promote=promote, reason=reason,
        parameters=tuning.settings.model_dump(mode="json"), seed=opts.seed, trials=tuning.trials,
    )  # fmt: skip
    result = OptimizeResult(
        status="done",
        message=f"{version.id}: {'promoted' if promote else 'not promoted'} ({reason})",
        new_cases=new,
        since=since,
        version=version,
        active_val=active_val,
        new_val=new_val,
        train_size=len(train),
        val_size=len(val),
        train_score_before=tuning.start_score,
        train_score_after=tuning.train_score,
        changed=_changed(start, tuning.settings),
    )
    path = _write_report(opts, result, active, val_p, start, tuning.settings)
    return result if path is None else _with_report(result, path)


def _run_ranker(job: _Job) -> OptimizeResult:
    """The ranker backend: fit on the train groups' attempts, then score the diagnosis it orders on validation.

    The bar is the active ranker, or with none the deterministic vote alone; both run under the
    active offline program's settings, and the margin rule decides as for programs.
    """
    store, retriever, programs, cases, opts, say = job.store, job.retriever, job.programs, job.cases, job.opts, job.say
    train, val, new, since = job.train, job.val, job.new, job.since
    train_groups = {e.group for e in train}
    rows = [r for r in attempt_rows(cases) if r.group in train_groups]
    say(f"fitting the ranker on {len(rows)} attempts of {len(train_groups)} train groups")
    ranker = fit_ranker(rows, RankerSettings(seed=opts.seed))
    offline = programs.active("offline")
    settings = offline.offline_settings() if offline is not None else OfflineSettings()
    say(f"retrieving neighbours for {len(val)} validation examples (leave-group-out)")
    val_p = prepare(val, retriever, _group_ids(cases), k_max=max(K_MAX, settings.k), mirrors=_mirrors(val))
    current = active_ranker(store)
    vote_val = evaluate_ranked(settings, None, val_p)
    active_val = vote_val if current is None else evaluate_ranked(settings, current, val_p)
    new_val = evaluate_ranked(settings, ranker, val_p)
    promote, reason = promotion_decision(active_val, new_val, opts.margin)
    version = programs.add(
        backend="ranker", optimizer=RANKER_OPTIMIZER, train_size=len(train), val_size=len(val),
        active_val=active_val, new_val=new_val, promote=promote, reason=reason,
        parameters=ranker.model_dump(mode="json", exclude={"version"}), seed=opts.seed, trials=len(RankerSettings().cs),
    )  # fmt: skip
    details = {"vote_val": vote_val, "active_ranker": None if current is None else current.version, **ranker.meta}
    result = OptimizeResult(
        "done", f"{version.id}: {'promoted' if promote else 'not promoted'} ({reason})", new, since, version,
        active_val, new_val, len(train), len(val), details=details,
    )  # fmt: skip
    path = _write_report(
        opts, result, programs.get(current.version) if current and current.version else None, [], None, None
    )
    return result if path is None else _with_report(result, path)


def _check_enough(examples: list[Example]) -> None:
    groups = {e.group for e in examples}
    if len(examples) < MIN_EXAMPLES or len(groups) < MIN_GROUPS:
        raise OptimizeError(
            f"too few examples to optimize: {len(examples)} attempt group(s) from {len(groups)} scenario(s) or run(s) "
            f"with verified cases; need at least {MIN_EXAMPLES} from {MIN_GROUPS} (run `remedy fix` or "
            "`remedy bench run` on more failures first); nothing was stored"
        )


def _group_ids(cases: Iterable[Case]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for c in cases:
        out[example_group(c)].add(c.case_id)
    return out


def _mirrors(examples: list[Example]) -> dict[str, list[str]]:
    """Example cases that mirror a bundled scenario (its ``examples_excluded``), by group: hidden as in the bench."""
    names = {e.group.removeprefix("scenario:") for e in examples if e.group.startswith("scenario:")}
    if not names:
        return {}
    from remedy.cases.verify.scenarios import bundled_scenarios  # YAML, templates and gymnasium: only when asked

    return {f"scenario:{s.name}": list(s.examples_excluded) for s in bundled_scenarios() if s.name in names}


def _changed(before: OfflineSettings, after: OfflineSettings) -> dict[str, tuple[Any, Any]]:
    a, b = before.model_dump(), after.model_dump()
    return {k: (a[k], b[k]) for k in a if a[k] != b[k]}


def _run_llm(job: _Job) -> OptimizeResult:
    """The llm kind: ``remedy.optimizer.llm.compile_llm`` compiles and scores; this stores and decides.

    Each example's diagnosis context (retrieval done, leave-group-out) is prepared here, after the request
    is checked, so a request that cannot run costs no retrieval.
    """
    programs, train, val, active, opts, new, since = (
        job.programs, job.train, job.val, job.active, job.opts, job.new, job.since
    )  # fmt: skip
    llm = _llm_module()
    llm.check_request(train, val, optimizer=opts.optimizer, seed=opts.seed, trials=opts.trials)  # before retrieval
    job.say(f"retrieving neighbours for {len(job.examples)} examples (leave-group-out)")
    prepared = prepare(job.examples, job.retriever, _group_ids(job.cases), k_max=LLM_K, mirrors=_mirrors(job.examples))
    job.say(f"compiling the diagnosis program with {opts.optimizer}")
    contexts = {p.example.key: p.context for p in prepared}
    compiled = llm.compile_llm(
        train, val, optimizer=opts.optimizer, seed=opts.seed, trials=opts.trials, active=active, contexts=contexts
    )
    promote, reason = promotion_decision(compiled.active_val, compiled.new_val, opts.margin)
    version = programs.add(
        backend="llm", optimizer=str(opts.optimizer), train_size=len(train), val_size=len(val),
        active_val=compiled.active_val, new_val=compiled.new_val, promote=promote, reason=reason,
        program=compiled.program, seed=opts.seed, trials=opts.trials,
    )  # fmt: skip
    result = OptimizeResult(
        "done", f"{version.id}: {'promoted' if promote else 'not promoted'} ({reason})", new, since, version,
        compiled.active_val, compiled.new_val, len(train), len(val), details=compiled.details,
    )  # fmt: skip
    path = _write_report(opts, result, active, [], None, None)
    return result if path is None else _with_report(result, path)


#: how each kind of stored program is optimized (keys: ``versions.BACKENDS``)
_RUNNERS: dict[str, Callable[[_Job], OptimizeResult]] = {
    "offline": _run_offline,
    "ranker": _run_ranker,
    "llm": _run_llm,
}


def _llm_module() -> Any:
    """``remedy.optimizer.llm``, imported only when asked for (it loads DSPy, which the offline path never needs)."""
    from . import llm

    return llm


def _with_report(result: OptimizeResult, path: Path) -> OptimizeResult:
    return replace(result, report=path)


def _write_report(
    opts: OptimizeOptions,
    result: OptimizeResult,
    active: ProgramVersion | None,
    val: list[Prepared],
    before: OfflineSettings | None,
    after: OfflineSettings | None,
) -> Path | None:
    if opts.reports is None or result.version is None:
        return None
    v = result.version
    path = Path(opts.reports) / f"optimize-{v.created_at.astimezone(UTC):%Y-%m-%d-%H%M%S}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(opts, result, active, val, before, after))
    return path
