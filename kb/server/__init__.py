"""`remedy serve`: the team's HTTP service, the one owner of a KB while it runs.

``create_app(kb_path)`` builds the FastAPI app; ``remedy serve`` hands it to uvicorn.
Tokens (:mod:`.tokens`) and jobs (:mod:`.jobs`) live in the KB's DuckDB file; the request and
response bodies (:mod:`.models`) are shared with the remote client (:mod:`remedy.kb.client`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .jobs import JobRecord, JobRunner, JobState, JobStore
from .service import remedy_version
from .tokens import Role, TokenRecord, TokenStore

if TYPE_CHECKING:
    from .app import create_app

__all__ = [
    "create_app",
    "remedy_version",
    "Role",
    "TokenRecord",
    "TokenStore",
    "JobRecord",
    "JobRunner",
    "JobState",
    "JobStore",
]


def __getattr__(name: str) -> Any:
    # FastAPI takes about half a second to import: the app is loaded only when asked for, so the
    # remote client, which shares this package's models, does not pay for a server it never runs.
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
