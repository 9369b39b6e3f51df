"""Property-based fuzzing of the HTTP API with schemathesis: no request a client can send gets a 5xx.

The schema comes from the in-process app's ``/openapi.json``; every operation is
called with a bounded number of generated requests (valid and invalid ones)
carrying a reviewer token (which may do everything), against a fresh KB holding
the five corpus cases and enough measured cases to mine, with their rules mined.
Jobs are recorded but not run (``run_jobs=False``): no training starts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.python import asgi  # noqa: E402

from remedy.kb.server import create_app  # noqa: E402

from ...miners.conftest import planted_cases  # noqa: E402
from ..conftest import corpus_cases  # noqa: E402

#: generated requests per operation (positive and negative); the whole test stays well under a minute
EXAMPLES = 30


def _raw_body(ctx, value) -> bytes:
    """A generated body as bytes: text encoded, bytes as they are, anything else (negative cases) as JSON."""
    if isinstance(value, bytes):
        return value
    return value.encode() if isinstance(value, str) else json.dumps(value).encode()


# the import body (JSONL text) and the run upload (a .tar.gz): schemathesis has no serializer for either
schemathesis.serializer("application/x-ndjson", "application/gzip")(_raw_body)


@pytest.fixture(scope="module")
def fuzz_app(tmp_path_factory, embedder) -> Iterator[tuple[object, dict[str, str]]]:
    """The app on a fresh KB holding the corpus and mined rules, its lifespan started, and reviewer headers."""
    from remedy.miners import RuleStore
    from remedy.miners.store import mine_into

    app = create_app(tmp_path_factory.mktemp("fuzz") / "kb", embedder=embedder, run_jobs=False)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)  # starts the app's lifespan
    service = app.state.service
    service.kb.add_many([*corpus_cases(), *planted_cases()])
    mine_into(RuleStore(service.kb.store))
    headers = {"Authorization": f"Bearer {service.tokens.create('reviewer', 'fuzz')[1]}"}
    try:
        yield schema, headers
    finally:
        asgi.shutdown_lifespans()  # closes the KB


def _no_crash(ctx, response, case) -> None:
    """No 5xx, except the documented 503 for an LLM the service was not configured with (a fuzzed
    request may ask for ``diagnoser: llm``; no REMEDY_LM is set here), which is not a crash."""
    if response.status_code == 503 and response.json().get("error") == "LMError":
        return None
    return not_a_server_error(ctx, response, case)


def _operations() -> list[tuple[str, str]]:
    """(method, path) of every operation in the app's schema (building the app opens no KB)."""
    paths = create_app(run_jobs=False).openapi()["paths"]
    return [(method.upper(), path) for path, ops in paths.items() for method in ops]


@pytest.mark.slow
@pytest.mark.parametrize(("method", "path"), _operations())
def test_no_request_gets_a_server_error(fuzz_app, method: str, path: str) -> None:
    schema, headers = fuzz_app
    operation = schema[path][method]
    cases = st.one_of(operation.as_strategy(GenerationMode.POSITIVE), operation.as_strategy(GenerationMode.NEGATIVE))

    @given(case=cases)
    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def call(case) -> None:
        case.call_and_validate(headers=headers, checks=[_no_crash])

    call()
