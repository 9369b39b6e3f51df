"""Bench reports: the Markdown and JSON of a pass or a curve, per split next to the baselines."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .bench import DEFAULT_REPORT_DIR, BenchReport, CurveReport

__all__ = ["render_markdown", "render_passes", "write_report"]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _val(x: Any, attr: str) -> str:
    return _pct(getattr(x, attr)) if x else "-"


def _fmt(v: float | None, spec: str = ".0f") -> str:
    return "-" if v is None else format(v, spec)


def _works(v: bool | None) -> str:
    """Strict "fixed" (the agent now works): yes / no, or '-' for a result recorded before it was judged."""
    return "-" if v is None else ("yes" if v else "no")


def _scenario_rows(report: BenchReport) -> list[str]:
    rows = [
        "| scenario | ground truth | first diagnosis (top 3) | top-1 | top-3 | improved | fixed (works) "
        "| attempts to fix | env steps to fix | wall s to fix | winning patch | effect [CI] |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report.scenarios:
        e = r.winning_effect
        eff = "-" if e is None else f"{e['diff']:+.3g} [{e['ci_low']:+.3g}, {e['ci_high']:+.3g}] {e['metric']}"
        diag = ", ".join(r.first_causes[:3]) or (f"error: {r.error}" if r.error else "-")
        rows.append(
            f"| {r.scenario} | {', '.join(r.ground_truth)} | {diag} | {'yes' if r.top1 else 'no'} "
            f"| {'yes' if r.top3 else 'no'} | {'yes' if r.fixed else 'no'} | {_works(r.works)} "
            f"| {_fmt(r.attempts_to_fix)} "
            f"| {_fmt(r.env_steps_to_fix, ',.0f')} | {_fmt(r.wall_time_to_fix_s)} | {r.winning_patch or '-'} "
            f"| {eff} |"
        )
    return rows


def _summary_rows(reports: Sequence[BenchReport]) -> list[str]:
    head = "| figure | " + " | ".join(r.label for r in reports) + " |"
    rows = [head, "| --- |" + " --- |" * len(reports)]
    figures = (
        ("scenarios", lambda s: str(s.n)),
        ("top-1 accuracy", lambda s: f"{s.top1_accuracy:.0%}"),
        ("top-3 accuracy", lambda s: f"{s.top3_accuracy:.0%}"),
        ("confirmed-improved rate", lambda s: f"{s.fix_rate:.0%}"),
        ("fixed rate (the agent now works)", lambda s: f"{s.works_rate:.0%}"),
        ("mean attempts to fix", lambda s: _fmt(s.mean_attempts_to_fix, ".2f")),
        ("mean env steps to fix", lambda s: _fmt(s.mean_env_steps_to_fix, ",.0f")),
        ("mean wall s to fix", lambda s: _fmt(s.mean_wall_time_to_fix_s, ".0f")),
        ("candidates stopped early (race)", lambda s: str(s.stopped_early)),
        ("total env steps", lambda s: f"{s.total_env_steps:,}"),
        ("total wall s", lambda s: f"{s.total_wall_time_s:.0f}"),
    )
    for name, get in figures:
        rows.append(f"| {name} | " + " | ".join(get(r.summary) for r in reports) + " |")
    return rows


_ARM_NAMES = {"tuned_defaults": "tuned defaults (RL Zoo)", "random_search": "random search"}


def _split_rows(passes: Sequence[BenchReport]) -> list[str]:
    """Per split: Remedy's figures (one column per pass) next to the baselines' (one column each)."""
    lines: list[str] = []
    for split in ("dev", "holdout"):
        sums = [next((x for x in p.splits if x.split == split), None) for p in passes]
        if not any(sums):
            continue
        ref = next(x for x in sums if x is not None)
        arms = sorted({a for x in sums if x for a in x.baseline_fix_rates})
        head = [
            "figure",
            *[f"Remedy ({p.label})" for p in passes],
            f"most frequent cause ({ref.baseline_answer[0]})" if ref.baseline_answer else "most frequent cause",
            "fixed top-3",
            *[_ARM_NAMES.get(a, a) for a in arms],
        ]
        fix_arms = [_pct(max((x.baseline_fix_rates.get(a, 0.0) for x in sums if x), default=None)) for a in arms]
        rows = [
            ("scenarios", [str(x.n) if x else "-" for x in sums], [str(ref.n), str(ref.n)] + [str(ref.n)] * len(arms)),
            (
                "top-1 accuracy",
                [_val(x, "top1_accuracy") for x in sums],
                [_pct(ref.baseline_top1), "-"] + ["-"] * len(arms),
            ),
            (
                "top-3 accuracy",
                [_val(x, "top3_accuracy") for x in sums],
                ["-", _pct(ref.baseline_top3)] + ["-"] * len(arms),
            ),
            ("confirmed-improved rate (solvable)", [_val(x, "fix_rate") for x in sums], ["-", "-", *fix_arms]),
            (
                "fixed rate, agent works (solvable)",
                [_val(x, "works_rate") for x in sums],
                ["-", "-"] + ["-"] * len(arms),
            ),
            (
                "... by more training only",
                [_val(x, "budget_only_fix_rate") for x in sums],
                ["-", "-"] + ["-"] * len(arms),
            ),
            ("... by other patches", [_val(x, "other_fix_rate") for x in sums], ["-", "-"] + ["-"] * len(arms)),
            (
                "fix-rate denominator",
                [str(x.fix_denominator) if x else "-" for x in sums],
                ["-", "-"] + [str(ref.fix_denominator)] * len(arms),
            ),
        ]
        lines += ["", f"## {split}", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        lines += [f"| {name} | " + " | ".join(a + b) + " |" for name, a, b in rows]
        lines += [
            "",
            f"Fixed top-3 answer: {', '.join(ref.baseline_answer) or '-'} (the most frequent ground-truth "
            "causes on the bundled dev split).",
            f"Unsolvable (oracle did not fix it, or the patient did not fail; left out of fix rates): "
            f"{', '.join(ref.unsolvable) or 'none'}.",
            f"Oracle not checked (counted in fix rates): {', '.join(ref.unchecked) or 'none'}.",
        ]
    return lines


def render_markdown(report: BenchReport | CurveReport) -> str:
    """The report as Markdown: overall figures, then one table per pass."""
    if isinstance(report, CurveReport):
        return render_passes([report.cold, report.warm], "Meta-learning curve (cold vs warm)")
    return render_passes([report], "Bench run")


def render_passes(passes: Sequence[BenchReport], title: str) -> str:
    """Passes of the same suite side by side (one column each), then one scenario table per pass."""
    s = passes[0].settings
    lines = [
        f"# {title}",
        "",
        f"Started {passes[0].started_at}; diagnoser `{s.diagnoser}`, {s.rounds} round(s), "
        f"{s.candidates} candidate(s) per round, {s.seeds} seed(s) per arm, budget "
        f"{'per scenario' if s.budget is None else f'{s.budget:,} steps'}.",
        "",
        "Accuracy scores the first diagnosis against the scenario's ground truth; costs are means over "
        "the scenarios that were fixed. Retrieval excludes each scenario's own cases and the example cases it "
        "declares as mirrors. A figure counts as Remedy's only above its baselines.",
        *_split_rows(passes),
        "",
        "## Overall (both splits pooled)",
        "",
        *_summary_rows(passes),
    ]
    for p in passes:
        lines += ["", f"## Scenarios ({p.label})", "", *_scenario_rows(p)]
    return "\n".join(lines) + "\n"


def write_report(report: BenchReport | CurveReport, out_dir: str | Path = DEFAULT_REPORT_DIR) -> list[Path]:
    """Write ``<stamp>-<kind>.json/.md`` and ``latest.json/.md`` under ``out_dir``; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    kind = "curve" if isinstance(report, CurveReport) else report.label
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    data = json.dumps(report.as_dict(), indent=2, default=str) + "\n"
    text = render_markdown(report)
    paths = []
    for stem in (f"{stamp}-{kind}", "latest"):
        for suffix, body in ((".json", data), (".md", text)):
            path = out / f"{stem}{suffix}"
            path.write_text(body)
            paths.append(path)
    return paths
