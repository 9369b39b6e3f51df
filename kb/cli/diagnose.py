"""`remedy diagnose`, `remedy fix`, `remedy demo` (the bench verbs are in :mod:`.bench`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import TaskID
from rich.table import Table

from remedy.cases.errors import KBNotFoundError
from remedy.kb.settings import FixSettings, settings_from

from .common import (
    DEFAULT_KB,
    JsonOption,
    KbOption,
    ScreenConfidenceOption,
    ServerOption,
    TrustCheckpointOption,
    add_columns,
    console,
    effect_text,
    err_console,
    print_json,
    progress_bar,
    shown,
    status_markup,
)
from .render import render_similar

__all__ = ["diagnose", "fix_cmd", "demo_cmd", "write_patches"]

DiagnoserOption = Annotated[
    str, typer.Option("--diagnoser", help="offline (no network), llm (needs REMEDY_LM), or auto (llm if configured).")
]


def diagnose(
    run_dir: Annotated[
        Path | None,
        typer.Argument(
            help="Run directory (run.yaml + model.zip); or describe the failure with --describe.", resolve_path=True
        ),
    ] = None,
    describe: Annotated[
        str | None, typer.Option("--describe", help="Diagnose a failure described in words instead of a run directory.")
    ] = None,
    env: Annotated[str | None, typer.Option("--env", help="With --describe: the env id, if known.")] = None,
    algo: Annotated[str | None, typer.Option("--algo", help="With --describe: the algorithm, if known.")] = None,
    action_space: Annotated[
        str | None, typer.Option("--action-space", help="With --describe: discrete or continuous, if known.")
    ] = None,
    tags: Annotated[
        str | None,
        typer.Option(
            "--tags",
            help="With --describe: symptom tags to use instead of reading them off the "
            "text, comma-separated (hovering,timeouts).",
        ),
    ] = None,
    diagnoser: DiagnoserOption = "offline",
    k: Annotated[int, typer.Option("--k", min=0, help="Similar cases to retrieve.")] = 10,
    episodes: Annotated[int, typer.Option("--episodes", min=1, help="Evaluation episodes for the signature.")] = 20,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the evaluation rollouts.")] = 0,
    exclude_scenario: Annotated[
        str | None, typer.Option("--exclude-scenario", help="Leave out cases of this scenario (benchmarks).")
    ] = None,
    write_patches_dir: Annotated[
        Path | None, typer.Option("--write-patches", help="Write each candidate as a YAML patch file here.")
    ] = None,
    report_dir: Annotated[
        Path | None,
        typer.Option(
            "--report",
            help="Also write DIR/diagnosis.html: the diagnosis with plots of typical failing episodes and, "
            "where the env renders headless, a GIF of the worst one (a run directory, not --server).",
        ),
    ] = None,
    kb: KbOption = Path(DEFAULT_KB),
    as_json: JsonOption = False,
    server: ServerOption = None,
    trust_checkpoint: TrustCheckpointOption = False,
) -> None:
    """Say why the agent in RUN_DIR (or the one described with --describe) fails: ranked root causes and patches.

    The llm backend reads REMEDY_LM (a litellm model string such as openai/gpt-4o-mini or
    ollama_chat/llama3.1), REMEDY_LM_API_BASE (e.g. http://localhost:8000/v1 for a local
    OpenAI-compatible server) and REMEDY_LM_API_KEY. With --server the service diagnoses (with
    its own LM settings); a RUN_DIR is uploaded to it first.
    """
    text_opts = {"--env": env, "--algo": algo, "--action-space": action_space, "--tags": tags}
    _check_source(run_dir, describe, text_opts)
    if report_dir is not None and (run_dir is None or server):
        from remedy.cases.errors import ValidationError

        raise ValidationError("--report draws a run directory's episodes on this machine; drop --describe/--server")
    if server:
        report = _diagnose_remote(server, run_dir, describe, text_opts, diagnoser, k, episodes, seed, exclude_scenario)
        return _show(report, [], write_patches_dir, as_json)
    from remedy.kb.diagnose import diagnose_description, diagnose_run

    backend = _backend(diagnoser)
    store, warnings = _open_kb(kb)
    try:
        if describe is not None:
            report = diagnose_description(
                store, describe, env_id=env, algo=algo, action_space=action_space, tags=tags, diagnoser=backend, k=k
            )
        else:
            assert run_dir is not None  # _check_source made sure exactly one of the two is given
            run = _load_run(run_dir, trust_checkpoint)
            report = diagnose_run(
                store,
                run,
                diagnoser=backend,
                k=k,
                n_episodes=episodes,
                seed=seed,
                exclude_scenario=exclude_scenario,
            )
    finally:
        if store is not None:
            store.close()
    if report_dir is not None:
        from remedy.kb.diagnosis_page import write_diagnosis_page

        page = write_diagnosis_page(run, report, report_dir, seed=seed)
        warnings = [*warnings, *page.notes]
    _show(report, warnings, write_patches_dir, as_json)
    if report_dir is not None:
        err_console.print(f"diagnosis page: {page.html}")  # stderr, so --json stays one JSON document


def _show(report, warnings: list[str], write_patches_dir: Path | None, as_json: bool) -> None:
    """Write the candidate patches when asked, then print the report (JSON or tables)."""
    report = report.model_copy(update={"warnings": [*warnings, *report.warnings]})
    written = write_patches(report.candidates, write_patches_dir) if write_patches_dir else []
    if as_json:
        data = report.model_dump(mode="json")
        data["patch_files"] = [str(p) for p in written]
        print_json(data)
        return
    _render(report, written)


def _diagnose_remote(server, run_dir, describe, text_opts, diagnoser, k, episodes, seed, exclude_scenario):
    """The report from the service at ``server``: of a description, or of RUN_DIR (uploaded)."""
    from remedy.cases.errors import ValidationError

    from .connect import client

    if exclude_scenario is not None:
        raise ValidationError("--exclude-scenario is for local benchmarks; drop it or drop --server")
    with client(server) as remote:
        if describe is not None:
            tags = text_opts["--tags"]
            return remote.diagnose(
                None,
                describe=describe,
                env=text_opts["--env"],
                algo=text_opts["--algo"],
                action_space=text_opts["--action-space"],
                tags=None if tags is None else tags.split(","),
                diagnoser=diagnoser,
                k=k,
            )
        return remote.diagnose(run_dir, diagnoser=diagnoser, k=k, episodes=episodes, seed=seed)


def _load_run(run_dir: Path, trust: bool):
    """The run directory, loaded as the user's own only with ``--trust-checkpoint``."""
    from remedy.cases.evidence.rundir import RunDir

    return RunDir.load(run_dir, trust=trust)


