"""How the CLI shows things: the tables and panels every command renders, local or through the service.

One module for the rendering (cases, similar-case tables, KB stats, a verification's outcome), so a
command's local path (:mod:`.kb`, :mod:`.verify`) and its ``--server`` path (:mod:`.remote`) print the
same thing from the same code. It imports nothing heavy, not even the case models, at import time (the light-CLI policy in
:mod:`remedy.kb.cli`).
"""

from __future__ import annotations

import re
import statistics
from typing import TYPE_CHECKING

import typer
from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .common import add_columns, console, shown, shown_cell, status_markup

if TYPE_CHECKING:
    from remedy.cases.model import Case
    from remedy.kb.facade import KBStats, SimilarCase
    from remedy.kb.server.models import JobOut

__all__ = [
    "stats_table",
    "format_effect",
    "short_id",
    "SIMILAR_TSV",
    "print_similar",
    "render_similar",
    "render_case",
    "render_outcome",
    "render_verification",
    "render_job",
    "render_fix_job",
]


def stats_table(stats: KBStats) -> Group:
    """The KB's size, schema, index state and counts by source, status, env and root cause."""
    s = stats.store
    index = "not opened (--index checks it)" if stats.index_rows is None else f"{stats.index_rows} rows"
    if stats.index_problem:
        index = (
            "[red]problem, see below[/]" if stats.index_rows is None else f"{index} [red](out of step, see below)[/]"
        )
    head = f"[bold]{shown(stats.path)}[/]  {s.total} cases  schema v{stats.schema_version}  index: {index} ({stats.embedder})"
    tables = []
    for title, counts in (
        ("source", s.by_source),
        ("status", s.by_status),
        ("env", s.by_env),
        ("root cause", s.by_root_cause),
    ):
        t = Table(title=f"by {title}", title_justify="left")
        t.add_column(title)
        t.add_column("cases", justify="right")
        for key, n in counts.items():
            t.add_row(shown(key), str(n))  # env ids come from stored cases
        tables.append(t)
    problem = [Text(stats.index_problem, style="red", overflow="fold")] if stats.index_problem else []
    return Group(head, *problem, *tables)


def format_effect(case: Case) -> str:
    """``+12.3 [+4.5, +20.1] return_iqm`` for a measured effect, ``lit.`` for a cited one, else ``-``."""
    v = case.verification
    if v is not None and v.effect is not None:
        return v.effect.text()
    return "lit." if case.literature is not None else "-"


def short_id(case_id: str) -> str:
    """``c-1a2b3c4d`` for a generated ``c-`` + 16 hex id (like a short git hash; `case show` takes it), else the id."""
    return case_id[:10] if re.fullmatch(r"c-[0-9a-f]{16}", case_id) else case_id


#: columns of the tab-separated form of the similar-cases table (printed when stdout is not a terminal)
SIMILAR_TSV = (
    "case_id",
    "rank",
    "similarity",
    "env_id",
    "algo",
    "symptoms",
    "root_causes",
    "patch",
    "effect",
    "status",
)


def print_similar(hits: list[SimilarCase], title: str) -> None:
    """The similar-cases table on a terminal; in a pipe, one tab-separated line per case with full ids.

    A rich table squeezed into a pipe's 80 columns folds every cell; the lines keep each column whole
    for ``cut`` and ``awk`` (``--json`` has everything).
    """
    if console.is_terminal:
        console.print(render_similar(hits, title=title))
        return
    typer.echo("\t".join(SIMILAR_TSV))
    for h in hits:
        c = h.case
        cells = [
            c.case_id,
            str(h.rank),
            f"{h.similarity:.2f}",
            c.subject.env_id,
            c.subject.algo,
            ",".join(c.signature.symptoms) or "-",
            ",".join(r.value for r in c.root_causes) or "-",
            c.patch.summary(),
            format_effect(c),
            c.status,
        ]
        typer.echo("\t".join(shown_cell(cell) for cell in cells))


