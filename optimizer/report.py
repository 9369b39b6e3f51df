"""The job's short Markdown report: before/after validation scores, sizes, the decision and why."""

from __future__ import annotations

from typing import TYPE_CHECKING

from remedy.retrieval.offline import OfflineSettings

from .metric import score_prediction
from .offline import Prepared, predict

if TYPE_CHECKING:
    from .job import OptimizeOptions, OptimizeResult
    from .versions import ProgramVersion

__all__ = ["render_report"]


def render_report(
    opts: OptimizeOptions,
    result: OptimizeResult,
    active: ProgramVersion | None,
    val: list[Prepared],
    before: OfflineSettings | None,
    after: OfflineSettings | None,
) -> str:
    """The report of one run, as Markdown."""
    v = result.version
    assert v is not None  # only runs that stored a version are reported
    was = active.id if active is not None else "built-in defaults"
    lines = [
        f"# remedy optimize: {v.id} ({v.created_at:%Y-%m-%d %H:%M UTC})",
        "",
        f"- backend `{v.backend}`, optimizer `{v.optimizer}`, trials {opts.trials}, seed {opts.seed}, "
        f"margin {opts.margin:g}, validation fraction {opts.val_fraction:g}",
        f"- examples: {result.train_size} train, {result.val_size} validation (split by scenario / user run); "
        f"{result.new_cases} new verified cases since the last run",
        "",
        "| | active before | new version |",
        "| --- | --- | --- |",
        f"| program | {was} | {v.id} |",
        f"| validation score | {_num(result.active_val)} | {_num(result.new_val)} |",
        f"| train score | {_num(result.train_score_before)} | {_num(result.train_score_after)} |",
        "",
        f"**{'Promoted' if v.promoted else 'Not promoted'}**: {v.reason}.",
        "",
    ]
    if result.changed:
        lines += ["Changed knobs:", "", "| knob | before | after |", "| --- | --- | --- |"]
        lines += [f"| `{k}` | {_num(a)} | {_num(b)} |" for k, (a, b) in sorted(result.changed.items())]
        lines.append("")
    if val and before is not None and after is not None:
        lines += _per_example(val, before, after)
    if result.details and v.backend == "ranker":
        lines += _ranker_details(result.details)
    elif result.details:
        lines += _llm_details(result.details)
    return "\n".join(lines) + "\n"


def _per_example(val: list[Prepared], before: OfflineSettings, after: OfflineSettings) -> list[str]:
    lines = [
        "Validation examples:",
        "",
        "| group | confirmed fix | improved / fixed | before | after | after: top cause, top family |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for p in val:
        ex = p.example
        causes, families = predict(after, p.context)
        b = score_prediction(ex, *predict(before, p.context)).score
        a = score_prediction(ex, causes, families).score
        fixed = ", ".join(f.value for f in ex.families) or "none"
        top = f"{causes[0].value if causes else '-'}, {families[0].value if families else '-'}"
        lines.append(f"| {ex.group} | {fixed} | {ex.n_improved} / {ex.n_fixed} | {b:.2f} | {a:.2f} | {top} |")
    return [*lines, ""]


def _llm_details(d: dict) -> list[str]:
    """The llm backend's run: which LMs, the inner split the optimizer selected on, per-example validation scores."""
    lines = [
        f"- task LM `{d.get('lm')}`, reflection LM `{d.get('reflection_lm') or '-'}`; started from {d.get('start')}",
        f"- the optimizer learned on {d.get('inner_train')} and selected on {d.get('inner_val')} train examples "
        f"(validation unseen); {d.get('demos')} demos, instructions {'changed' if d.get('instructions_changed') else 'unchanged'}",
        "",
        "| validation example | active before | new version |",
        "| --- | --- | --- |",
    ]
    lines += [f"| {key} | {a:.2f} | {b:.2f} |" for key, (a, b) in sorted(d.get("val_scores", {}).items())]
    return [*lines, ""]


def _ranker_details(d: dict) -> list[str]:
    """The ranker's fit: the vote's own validation score beside it, rows per outcome, out-of-fold calibration."""
    return [
        f"- the deterministic vote alone scores {_num(d.get('vote_val'))} on validation "
        f"(active ranker before: {d.get('active_ranker') or 'none'})",
        f"- fitted on {d.get('rows')} attempts of {d.get('groups')} groups: {d.get('positives')} confirmed "
        f"`{d.get('label')}` ({_num(d.get('fixed_positives'))} fixed: the agent now works); outcomes "
        f"{d.get('statuses')}; row weights {d.get('weights')}",
        f"- chosen C {_num(d.get('C'))}; grouped out-of-fold log loss {_num(d.get('oof_log_loss'))} "
        f"(base rate {_num(d.get('base_log_loss'))}), Brier {_num(d.get('oof_brier'))} "
        f"(base rate {_num(d.get('base_brier'))})",
        "",
    ]


def _num(x: object) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3f}" if abs(x) < 1000 else f"{x:.4g}"
    return str(x)