def _check_source(run_dir: Path | None, describe: str | None, text_opts: dict) -> None:
    """Exactly one of RUN_DIR and --describe; the description's options only with --describe."""
    from remedy.cases.errors import ValidationError

    if (run_dir is None) == (describe is None):
        raise ValidationError(
            "give exactly one of RUN_DIR or --describe TEXT "
            "(`remedy diagnose runs/lander` or `remedy diagnose --describe 'the lander hovers'`)"
        )
    stray = [name for name, value in text_opts.items() if value is not None]
    if run_dir is not None and stray:
        raise ValidationError(
            f"{', '.join(stray)} only apply with --describe; a run directory states its own "
            "env, algorithm and action space in run.yaml"
        )


def _backend(name: str):
    """The named backend, built before any rollout so a bad name or a missing LM fails fast."""
    from remedy.retrieval.diagnosis import get_diagnoser, preflight

    backend = get_diagnoser(name)
    preflight(backend)  # an LM backend raises LMError now when REMEDY_LM is not set
    return backend


def _open_kb(path: Path):
    """The KB at ``path``, or None (cold: priors only) with a warning when there is none yet."""
    from remedy.kb.facade import KnowledgeBase

    try:
        return KnowledgeBase.open(path, create=False), []
    except KBNotFoundError:
        return None, [
            f"no knowledge base at {path}: advice comes from the built-in priors only "
            "(create one with `remedy kb init`)"
        ]


