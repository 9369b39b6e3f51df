"""Mined rules and their reviews, in the KB's DuckDB file next to the cases.

One ``rules`` table: the rule's id, status and flag as columns (what listing filters on) and
the whole :class:`~remedy.miners.model.Rule` as JSON. The table is created on first use
(``CREATE TABLE IF NOT EXISTS``, like the service's token and job tables), so KBs made
before rules existed open unchanged. Every method opens and closes its own connection
through :meth:`CaseStore.connection`, which retries while another process holds the file.

Re-mining updates a rule in place (same id: the id hashes its condition and family): the
evidence is replaced, status and reviews are kept. An accepted rule whose new evidence has
turned against it, or that the new run no longer found, gets a ``flag`` saying how; a
proposed rule no longer found keeps its record too, flagged, so nothing a reviewer saw is lost.
"""

from __future__ import annotations

import difflib
import getpass
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from remedy.cases.errors import RuleNotFoundError, ValidationError
from remedy.cases.store import CaseStore

from .mine import MiningResult, mine
from .model import Review, Rule, RuleEvidence, RuleStatus

if TYPE_CHECKING:
    import duckdb

__all__ = ["RuleStore", "UpsertReport", "default_reviewer", "evidence_turned", "mine_into"]

_TABLE = """
CREATE TABLE IF NOT EXISTS rules (
    rule_id    VARCHAR PRIMARY KEY,
    status     VARCHAR NOT NULL,
    flag       VARCHAR NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    body       JSON NOT NULL
)
"""
#: flag of a stored rule the latest mining run did not find at all (support or FDR lost)
NOT_FOUND = "not found by the latest mining run"


@dataclass(frozen=True)
class UpsertReport:
    """What storing a mining run changed: rule ids new, updated, and flagged (with the flag)."""

    new: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    flagged: dict[str, str] = field(default_factory=dict)


def default_reviewer() -> str:
    """Who reviews when no name is given: ``$USER``, else the login name, else ``unknown``."""
    name = os.environ.get("USER")
    if name:
        return name
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no passwd entry (some containers)
        return "unknown"


def evidence_turned(old: RuleEvidence, new: RuleEvidence, fdr: float) -> str:
    """How new evidence turned against a rule ("" when it did not): q above fdr, CI reaching 0, win rate down."""
    reasons = []
    if new.q_value > fdr:
        reasons.append(f"q {new.q_value:.3g} now above fdr {fdr:g}")
    if new.ci_low <= 0:
        reasons.append(f"effect CI now reaches 0 or below ({new.ci_low:+.2f} to {new.ci_high:+.2f})")
    if new.win_rate < old.win_rate:
        reasons.append(f"win rate fell from {old.win_rate:.0%} to {new.win_rate:.0%}")
    return "; ".join(reasons)


