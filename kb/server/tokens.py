"""API tokens and roles, stored in the KB's DuckDB file (only the SHA-256 of each token).

A token is shown once, when it is created (``remedy tokens create``); the store
keeps its hash, a short id, a name and a role. Roles are ordered: a ``writer``
may do what a ``reader`` may, a ``reviewer`` what a ``writer`` may, an ``admin``
what a ``reviewer`` may, and also revoke tokens through the service and cancel
anyone's job. Every request is checked against the store (no token set is
cached), so a revocation takes effect at the next request.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum

from pydantic import BaseModel

from remedy.cases.errors import ValidationError
from remedy.cases.store import CaseStore

__all__ = ["Role", "TokenRecord", "TokenOut", "TokenStore", "TOKEN_PREFIX"]

#: every token starts with this, so a leaked one is easy to spot in logs and scanners
TOKEN_PREFIX = "rmd_"

_TABLE = """
CREATE TABLE IF NOT EXISTS api_tokens (
    token_id   VARCHAR PRIMARY KEY,
    name       VARCHAR NOT NULL,
    role       VARCHAR NOT NULL,
    hash       VARCHAR NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    revoked_at TIMESTAMPTZ
)
"""


class Role(StrEnum):
    """What a token may do: read (query, cases, stats, diagnose), write (import, runs, jobs), review (rules),
    administer (revoke tokens, cancel any job)."""

    reader = "reader"
    writer = "writer"
    reviewer = "reviewer"
    admin = "admin"

    def allows(self, needed: Role) -> bool:
        """True when this role is at least ``needed``."""
        order = list(Role)
        return order.index(self) >= order.index(needed)


@dataclass(frozen=True)
class TokenRecord:
    """A stored token, without its secret."""

    token_id: str
    name: str
    role: Role
    created_at: datetime
    revoked_at: datetime | None = None

    @property
    def active(self) -> bool:
        """False once revoked."""
        return self.revoked_at is None


class TokenOut(BaseModel):
    """A token as the HTTP API shows it (never its secret)."""

    token_id: str
    name: str
    role: Role
    created_at: datetime
    revoked_at: datetime | None = None

    @classmethod
    def of(cls, record: TokenRecord) -> TokenOut:
        """The API view of a stored token."""
        return cls(**record.__dict__)


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class TokenStore:
    """Create, list, revoke and check tokens in the KB's store."""

    def __init__(self, store: CaseStore) -> None:
        self.store = store
        with store.connection() as con:
            con.execute(_TABLE)

    def create(self, role: Role | str, name: str | None = None) -> tuple[TokenRecord, str]:
        """A new token: its record and the secret (shown once, never stored)."""
        role = _role(role)
        token_id = secrets.token_hex(4)
        secret = f"{TOKEN_PREFIX}{secrets.token_urlsafe(32)}"
        record = TokenRecord(token_id, (name or f"{role.value}-{token_id}").strip(), role, datetime.now(UTC))
        with self.store.connection() as con:
            con.execute(
                "INSERT INTO api_tokens VALUES (?, ?, ?, ?, ?, NULL)",
                [record.token_id, record.name, role.value, _hash(secret), record.created_at],
            )
        return record, secret

    def list(self) -> list[TokenRecord]:
        """Every token, revoked ones included, oldest first."""
        with self.store.connection() as con:
            rows = con.execute(
                "SELECT token_id, name, role, created_at, revoked_at FROM api_tokens ORDER BY created_at, token_id"
            ).fetchall()
        return [TokenRecord(r[0], r[1], Role(r[2]), r[3], r[4]) for r in rows]

    def revoke(self, id_or_name: str) -> TokenRecord:
        """Revoke the token with this id or name; :class:`ValidationError` if none or several match."""
        matches = [t for t in self.list() if t.active and id_or_name in (t.token_id, t.name)]
        if len(matches) != 1:
            what = "no active token" if not matches else f"{len(matches)} active tokens"
            raise ValidationError(f"{what} with id or name {id_or_name!r}; see `remedy tokens list` and pass its id")
        revoked_at = datetime.now(UTC)
        with self.store.connection() as con:
            con.execute("UPDATE api_tokens SET revoked_at = ? WHERE token_id = ?", [revoked_at, matches[0].token_id])
        return replace(matches[0], revoked_at=revoked_at)

    def authenticate(self, token: str) -> TokenRecord | None:
        """The active token matching ``token``, or None; hashes are compared in constant time."""
        if not token:
            return None
        digest = _hash(token)
        with self.store.connection() as con:
            rows = con.execute(
                "SELECT token_id, name, role, created_at, hash FROM api_tokens WHERE revoked_at IS NULL"
            ).fetchall()
        found = None
        for token_id, name, role, created, stored in rows:
            if hmac.compare_digest(stored, digest):  # no early exit: timing says nothing about which matched
                found = TokenRecord(token_id, name, Role(role), created)
        return found


def _role(role: Role | str) -> Role:
    try:
        return Role(role)
    except ValueError:
        raise ValidationError(f"unknown role {role!r}; use one of {', '.join(r.value for r in Role)}") from None
