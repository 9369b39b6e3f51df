"""`remedy mine` and `remedy rules list|show|accept|reject` (the meta-rule issue).

Each command calls one method of the KB it is given (:func:`.connect.open_kb`: the local one, or
with ``--server URL`` / ``$REMEDY_SERVER`` a running `remedy serve`, which answers the same calls)
and renders the result the same way for both.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from .common import DEFAULT_KB, JsonOption, KbOption, ServerOption, add_columns, console, print_json, status_markup
from .connect import open_kb

if TYPE_CHECKING:
    from remedy.kb.facade import MineReport
    from remedy.miners import Rule
    from remedy.miners.model import CaseRef

__all__ = ["mine_cmd", "rules_list", "rules_show", "rules_accept", "rules_reject"]


class _Status(StrEnum):
    proposed = "proposed"
    accepted = "accepted"
    rejected = "rejected"


IdArgument = Annotated[str, typer.Argument(help="Rule id, as `remedy rules list` shows it.")]
ReviewerOption = Annotated[
    str | None,
    typer.Option(
        "--reviewer", help="Who reviews (default: $USER, or the login name; with --server: the token's name)."
    ),
]


def mine_cmd(
    min_support: Annotated[int, typer.Option("--min-support", min=1, help="Fewest matching attempts per rule.")] = 3,
    fdr: Annotated[
        float, typer.Option("--fdr", min=0.0, max=1.0, help="False-discovery rate (Benjamini–Hochberg) to keep a rule.")
    ] = 0.1,
    max_conditions: Annotated[
        int, typer.Option("--max-conditions", min=1, max=3, help="Most conditions in one rule.")
    ] = 2,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the bootstrap intervals.")] = 0,
    kb: KbOption = Path(DEFAULT_KB),
    as_json: JsonOption = False,
    server: ServerOption = None,
) -> None:
    """Mine rules from the KB's measured cases and store them as proposed (re-mining updates their evidence)."""
    with open_kb(kb, server, reconcile=False) as base:
        report = base.mine(min_support=min_support, fdr=fdr, max_conditions=max_conditions, seed=seed)
    if as_json:
        print_json(report.model_dump(mode="json"))
        return
    _render_mine(report, fdr)


def _render_mine(report: MineReport, fdr: float) -> None:
    head = (
        f"{report.attempts} measured attempts, {report.tested} candidate rules tested, "
        f"{len(report.rules)} kept at q ≤ {fdr:g}"
    )
    if not report.rules:
        console.print(f"nothing to mine: {head}; no rule beats the 5% false-improved rate often enough", soft_wrap=True)
    else:
        console.print(head, soft_wrap=True)
        console.print(_rule_table(report.rules, title="mined rules"))
    new, updated, flagged = report.new, report.updated, report.flagged
    console.print(f"new {len(new)} / updated {len(updated)} / flagged {len(flagged)}", highlight=False)
    for rid, flag in flagged.items():
        console.print(f"[yellow]flagged[/] {rid}: {flag}", highlight=False, soft_wrap=True)


def _effect(rule: Rule) -> str:
    e = rule.evidence
    return f"{e.effect:+.2f} [{e.ci_low:+.2f}, {e.ci_high:+.2f}]"


def _rule_table(rules: list[Rule], title: str, status: bool = False) -> Table:
    table = add_columns(
        Table(title=title, title_justify="left"),
        [
            ("id", {"no_wrap": True}),
            ("condition", {}),
            ("→ family", {}),
            ("support", {"justify": "right"}),
            ("wins/support", {"justify": "right"}),
            ("effect [95% CI]", {"no_wrap": True}),
            ("q", {"justify": "right"}),
            *([("status", {}), ("flag", {})] if status else []),
        ],
    )
    for r in rules:
        e = r.evidence
        row = [
            r.id,
            r.condition_text,
            r.family.value,
            str(e.support),
            f"{e.wins}/{e.support}",
            _effect(r),
            f"{e.q_value:.3g}",
        ]
        if status:
            row += [r.status.value, f"[yellow]{r.flag}[/]" if r.flag else ""]
        table.add_row(*row)
    return table