def write_patches(candidates, directory: Path) -> list[Path]:
    """Write each candidate patch as ``NN-<family>.yaml`` under ``directory``; returns the paths."""
    from remedy.cases.patches.io import save_patch  # the patch models (pydantic, numpy): not for --help

    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for i, cand in enumerate(candidates, start=1):
        path = directory / f"{i:02d}-{cand.family.value}.yaml"
        save_patch(cand.patch, path)
        out.append(path)
    return out


def _render(report, written: list[Path]) -> None:
    d, sig = report.diagnosis, report.signature
    if report.reading or not sig.features:  # read from a description: show how the words were read
        console.print(f"[bold]Description[/]: {shown(sig.summary)}", highlight=False)
        console.print(
            "read as: " + (", ".join(_reading_text(r) for r in report.reading) or "no symptom tag"), highlight=False
        )
        if report.stated:
            console.print(
                "stated: "
                + ", ".join(f"{s.cause.value} ({s.similarity:.2f}: '{shown(s.clause[:60])}')" for s in report.stated),
                highlight=False,
            )
    else:
        console.print(f"[bold]Signature[/]: {shown(sig.summary)}")
        console.print("symptoms: " + shown(", ".join(sig.symptoms) or "none"), highlight=False)
    causes = Table(title=f"Root causes ({d.backend}, {d.program_version})", title_justify="left")
    for col in ("#", "cause", "confidence", "rationale"):
        causes.add_column(col, overflow="fold")
    for i, c in enumerate(d.causes, start=1):
        causes.add_row(str(i), c.cause.value, f"{c.confidence:.2f}", shown(c.rationale))
    console.print(causes)
    cands = Table(title="Candidate patches", title_justify="left")
    for col in ("#", "family", "patch", "cost", "score", "cites"):
        cands.add_column(col, overflow="fold")
    for i, c in enumerate(report.candidates, start=1):
        cites = shown(", ".join(c.cites))  # case ids and patch text come from stored cases
        cands.add_row(str(i), c.family.value, shown(c.patch.summary()), c.compute_cost, f"{c.score:.2f}", cites)
    console.print(cands)
    if report.families:
        console.print("remedy families: " + ", ".join(_family_text(f) for f in report.families), highlight=False)
    console.print("cited cases: " + shown(", ".join(d.cited_cases) or "none"), highlight=False)
    console.print("cited rules: " + (", ".join(d.cited_rules) or "none"), highlight=False)
    for path in written:
        console.print(f"wrote {shown(path)}", highlight=False)
    for w in report.warnings:
        console.print(f"[yellow]warning:[/] {shown(w)}", highlight=False)


def _family_text(proposal) -> str:
    """``reward_shaping 0.42``, marked when no concrete patch could be built for the subject."""
    return f"{proposal.family.value} {proposal.score:.2f}" + (
        "" if proposal.example else " (no patch fits: name --env)"
    )


def _reading_text(reading) -> str:
    """``hovering (0.62: 'the lander hovers')``, or ``hovering (set by --tags)``."""
    if reading.similarity is None:
        return f"{reading.tag} (set by --tags)"
    return f"{reading.tag} ({reading.similarity:.2f}: '{reading.clause[:60]}')"


# ---- remedy fix, remedy bench run|curve, remedy demo (the fix-loop issue) ---------------------