def render_similar(hits: list[SimilarCase], title: str = "") -> Table:
    """The table of similar cases: short id, rank, similarity, env, symptoms, root cause, patch, effect, status."""
    t = Table(title=title or None, title_justify="left", show_lines=False)
    fold = {"overflow": "fold"}  # ids and tags are single long words: fold, never cut them off
    add_columns(
        t,
        [
            ("id", {"no_wrap": True, "style": "cyan"}),
            ("#", {"justify": "right"}),
            ("sim", {"justify": "right"}),
            ("env", fold),
            ("symptoms", fold),
            ("root cause", fold),
            ("patch", {}),
            ("effect ± CI", {}),
            ("status", fold),
        ],
    )
    for h in hits:
        c = h.case  # every cell from case text goes through shown(): no escape sequences, no markup
        t.add_row(
            shown(short_id(c.case_id)),
            str(h.rank),
            f"{h.similarity:.2f}",
            f"{shown(c.subject.env_id)}\n[dim]{shown(c.subject.algo)}[/]",
            shown(", ".join(c.signature.symptoms) or "-"),
            shown(", ".join(r.value for r in c.root_causes) or "-"),
            shown(c.patch.summary()),
            shown(format_effect(c)),
            shown(c.status),
        )
    return t


def render_case(case: Case) -> Group:
    """Readable panels: subject, signature, diagnosis, patch, verification, provenance."""
    s = case.subject
    panels = [
        Panel(
            f"{shown(s.env_id)} · {shown(s.algo)} · {s.traits.action_space.value} actions · "
            f"source {case.source.value} · status [bold]{shown(case.status)}[/]"
            + (f"\nscenario {shown(case.scenario)}" if case.scenario else "")
            + (f"\nsuccess: {shown(s.success)}" if s.success else ""),
            title=f"case {shown(case.case_id)}",
            title_align="left",
        ),
        Panel(_signature_text(case), title="signature", title_align="left"),
    ]
    if case.diagnosis is not None:
        lines = [f"{c.cause.value} ({c.confidence:.0%}) {shown(c.rationale)}" for c in case.diagnosis.causes]
        title = f"diagnosis ({shown(case.diagnosis.backend)})"
        panels.append(Panel("\n".join(lines) or "-", title=title, title_align="left"))
    parts = [f"- {shown(p.summary())}" for p in case.patch.parts]
    body = "\n".join([shown(case.patch.description), *parts] if case.patch.description else parts)
    panels.append(Panel(body, title="patch", title_align="left"))
    panels.append(Panel(_outcome_text(case), title="outcome", title_align="left"))
    return Group(*panels)


def _signature_text(case: Case) -> str:
    sig = case.signature
    feats = ", ".join(f"{k}={v:.3g}" for k, v in sorted(sig.features.items()))
    return shown(f"{sig.summary}\nsymptoms: {', '.join(sig.symptoms) or '-'}\nfeatures: {feats or '-'}")


def _outcome_text(case: Case) -> str:
    v, lines = case.verification, []
    if v is not None:
        lines.append(f"{v.status.value}: effect {format_effect(case)}")
        lines.append(
            f"{v.seeds} seeds, {v.budget_steps:,} budget steps, {v.env_steps:,} env steps, {v.wall_time_s:.0f} s"
        )
        if v.fixed is not None:  # older records were never judged
            gap = "" if v.gap_closed is None else f", closed {v.gap_closed:.0%} of the gap to the success threshold"
            lines.append(f"fixed (the agent now works): {'yes' if v.fixed else 'no'}{gap}")
        if v.reason:
            lines.append(f"reason: {v.reason}")
    if case.literature is not None:
        lines.append(f"literature: {case.literature.claim} ({case.literature.source})")
    p = case.provenance
    lines.append(
        f"created {p.created_at:%Y-%m-%d %H:%M} UTC" + (f" · remedy {p.remedy_version}" if p.remedy_version else "")
    )
    return shown("\n".join(lines)) if lines else "unverified"


def render_outcome(data: dict, place: str, no_store: bool = False) -> None:
    """Print a verification's outcome (the ``remedy verify --json`` shape, local or from the service): each
    case's table, where it was stored, and the seeds it used."""
    from remedy.cases.model import Case  # the case models load on first use: `remedy --help` needs none

    parts = [data["screen"], data] if data.get("screen") else [data]
    cases = [Case.model_validate(part["case"]) for part in parts]
    for case, part in zip(cases, parts):
        console.print(render_verification(case))
        where = (
            f"stored in {place}"
            if part["stored"]
            else ("not stored (--no-store)" if no_store else f"already in {place}")
        )
        console.print(f"{_stage(case)} case [bold]{shown(case.case_id)}[/] {shown(where)}", highlight=False)
    first = cases[0].verification.seed_base if cases[0].verification is not None else 0
    next_base = data["next_seed_base"]
    console.print(
        f"[dim]seeds used: {first}..{next_base - 1}; to re-verify on fresh seeds pass --seed-base {next_base}[/]",
        highlight=False,
    )


