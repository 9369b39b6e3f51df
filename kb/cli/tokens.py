"""`remedy tokens create|list|revoke`: API tokens of the KB (stored as hashes; shown once)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from remedy.cases.errors import KBNotFoundError

from . import connect
from .common import DEFAULT_KB, JsonOption, KbOption, ServerOption, console, print_json

__all__ = ["tokens_create", "tokens_list", "tokens_revoke"]


def _tokens(kb: Path):
    from remedy.cases.store import CaseStore
    from remedy.kb.facade import DB_FILE
    from remedy.kb.server.tokens import TokenStore

    if not (kb / DB_FILE).is_file():
        raise KBNotFoundError(f"no KB at {kb}; create one with `remedy kb init --kb {kb}`")
    return TokenStore(CaseStore(kb / DB_FILE))


def tokens_create(
    role: Annotated[
        str,
        typer.Option(
            "--role",
            help="reader (query, cases, stats), writer (+ import, jobs), reviewer (+ rule reviews), "
            "or admin (+ revoke tokens and cancel anyone's job through the service).",
        ),
    ],
    name: Annotated[str | None, typer.Option("--name", help="A label, e.g. the person or CI job using it.")] = None,
    kb: KbOption = Path(DEFAULT_KB),
    as_json: JsonOption = False,
) -> None:
    """Create a token and print it once (only its hash is stored)."""
    record, secret = _tokens(kb).create(role, name)
    if as_json:
        print_json({"token_id": record.token_id, "name": record.name, "role": record.role.value, "token": secret})
        return
    console.print(
        f"{record.role.value} token [bold]{record.name}[/] ({record.token_id}); shown once, keep it:", highlight=False
    )
    typer.echo(secret)


def tokens_list(kb: KbOption = Path(DEFAULT_KB), as_json: JsonOption = False) -> None:
    """List tokens (never their secrets)."""
    records = _tokens(kb).list()
    if as_json:
        print_json(
            [
                {
                    "token_id": r.token_id,
                    "name": r.name,
                    "role": r.role.value,
                    "created_at": r.created_at,
                    "revoked_at": r.revoked_at,
                }
                for r in records
            ]
        )
        return
    t = Table(title=f"tokens of {kb}", title_justify="left")
    for col in ("id", "name", "role", "created", "state"):
        t.add_column(col)
    for r in records:
        state = "active" if r.active else f"revoked {r.revoked_at:%Y-%m-%d %H:%M}"
        t.add_row(r.token_id, r.name, r.role.value, f"{r.created_at:%Y-%m-%d %H:%M}", state)
    console.print(t)


def tokens_revoke(
    token: Annotated[str, typer.Argument(help="The token's id or name (see `remedy tokens list`).")],
    kb: KbOption = Path(DEFAULT_KB),
    server: ServerOption = None,
) -> None:
    """Revoke a token: requests with it get 401 from then on. While `remedy serve` holds the KB, revoke
    through it with --server and an admin token in $REMEDY_TOKEN."""
    if server:
        with connect.client(server) as remote:
            out = remote.revoke_token(token)
        role, name, token_id = out.role.value, out.name, out.token_id
    else:
        record = _tokens(kb).revoke(token)
        role, name, token_id = record.role.value, record.name, record.token_id
    console.print(f"revoked {role} token {name} ({token_id})", highlight=False)