class _Live:
    """Progress while a long command runs: a rich bar on stderr plus one kept line per finished attempt."""

    def __init__(self, disable: bool = False) -> None:
        self._bar = progress_bar(disable=disable)
        self._task: TaskID | None = None
        self.disable = disable

    def __enter__(self) -> _Live:
        self._bar.__enter__()
        self._task = self._bar.add_task("starting", total=None)
        return self

    def __exit__(self, *exc) -> None:
        self._bar.__exit__(*exc)

    def update(self, message: str, done: int = 0, total: int = 0) -> None:
        """Show ``message`` (and ``done/total`` jobs); keep a line for each attempt's outcome."""
        if self._task is not None:
            self._bar.update(self._task, description=message[:110], completed=done, total=total or None)
        if not self.disable and message.endswith(
            ("improved", "no_effect", "worse", "reward_hacking", "failed", "inconclusive", "stopped_early")
        ):
            self._bar.console.print(message, highlight=False)

    def scenario(self, name: str, message: str, done: int = 0, total: int = 0) -> None:
        """``update`` with the scenario's name in front."""
        self.update(f"{name}: {message}" if name else message, done, total)


def _attempts_table(result, title: str = "What was tried") -> Table:
    t = Table(title=title, title_justify="left")
    add_columns(
        t,
        [
            ("round", {"justify": "right"}),
            ("family", {"overflow": "fold"}),
            ("patch", {"overflow": "fold"}),
            ("status", {}),
            ("effect [95% CI]", {}),
            ("env steps", {"justify": "right"}),
            ("budget/arm (source)", {"overflow": "fold"}),
            ("case", {"overflow": "fold"}),
        ],
    )
    for a in result.attempts:
        stage = f"{a.stage}{' cleared' if a.passed_screen else ''}: "
        t.add_row(
            str(a.round),
            shown(a.family),
            shown(a.patch.summary()),
            stage + status_markup(a.status),
            effect_text(a.effect),
            f"{a.env_steps:,}",
            _budget_cell(a),
            shown(a.case_id),
        )
    return t


def _budget_cell(a) -> str:
    """``20,000 (kb: 3 cases)``: an attempt's budget per arm and where it came from."""
    source = a.budget_source or "-"
    if a.budget_cases:
        source += f": {len(a.budget_cases)} case(s)"
    return f"{a.budget_steps:,} ({source})"


def _render_fix(result) -> None:
    first = result.first_diagnosis
    if first is not None:
        causes = ", ".join(f"{c.cause.value} ({c.confidence:.0%})" for c in first.diagnosis.causes[:3]) or "none"
        console.print(f"[bold]Diagnosis[/] (round 1): {causes}", highlight=False)
    console.print(_attempts_table(result))
    for a in result.attempts:
        if a.status == "failed":
            console.print(
                f"[red]failed[/] round {a.round} ({shown(a.patch.summary())}): {shown(a.reason[:300])}", highlight=False
            )
    if result.stopped_early:
        r = result.race
        console.print(
            f"{result.stopped_early} candidate(s) stopped early at stage 1 of a race ({r.fraction:.2g} of the "
            f"budget, {r.seeds} seeds): no verdict, stored as stopped_early",
            highlight=False,
        )
    console.print(f"{result.rounds_used} round(s); stopped: {result.stop_reason}", highlight=False)
    saved = getattr(result, "rollouts", None)
    if saved is not None and saved.reused_episodes:
        console.print(
            f"[dim]rollouts of the checkpoint reused: {saved.reused_episodes:,} episodes "
            f"({saved.reused_env_steps:,} env steps) not recomputed; {saved.computed_episodes:,} computed[/]",
            highlight=False,
        )
    if result.winner is not None:
        w = result.winner
        verdict = "[bold green]fixed[/]" if result.fixed else "[bold yellow]improved, but the agent still fails[/]"
        console.print(
            f"{verdict} by {w.patch.summary()} ({effect_text(w.effect)}) after "
            f"{result.attempts_to_fix} attempt(s), {result.env_steps_to_fix:,} env steps, "
            f"{result.wall_time_to_fix_s:.0f} s",
            highlight=False,
        )
        console.print(
            f"winning patch: [bold]{result.patch_path}[/] (apply or re-check it with "
            f"`remedy verify {result.run_dir} --patch {result.patch_path}`)",
            highlight=False,
            soft_wrap=True,
        )
        if getattr(result, "fixed_dir", None) is not None:
            console.print(
                f"fixed agent: [bold]{result.fixed_dir}[/] (model.zip, run.yaml, patch.yaml, apply_sb3.py, "
                "rlzoo_hyperparams.yml; README.txt says which seed and why)",
                highlight=False,
                soft_wrap=True,
            )
    else:
        console.print(
            "[yellow]no confirmed fix[/]: every attempt is stored in the KB; try more --rounds, "
            "--candidates or a larger --budget",
            highlight=False,
        )
    for w in result.warnings:
        console.print(f"[yellow]warning:[/] {w}", highlight=False)