def _stage(case: Case) -> str:
    """The verification stage of a case this command verified (screen or confirm)."""
    if case.verification is None:
        raise ValueError(f"case {case.case_id} carries no verification")
    return case.verification.stage.value


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.3g} ± {sd:.2g}"


def _budget_source(v) -> str:
    """`` (source kb: c-1, c-2)``: where the budget came from, when the case recorded it."""
    if v.budget_source is None:
        return ""
    cases = f": {', '.join(v.budget_cases)}" if v.budget_cases else ""
    return shown(f" (source {v.budget_source}{cases})")


def render_verification(case: Case) -> Group:
    """The effect table (arm, seeds, metric mean ± spread, per-seed values), secondary effects, and a status line."""
    v = case.verification
    if v is None:
        return Group("[dim]not verified[/]")
    if v.effect is None:
        return Group(
            f"[bold red]{v.status.value}[/]: {shown(v.reason)}",
            f"[dim]env steps {v.env_steps:,} · wall {v.wall_time_s:.1f}s · budget {v.budget_steps:,}{_budget_source(v)}[/]",
        )
    e = v.effect
    # case text (env id, patch, reasons that quote reward code's errors) goes through shown()
    arms = Table(title=f"{shown(case.subject.env_id)} · {shown(case.patch.summary())}", title_justify="left")
    for col in ("arm", "seeds", f"{shown(e.metric)} mean ± sd", "per seed"):
        arms.add_column(col)
    for arm in ("treatment", "control"):
        values = v.per_seed.get(arm, [])
        arms.add_row(arm, str(len(values)), _spread(values), ", ".join(f"{x:.3g}" for x in values))
    effects = Table(show_header=True)
    for col in ("metric", "treatment", "control", "effect", f"{e.confidence_level:.0%} CI", "P(improve)"):
        effects.add_column(col)
    for eff in [e, *v.secondary.values()]:
        pi = f"{eff.prob_improvement:.2f}" if eff.prob_improvement is not None else "-"
        name = f"[bold]{shown(eff.metric)}[/]" if eff is e else shown(eff.metric)
        effects.add_row(
            name,
            f"{eff.treatment:.3g}",
            f"{eff.control:.3g}",
            f"{eff.diff:+.3g}",
            f"[{eff.ci_low:+.3g}, {eff.ci_high:+.3g}]",
            pi,
        )
    seeds = f"seeds {v.seed_base}..{v.seed_base + v.seeds - 1}"
    status = (
        f"{v.stage.value} status {status_markup(v.status.value, bold=True)} · {seeds} · env steps {v.env_steps:,}"
        f" · wall {v.wall_time_s:.1f}s · budget {v.budget_steps:,}/arm{_budget_source(v)}"
    )
    if v.comparison == "budget_vs_none":
        status += " · more training vs none (the control is the unpatched checkpoint)"
    return Group(arms, effects, status, f"[dim]{shown(v.reason)}[/]")


def render_job(job: JobOut) -> None:
    """One line per job: id, kind, state, last progress message (and done/total), and its error if any."""
    p = job.progress
    console.print(
        f"{shown(job.job_id)}  {shown(job.kind)}  [bold]{shown(job.state)}[/]  {shown(p.message)}"
        + (f"  {p.done}/{p.total}" if p.total else "")
        + (f"\n  error: {shown(job.error)}" if job.error else ""),
        highlight=False,
        soft_wrap=True,
    )


def render_fix_job(result: dict, job_id: str) -> None:
    """A fix job's result (the ``remedy fix --json`` shape): each attempt, why it stopped, and where the
    service wrote the winning patch and the fixed agent."""
    for a in result.get("attempts", []):
        console.print(
            shown(f"round {a.get('round')}: {a.get('family')} -> {a.get('status')} ({a.get('case_id')})"),
            highlight=False,
        )
    console.print(
        shown(f"stopped: {result.get('stop_reason')}; fixed: {bool(result.get('fixed'))} (job {job_id})"),
        highlight=False,
    )
    for key, what in (("patch_path", "winning patch"), ("fixed_dir", "fixed agent")):
        if result.get(key):
            console.print(
                f"{what} (on the service's machine): [bold]{shown(result[key])}[/]", highlight=False, soft_wrap=True
            )
