"""Fixtures for the service tests: an app on a fresh KB (real DuckDB, LanceDB, MiniLM) and tokens per role."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from remedy.kb.server import create_app


@dataclass
class Served:
    """A running in-process app, its TestClient, and one token per role."""

    client: TestClient
    service: object
    tokens: dict[str, str]

    def auth(self, role: str) -> dict[str, str]:
        """Headers carrying the token of ``role``."""
        return {"Authorization": f"Bearer {self.tokens[role]}"}


def serve(kb_path: Path, embedder, **kwargs) -> Iterator[Served]:
    """Start an app on ``kb_path`` (lifespan included) and make a reader, writer and reviewer token."""
    app = create_app(kb_path, embedder=embedder, **kwargs)
    with TestClient(app) as client:
        service = app.state.service
        tokens = {role: service.tokens.create(role, role)[1] for role in ("reader", "writer", "reviewer")}
        yield Served(client, service, tokens)


@pytest.fixture
def served(kb_path: Path, embedder) -> Iterator[Served]:
    """The service on a fresh, empty KB; jobs are recorded but not run (tests drive them)."""
    yield from serve(kb_path, embedder, run_jobs=False)