ExecutorOption = Annotated[str, typer.Option("--executor", help="Where verification jobs run: local or ray.")]
RoundsOption = Annotated[int, typer.Option("--rounds", min=1, help="Diagnose-verify rounds at most.")]
CandidatesOption = Annotated[int, typer.Option("--candidates", min=1, help="Candidates verified per round.")]
SeedsOption = Annotated[int, typer.Option("--seeds", min=1, help="Training seeds per arm.")]
#: the default is ``remedy.cases.verify.verification.CONFIRM_SEEDS`` (a literal here: the CLI imports no torch)
ConfirmSeedsOption = Annotated[
    int,
    typer.Option(
        "--confirm-seeds",
        min=2,
        help="Training seeds per arm of a confirmation on fresh seeds (only a candidate that cleared its "
        "screen is confirmed, and only a confirmation can say improved).",
    ),
]
BudgetOption = Annotated[
    int | None,
    typer.Option(
        "--budget", min=1, help="Fine-tuning env steps per arm (default: 20% of train_steps, or each scenario's own)."
    ),
]
RaceOption = Annotated[
    bool,
    typer.Option(
        "--race/--no-race",
        help="Race each round's candidates: stage 1 on a share of the budget drops those showing no gain.",
    ),
]
RaceFractionOption = Annotated[
    float, typer.Option("--race-fraction", help="Share of the per-candidate budget stage 1 of a race spends.")
]
RaceSeedsOption = Annotated[
    int, typer.Option("--race-seeds", help="Training seeds per arm at stage 1 of a race (at least 2).")
]


def _race(race: bool, fraction: float, seeds: int):
    from remedy.cases.verify.racing import RaceSettings

    settings = RaceSettings(enabled=race, fraction=fraction, seeds=seeds)
    settings.check()
    return settings