def rules_list(
    status: Annotated[_Status | None, typer.Option("--status", help="Only rules in this review state.")] = None,
    kb: KbOption = Path(DEFAULT_KB),
    as_json: JsonOption = False,
    server: ServerOption = None,
) -> None:
    """Stored rules with their evidence and review state."""
    wanted = status.value if status else None
    with open_kb(kb, server, reconcile=False) as base:
        rules = base.rules(wanted)
    if as_json:
        print_json([r.model_dump(mode="json") for r in rules])
        return
    if not rules:
        console.print("no rules" + (f" {status.value}" if status else "") + "; run `remedy mine`", highlight=False)
        return
    console.print(_rule_table(rules, title=f"{len(rules)} rules", status=True))


def rules_show(
    rule_id: IdArgument, kb: KbOption = Path(DEFAULT_KB), as_json: JsonOption = False, server: ServerOption = None
) -> None:
    """One rule: condition, remedy, evidence, supporting and counter cases, reviews."""
    with open_kb(kb, server, reconcile=False) as base:
        rule = base.rule(rule_id)
    if as_json:
        print_json(rule.model_dump(mode="json"))
        return
    e = rule.evidence
    lines = [
        f"[bold]{rule.id}[/]  {rule.status.value}" + (f"  [yellow]flag: {rule.flag}[/]" if rule.flag else ""),
        f"when     {rule.condition_text}"
        + (f"  (same cases: {', '.join(rule.equivalent)})" if rule.equivalent else ""),
        f"then     {rule.family.value}"
        + (f" for {rule.cause.value}" if rule.cause else "")
        + (f"  params {rule.params}" if rule.params else ""),
        f"evidence {e.wins}/{e.support} improved ({e.win_rate:.0%}); effect {_effect(rule)} on {e.effect_scale}",
        f"         p {e.p_value:.3g}, q {e.q_value:.3g} (Benjamini–Hochberg); mined {e.mined_at:%Y-%m-%d %H:%M} "
        f"UTC, seed {e.seed}",
    ]
    for line in lines:
        console.print(line, highlight=False, soft_wrap=True)
    console.print(_refs_table("supporting cases", e.supporting))
    console.print(_refs_table("counter-evidence", e.counter))
    for r in rule.reviews:
        note = f": {r.note}" if r.note else ""
        console.print(
            f"review   {r.decision.value} by {r.reviewer} at {r.at:%Y-%m-%d %H:%M} UTC{note}", highlight=False
        )
    if not rule.reviews:
        console.print("review   none yet (`remedy rules accept ID` or `remedy rules reject ID --note TEXT`)")


def _refs_table(title: str, refs: list[CaseRef]) -> Table:
    table = add_columns(
        Table(title=f"{title} ({len(refs)})", title_justify="left"),
        [("case", {"no_wrap": True}), ("scenario", {}), ("env", {}), ("status", {}), ("diff", {}), ("effect", {})],
    )
    for ref in refs:
        diff = "-" if ref.diff is None else f"{ref.diff:+.3g} {ref.metric}"
        eff = "-" if ref.effect is None else f"{ref.effect:+.2f}"
        table.add_row(ref.case_id, ref.scenario or "-", ref.env_id, status_markup(ref.status.value), diff, eff)
    return table


def _review(kb: Path, server: str | None, rule_id: str, decision: str, reviewer: str | None, note: str) -> None:
    """Record the review here or on the service (which records its token's name), and say so."""
    with open_kb(kb, server, reconcile=False) as base:
        rule = base.review(rule_id, decision, reviewer, note)
    r = rule.reviews[-1]
    console.print(
        f"{decision} {rule.id} ({rule.condition_text} → {rule.family.value}) by {r.reviewer}", highlight=False
    )


def rules_accept(
    rule_id: IdArgument,
    note: Annotated[str, typer.Option("--note", help="Why (kept with the rule).")] = "",
    reviewer: ReviewerOption = None,
    kb: KbOption = Path(DEFAULT_KB),
    server: ServerOption = None,
) -> None:
    """Accept a rule: from now on it votes in `remedy diagnose` when its conditions hold."""
    _review(kb, server, rule_id, "accepted", reviewer, note)


def rules_reject(
    rule_id: IdArgument,
    note: Annotated[str, typer.Option("--note", help="Why the rule is wrong or useless (required).")],
    reviewer: ReviewerOption = None,
    kb: KbOption = Path(DEFAULT_KB),
    server: ServerOption = None,
) -> None:
    """Reject a rule (kept with the note, so re-mining does not propose it again as new)."""
    _review(kb, server, rule_id, "rejected", reviewer, note)
