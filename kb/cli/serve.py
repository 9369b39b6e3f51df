"""`remedy serve`: run the HTTP service over a KB with uvicorn (the service owns the KB while it runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import DEFAULT_KB, KbOption, console

__all__ = ["serve"]


def serve(
    kb: KbOption = Path(DEFAULT_KB),
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on (0.0.0.0 for every interface).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to listen on.")] = 8765,
    public_read: Annotated[
        bool, typer.Option("--public-read", help="Let requests without a token read (query, cases, stats).")
    ] = False,
    upload_quota_mb: Annotated[
        int,
        typer.Option("--upload-quota-mb", min=0, help="Unpacked MB of run uploads one token may keep (0: no quota)."),
    ] = 1024,
    upload_ttl_hours: Annotated[
        float,
        typer.Option(
            "--upload-ttl-hours", min=0, help="Remove uploads older than this, at start and hourly (0: keep them)."
        ),
    ] = 72.0,
) -> None:
    """Serve the KB over HTTP (API docs at /docs); clients use --server URL or REMEDY_SERVER and REMEDY_TOKEN."""
    import uvicorn

    from remedy.kb.server import create_app

    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"
    app = create_app(
        kb,
        public_read=public_read,
        url=url,
        upload_quota_bytes=upload_quota_mb * 1024 * 1024 or None,
        upload_ttl_hours=upload_ttl_hours or None,
    )
    console.print(f"Serving {kb} at [bold]{url}[/] (docs: {url}/docs); Ctrl-C stops.", soft_wrap=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