def fix_cmd(
    run_dir: Annotated[Path, typer.Argument(help="Run directory (run.yaml + model.zip).", resolve_path=True)],
    rounds: RoundsOption = FixSettings.default("rounds"),
    candidates: CandidatesOption = FixSettings.default("candidates"),
    seeds: SeedsOption = FixSettings.default("seeds"),
    confirm_seeds: ConfirmSeedsOption = FixSettings.default("confirm_seeds"),
    screen_confidence: ScreenConfidenceOption = FixSettings.default("screen_confidence"),
    budget: BudgetOption = None,
    executor: ExecutorOption = FixSettings.default("executor"),
    diagnoser: DiagnoserOption = FixSettings.default("diagnoser"),
    exhaustive: Annotated[
        bool, typer.Option("--exhaustive", help="Verify every round's candidates even after a fix.")
    ] = FixSettings.default("exhaustive"),
    confirmations: Annotated[
        int,
        typer.Option(
            "--confirmations",
            min=1,
            help="Confirmations on fresh seeds the loop may run (each false-passes with "
            "probability <= 2.5%; the default 2 keeps a false fix <= 5%).",
        ),
    ] = FixSettings.default("confirmations"),
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Where to write the winning patch and the fixed agent (<out>/fixed/; default <kb>/fixes). "
            "With --server: a folder under the service's <kb>/fixes/.",
        ),
    ] = None,
    race: RaceOption = FixSettings.default("race"),
    race_fraction: RaceFractionOption = FixSettings.default("race_fraction"),
    race_seeds: RaceSeedsOption = FixSettings.default("race_seeds"),
    kb: KbOption = Path(DEFAULT_KB),
    as_json: JsonOption = False,
    server: ServerOption = None,
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="With --server: follow the job, or print its id.")
    ] = True,
    trust_checkpoint: TrustCheckpointOption = False,
) -> None:
    """Diagnose → verify the top candidates (raced) → store every attempt → repeat until a fix is verified."""
    settings = settings_from(
        FixSettings,
        rounds=rounds,
        candidates=candidates,
        seeds=seeds,
        confirm_seeds=confirm_seeds,
        screen_confidence=screen_confidence,
        budget=budget,
        executor=executor,
        diagnoser=diagnoser,
        exhaustive=exhaustive,
        confirmations=confirmations,
        out=None if out is None else str(out),
        race=race,
        race_fraction=race_fraction,
        race_seeds=race_seeds,
    )
    settings.race_settings()  # a bad race is refused before anything runs, local or served
    if server:
        from .jobs import fix_job

        return fix_job(server, run_dir, as_json, wait, settings)
    from remedy.cases.evidence.rundir import RunDir
    from remedy.kb.facade import KnowledgeBase
    from remedy.kb.fixloop import fix, one_torch_thread

    one_torch_thread()
    run = RunDir.load(run_dir, trust=trust_checkpoint)  # not a run: fails here, before a KB is created
    backend = _backend(diagnoser)
    with KnowledgeBase.open(kb, create=True) as base, _Live(disable=as_json) as live:
        result = fix(
            base,
            run,
            store=base,
            diagnoser=backend,
            out_dir=out or base.root / "fixes",
            progress=live.update,
            **settings.loop_kwargs(),
        )
    if as_json:
        print_json(result.as_dict())
        return
    _render_fix(result)


ScenariosOption = Annotated[
    str | None,
    typer.Option("--scenarios", help="Name glob over the bundled scenarios ('cartpole_*'), or YAML path/dir/glob."),
]


def demo_cmd(
    kb: KbOption = Path(DEFAULT_KB),
    fresh: Annotated[
        bool, typer.Option("--fresh/--keep", help="Start from a fresh KB (default) or keep its cases.")
    ] = True,
    scenarios: ScenariosOption = None,
    as_json: JsonOption = False,
) -> None:
    """The whole loop on the quick fault scenarios: diagnose → verify → store → query (under 10 minutes)."""
    from remedy.kb.demo import DemoSettings, run_demo

    with _Live(disable=as_json) as live:
        result = run_demo(kb, fresh=fresh, settings=DemoSettings(scenarios=scenarios), progress=live.scenario)
    if as_json:
        print_json(result.as_dict())
        return
    _render_demo(result)


def _render_demo(result) -> None:
    t = Table(title="Demo: what Remedy did", title_justify="left")
    for col in ("scenario", "diagnosis (top 2)", "ground truth", "patch", "effect [95% CI]", "status", "attempts"):
        t.add_column(col, overflow="fold")
    for row in result.rows:
        res = row.result
        shown = res.winner or (res.attempts[-1] if res.attempts else None)
        t.add_row(
            row.scenario,
            ", ".join(row.diagnosis[:2]) or "-",
            ", ".join(row.ground_truth),
            shown.patch.summary() if shown else "-",
            effect_text(shown.effect) if shown else "-",
            status_markup(shown.status) if shown else "-",
            str(len(res.attempts)),
        )
    console.print(t)
    if result.query_scenario:
        console.print(
            render_similar(result.similar, title=f"remedy query: cases similar to {result.query_scenario}'s signature")
        )
    console.print(
        f"KB {result.kb_path}: {result.cases_stored} cases ({result.examples_loaded} examples); "
        f"demo took {result.wall_time_s:.0f} s",
        highlight=False,
    )
    for p in result.written:
        console.print(f"wrote {p}", highlight=False)
    if not result.any_improved:
        console.print("[yellow]no scenario reached a verified improvement this time[/]", highlight=False)