class RuleStore:
    """Rules in the KB's DuckDB file; short-lived connections through the case store."""

    def __init__(self, store: CaseStore, create: bool = True) -> None:
        """Rules kept in ``store``'s file; the table is created if missing unless ``create`` is False
        (a reader such as a diagnosis then finds no rules and writes nothing)."""
        self.store = store
        self._create = create
        if create:
            with store.connection() as con:
                con.execute(_TABLE)

    def _exists(self, con: duckdb.DuckDBPyConnection) -> bool:
        if self._create:
            return True
        row = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'rules'").fetchone()
        return bool(row and row[0])

    # -- reads ---------------------------------------------------------------------

    def all(self, status: RuleStatus | str | None = None) -> list[Rule]:
        """Every stored rule (with ``status``: only those), by id."""
        sql, args = "SELECT body::VARCHAR FROM rules", []
        if status is not None:
            sql, args = sql + " WHERE status = ?", [RuleStatus(status).value]
        with self.store.connection() as con:
            rows = con.execute(sql + " ORDER BY rule_id", args).fetchall() if self._exists(con) else []
        return [Rule.model_validate_json(r[0]) for r in rows]

    def accepted(self) -> list[Rule]:
        """The rules a person accepted: what the diagnosers use."""
        return self.all(RuleStatus.accepted)

    def get(self, rule_id: str) -> Rule:
        """The rule with this id; :class:`RuleNotFoundError` naming up to 3 close ids if none."""
        with self.store.connection() as con:
            row = con.execute("SELECT body::VARCHAR FROM rules WHERE rule_id = ?", [rule_id]).fetchone()
            ids = [] if row else [r[0] for r in con.execute("SELECT rule_id FROM rules ORDER BY 1").fetchall()]
        if row:
            return Rule.model_validate_json(row[0])
        close = [i for i in ids if i.startswith(rule_id)][:3] if rule_id else []
        close = close or difflib.get_close_matches(rule_id, ids, n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else "list ids with `remedy rules list`"
        raise RuleNotFoundError(f"no rule {rule_id!r} in {self.store.path.parent}; {hint}")

    # -- writes --------------------------------------------------------------------

    def _put(self, rules: Iterable[Rule]) -> None:
        rows = [(r.id, r.status.value, r.flag, datetime.now(UTC), r.model_dump_json()) for r in rules]
        if not rows:
            return
        with self.store.connection() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                con.executemany("INSERT OR REPLACE INTO rules VALUES (?, ?, ?, ?, ?)", rows)
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise

    def upsert_mined(self, result: MiningResult) -> UpsertReport:
        """Store a mining run: new rules as ``proposed``; known ids get the new evidence, keeping status and reviews.

        An accepted rule whose evidence turned against it (:func:`evidence_turned`) is flagged; a stored
        rule the run did not keep is flagged too, with fresher evidence when the run still tested it.
        """
        stored = {r.id: r for r in self.all()}
        tested = {r.id: r for r in result.tested}
        report = UpsertReport()
        out: list[Rule] = []
        for rule in result.rules:
            old = stored.pop(rule.id, None)
            if old is None:
                report.new.append(rule.id)
                out.append(rule)
                continue
            flag = evidence_turned(old.evidence, rule.evidence, result.fdr) if old.status == RuleStatus.accepted else ""
            out.append(old.model_copy(update={"evidence": rule.evidence, "equivalent": rule.equivalent, "flag": flag}))
            if flag:
                report.flagged[rule.id] = flag
            else:
                report.updated.append(rule.id)
        for rid, old in stored.items():  # not kept by this run
            fresh = tested.get(rid)
            flag = NOT_FOUND
            if fresh is not None:
                turned = evidence_turned(old.evidence, fresh.evidence, result.fdr)
                flag = f"{NOT_FOUND}: {turned}" if turned else f"{NOT_FOUND} (pruned as redundant)"
            out.append(old.model_copy(update={"evidence": fresh.evidence if fresh else old.evidence, "flag": flag}))
            if flag != old.flag:
                report.flagged[rid] = flag
        self._put(out)
        return report

    def review(self, rule_id: str, decision: RuleStatus | str, reviewer: str | None = None, note: str = "") -> Rule:
        """Record a person's decision (accepted or rejected) with who and when; returns the updated rule.

        A review clears the rule's flag: the reviewer has seen the current evidence.
        """
        decision = RuleStatus(decision)
        if decision == RuleStatus.proposed:
            raise ValidationError("a review decides: 'accepted' or 'rejected'")
        if decision == RuleStatus.rejected and not note.strip():
            raise ValidationError("say why the rule is rejected: --note TEXT (kept with the rule for later readers)")
        rule = self.get(rule_id)
        review = Review(decision=decision, reviewer=(reviewer or "").strip() or default_reviewer(), note=note)
        updated = rule.model_copy(update={"status": decision, "reviews": [*rule.reviews, review], "flag": ""})
        self._put([updated])
        return updated


def mine_into(
    rules: RuleStore, *, min_support: int = 3, fdr: float = 0.1, max_conditions: int = 2, seed: int = 0
) -> tuple[MiningResult, UpsertReport]:
    """Mine the cases of ``rules``' KB and store the result; nothing is written when mining fails."""
    result = mine(rules.store.iter_cases(), min_support=min_support, fdr=fdr, max_conditions=max_conditions, seed=seed)
    return result, rules.upsert_mined(result)
