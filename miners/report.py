"""The researchers' report: mined rules, their evidence and the cases behind them, as Markdown and HTML.

``write_report`` renders ``heuristics-DATE.md`` (plots as PNG files in ``heuristics-DATE-plots/``
next to it) and a self-contained ``heuristics-DATE.html`` (CSS inline, plots as base64 data URIs).
The text depends only on the rules, the cases, the date and the seed, so two renders of the same
KB are identical. Files are written to temporary names in the target directory and renamed into
place only once everything is rendered: a failure leaves the previous report intact.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import markupsafe

from remedy.cases.errors import ReportPathError
from remedy.cases.model import Case, Status
from remedy.cases.store import CaseStore

from . import report_templates
from .model import CaseRef, Rule, RuleStatus
from .plots import before_after_plot, forest_plot
from .store import RuleStore

__all__ = ["ReportPaths", "HOW_TO_MINE", "write_report", "write_kb_report", "render_report", "RenderedReport"]

HOW_TO_MINE = (
    "Fill the KB with verified cases (`remedy fix RUN_DIR`, `remedy bench run`), then run `remedy mine` "
    "and review the proposed rules with `remedy rules list|show|accept|reject`."
)
#: example cases plotted per rule, and in all
_EXAMPLES_PER_RULE = 3
_EXAMPLES_MAX = 9


@dataclass(frozen=True)
class ReportPaths:
    """Where a report was written (the Markdown, the HTML, the PNG plots the Markdown links) and its rule counts."""

    markdown: Path
    html: Path
    plots: list[Path] = field(default_factory=list)
    #: rules per report section: accepted, flagged, proposed, rejected
    counts: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class RenderedReport:
    """A report in memory: the two texts and the plots (file name → PNG bytes) the Markdown links."""

    markdown: str
    html: str
    plots: dict[str, bytes]
    counts: dict[str, int]


def _num(x: float | None, fmt: str = "+.3g") -> str:
    return "–" if x is None else format(x, fmt)


def _sort_key(rule: Rule) -> tuple[float, float, str]:
    # strongest evidence first; the id breaks ties so the order never depends on the input order
    return (rule.evidence.q_value, -rule.evidence.effect, rule.id)


def _colour(rule: Rule) -> str:
    return "flagged" if rule.status is RuleStatus.accepted and rule.flag else rule.status.value


def _anchor(case_id: str) -> str:
    return f"case-{case_id}"


def _ref_view(ref: CaseRef) -> dict[str, Any]:
    effect = f"{_num(ref.diff)} {ref.metric}".strip() if ref.diff is not None else "–"
    if ref.effect is not None:
        effect += f" (pooled {_num(ref.effect)})"
    return {
        "id": ref.case_id,
        "anchor": _anchor(ref.case_id),
        "scenario": ref.scenario or "–",
        "env": ref.env_id or "–",
        "status": ref.status.value,
        "effect": effect,
    }


def _rule_view(rule: Rule) -> dict[str, Any]:
    ev = rule.evidence
    return {
        "id": rule.id,
        "colour": _colour(rule),
        "condition": rule.condition_text,
        "family": rule.family.value,
        "cause": rule.cause.value if rule.cause else "",
        "params": ", ".join(f"{k}={v}" for k, v in sorted(rule.params.items())),
        "support": ev.support,
        "wins": ev.wins,
        "fixed": ev.fixed,
        "win_rate": f"{ev.win_rate:.0%}",
        "effect": f"{_num(ev.effect)} [{_num(ev.ci_low)}, {_num(ev.ci_high)}]",
        "level": f"{ev.confidence_level:.0%}",
        "scale": ev.effect_scale,
        "q": _num(ev.q_value, ".3g"),
        "p": _num(ev.p_value, ".3g"),
        "mined_on": ev.mined_at.date().isoformat(),
        "seed": ev.seed,
        "flag": rule.flag,
        "supporting": [_ref_view(c) for c in ev.supporting],
        "counter": [_ref_view(c) for c in ev.counter],
        "reviews": [
            {"decision": v.decision.value, "reviewer": v.reviewer, "on": v.at.date().isoformat(), "note": v.note}
            for v in rule.reviews
        ],
    }


def _case_view(ref: CaseRef, case: Case | None) -> dict[str, Any]:
    view = _ref_view(ref) | {"in_kb": case is not None}
    if case is None:
        return view
    v = case.verification
    per_seed = (
        "; ".join(f"{arm} {', '.join(f'{x:.3g}' for x in xs)}" for arm, xs in sorted(v.per_seed.items())) if v else ""
    )
    return view | {
        "env": case.subject.env_id,
        "algo": case.subject.algo,
        "scenario": case.scenario or "–",
        "symptoms": ", ".join(case.signature.symptoms) or "none",
        "patch": case.patch.summary(),
        "status": case.status,
        "stage": v.stage.value if v else "–",
        "comparison": v.comparison if v else "–",
        "effect": v.effect.text() if v and v.effect else "–",
        "seeds": v.seeds if v else 0,
        "budget": v.budget_steps if v else 0,
        "per_seed": per_seed,
    }


def _cited(rules: Iterable[Rule]) -> list[CaseRef]:
    """Every case a rule cites, once, in case-id order."""
    refs: dict[str, CaseRef] = {}
    for rule in rules:
        for ref in (*rule.evidence.supporting, *rule.evidence.counter):
            refs.setdefault(ref.case_id, ref)
    return [refs[k] for k in sorted(refs)]


def _example_refs(showcased: Sequence[Rule]) -> list[tuple[Rule, CaseRef, str]]:
    """The top supporting cases of each showcased rule (its counter-evidence when nothing supports it)."""
    picked: list[tuple[Rule, CaseRef, str]] = []
    seen: set[str] = set()
    for rule in showcased:
        ev = rule.evidence
        refs, role = (ev.supporting, "supporting") if ev.supporting else (ev.counter, "counter-evidence")
        best = sorted(refs, key=lambda r: (-(r.effect if r.effect is not None else r.diff or 0.0), r.case_id))
        for ref in [r for r in best if r.case_id not in seen][:_EXAMPLES_PER_RULE]:
            seen.add(ref.case_id)
            picked.append((rule, ref, role))
    return picked[:_EXAMPLES_MAX]


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _examples(
    sections: Mapping[str, list[Rule]], cases: Mapping[str, Case], plot_dir: str, seed: int
) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    accepted = sections["accepted"] + sections["flagged"]
    showcased = sorted(accepted, key=_sort_key) if accepted else sections["proposed"][:3]
    views, plots = [], {}
    for rule, ref, role in _example_refs(showcased):
        case = cases.get(ref.case_id)
        png = before_after_plot(case, seed=seed) if case is not None else None
        if png is None:
            continue
        name = f"case-{ref.case_id}.png"
        plots[name] = png
        views.append(
            {"case": _ref_view(ref), "rule": rule.id, "role": role, "file": f"{plot_dir}/{name}", "uri": _data_uri(png)}
        )
    return views, plots


def _sections(rules: Sequence[Rule]) -> dict[str, list[Rule]]:
    ordered = sorted(rules, key=_sort_key)
    return {
        "accepted": [r for r in ordered if _colour(r) == "accepted"],
        "flagged": [r for r in ordered if _colour(r) == "flagged"],
        "proposed": [r for r in ordered if r.status is RuleStatus.proposed],
        "rejected": [r for r in ordered if r.status is RuleStatus.rejected],
    }


def _forest(sections: Mapping[str, list[Rule]], plot_dir: str) -> tuple[dict[str, str] | None, dict[str, bytes]]:
    shown = sections["accepted"] + sections["flagged"] + sections["proposed"]
    if not shown:
        return None, {}
    scales = {r.evidence.effect_scale for r in shown}
    png = forest_plot(shown, scales.pop() if len(scales) == 1 else "pooled effect (scale as each rule states)")
    return {"file": f"{plot_dir}/forest.png", "uri": _data_uri(png)}, {"forest.png": png}


def _environment(autoescape: bool) -> jinja2.Environment:
    env = jinja2.Environment(
        autoescape=autoescape,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    # Markdown: table cells end at "|" and raw "<" would open HTML; newlines would break a bullet
    env.filters["md"] = lambda s: str(s).replace("|", "\\|").replace("<", "&lt;").replace("\n", " ")
    env.filters["code"] = _backticks_to_code
    return env


def _backticks_to_code(text: str) -> markupsafe.Markup:
    """HTML: escape ``text``, then show its `backticked` spans as <code>."""
    escaped = str(markupsafe.escape(text))
    return markupsafe.Markup(re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped))


def plot_dir_name(date: dt.date) -> str:
    """Name of the folder, next to the Markdown, that holds its PNG plots."""
    return f"heuristics-{date.isoformat()}-plots"


def render_report(
    rules: Sequence[Rule],
    cases: Mapping[str, Case],
    *,
    date: dt.date,
    seed: int = 0,
    kb_label: str = "",
    verified_cases: int | None = None,
    stopped_early: int = 0,
) -> RenderedReport:
    """Render the report in memory (see :func:`write_report`); nothing touches the disk."""
    sections = _sections(rules)
    plot_dir = plot_dir_name(date)
    forest, plots = _forest(sections, plot_dir)
    examples, example_plots = _examples(sections, cases, plot_dir, seed)
    context = {
        "date": date.isoformat(),
        "kb": kb_label or "–",
        "verified_cases": len(cases) if verified_cases is None else verified_cases,
        "stopped_early": stopped_early,
        "n": {k: len(v) for k, v in sections.items()} | {"total": len(rules)},
        "how_to_mine": HOW_TO_MINE,
        "level": "95%",
        "forest": forest,
        "examples": examples,
        "all_rules": [_rule_view(r) for r in sorted(rules, key=_sort_key)],
        "cases": [_case_view(ref, cases.get(ref.case_id)) for ref in _cited(rules)],
        **{name: [_rule_view(r) for r in group] for name, group in sections.items()},
    }
    md = _environment(False).from_string(report_templates.MARKDOWN).render(context)
    html = _environment(True).from_string(report_templates.HTML).render(context)
    return RenderedReport(md, html, plots | example_plots, {k: len(v) for k, v in sections.items()})


def _writable_dir(out_dir: Path) -> None:
    """Create ``out_dir`` if needed and prove it takes files, or raise :class:`ReportPathError`."""
    what = "pass --out a writable directory"
    if out_dir.exists() and not out_dir.is_dir():
        raise ReportPathError(f"report directory {out_dir} is a file, not a directory; {what}")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as err:
        raise ReportPathError(
            f"cannot write the report to {out_dir} ({err.strerror or err}); fix its permissions or {what}"
        ) from err


def _write_atomically(files: Mapping[Path, bytes]) -> None:
    """Write every file to a temporary name beside it, then rename them all into place."""
    staged: list[tuple[Path, Path]] = []
    try:
        for path, data in files.items():
            fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            staged.append((Path(name), path))
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.chmod(name, 0o644)  # mkstemp's 0600 would hide a shared report from its readers
        for tmp, target in staged:
            os.replace(tmp, target)
    except OSError as err:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        where = next(iter(files)).parent
        raise ReportPathError(
            f"writing the report to {where} failed ({err.strerror or err}); fix it and run again"
        ) from err


def write_report(
    rules: Sequence[Rule],
    cases: Mapping[str, Case],
    out_dir: Path,
    *,
    date: dt.date | None = None,
    seed: int = 0,
    kb_label: str = "",
    verified_cases: int | None = None,
    stopped_early: int = 0,
) -> ReportPaths:
    """Write ``heuristics-DATE.md`` (with its PNG plots) and a self-contained ``heuristics-DATE.html``.

    ``cases`` maps case id → case for (at least) the cases the rules cite; a cited case missing
    from it is listed as not in the KB. ``verified_cases`` is the number of verified cases in the
    KB the rules were mined from (default: ``len(cases)``); ``stopped_early`` the candidates a race
    dropped at stage 1 (no verdict; a summary row when any). ``seed fixes the jitter of the plots' seed
    points. Raises :class:`ReportPathError` when ``out_dir`` cannot take the files; then nothing
    is written.
    """
    date = date or dt.date.today()
    out_dir = Path(out_dir)
    _writable_dir(out_dir)
    report = render_report(
        rules,
        cases,
        date=date,
        seed=seed,
        kb_label=kb_label,
        verified_cases=verified_cases,
        stopped_early=stopped_early,
    )
    stem = out_dir / f"heuristics-{date.isoformat()}"
    plot_dir = out_dir / plot_dir_name(date)
    if report.plots:
        _writable_dir(plot_dir)
    plots = {plot_dir / name: png for name, png in sorted(report.plots.items())}
    _write_atomically(
        {**plots, stem.with_suffix(".md"): report.markdown.encode(), stem.with_suffix(".html"): report.html.encode()}
    )
    if plot_dir.is_dir():  # plots of an earlier render of the same day that this one no longer shows
        for stale in set(plot_dir.glob("*.png")) - set(plots):
            stale.unlink(missing_ok=True)
    return ReportPaths(stem.with_suffix(".md"), stem.with_suffix(".html"), list(plots), report.counts)


def write_kb_report(
    store: CaseStore, out_dir: Path, *, date: dt.date | None = None, seed: int = 0, kb_label: str = ""
) -> ReportPaths:
    """Write the report of a KB: its stored rules (``miners.store.RuleStore``) and the cases they cite."""
    _writable_dir(Path(out_dir))  # fail before reading the KB when the files could not be written
    rules = RuleStore(store).all()
    cited = store.get_many(ref.case_id for ref in _cited(rules))
    by_status = store.stats().by_status
    # candidates a race stopped early have no verdict: counted apart, not as verified cases
    early = by_status.get(Status.stopped_early.value, 0)
    verified = sum(n for status, n in by_status.items() if status in Status.__members__) - early
    return write_report(
        rules,
        {c.case_id: c for c in cited},
        out_dir,
        date=date,
        seed=seed,
        kb_label=kb_label,
        verified_cases=verified,
        stopped_early=early,
    )
