"""Which knowledge base a command talks to: the one at ``--kb``, or a running `remedy serve` at ``--server``.

:func:`open_kb` yields either a :class:`~remedy.kb.facade.KnowledgeBase` or a
:class:`~remedy.kb.client.RemedyClient`; both answer the calls of
:class:`~remedy.kb.client.KBCalls` with the same types, so a command calls them once and renders
one result. :func:`client` is the one place a client is made (the tests point it at an in-process
service). Both are imported on first use, as the command line's import policy says
(:mod:`remedy.kb.cli`): ``remedy --help`` loads neither numpy nor the case models nor httpx.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from .common import err_console, progress_bar

if TYPE_CHECKING:
    from remedy.kb.client import KBCalls, RemedyClient
    from remedy.kb.facade import KnowledgeBase

__all__ = ["open_kb", "open_local", "client", "bar", "serving"]

#: hosts a KB's marker may name for the CLI to send it the user's token unasked
_LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def client(server: str) -> RemedyClient:
    """A client of the service at ``server`` with the token in ``$REMEDY_TOKEN``."""
    from remedy.kb.client import RemedyClient

    return RemedyClient(server)


def serving(kb: Path) -> str | None:
    """The URL of a `remedy serve` on this machine that holds the KB at ``kb``, when ``$REMEDY_TOKEN`` is
    set to ask it with; says so on stderr. None otherwise: the command opens the KB itself (and, if
    the service holds it, fails with the lock error that names the service).

    Only a loopback URL is taken from the KB's ``serve.json``: the token is not sent where a file
    says without the user naming the place (``--server``)."""
    import os
    from urllib.parse import urlsplit

    from remedy.cases.store import live_service
    from remedy.kb.client import TOKEN_ENV

    if not os.environ.get(TOKEN_ENV):
        return None
    url = live_service(kb)
    try:
        host = urlsplit(url).hostname if url else None
    except ValueError:  # a marker that is not a URL: not ours to follow
        return None
    if host not in _LOCAL_HOSTS:
        return None
    err_console.print(f"asking `remedy serve` at {url}, which holds the KB at {kb}", highlight=False, soft_wrap=True)
    return url


@contextmanager
def open_kb(kb: Path, server: str | None = None, *, create: bool = False, reconcile: bool = True) -> Iterator[KBCalls]:
    """The KB a command works on: the service at ``server`` when given, else the directory ``kb``
    (created if ``create``; its index caught up with the store first if ``reconcile``)."""
    if server:
        with client(server) as remote:
            yield remote
        return
    with open_local(kb, create=create, reconcile=reconcile) as base:
        yield base


def open_local(kb: Path, create: bool = False, reconcile: bool = True) -> KnowledgeBase:
    """The KB at ``kb``; with ``reconcile``, an index that lags the store (after a crash) catches up first,
    showing progress on stderr."""
    from remedy.kb.facade import KnowledgeBase

    base = KnowledgeBase.open(kb, create=create, reconcile=False)
    if reconcile:
        with bar("reconciling the index") as update:
            report = base.reconcile(progress=update)
        if report.deduplicated:
            err_console.print(
                f"[yellow]removed duplicate index rows of {report.deduplicated} case(s)[/]", highlight=False
            )
        if report.rebuilt:
            err_console.print(
                f"[yellow]the index was damaged ({report.rebuilt}); rebuilt it from the store[/]",
                highlight=False,
                soft_wrap=True,
            )
    return base


@contextmanager
def bar(label: str) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar on stderr (stdout stays clean for scripts); yields ``update(done, total)``."""
    with progress_bar() as progress:
        task = progress.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        yield update
