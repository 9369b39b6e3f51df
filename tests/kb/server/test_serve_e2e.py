"""`remedy serve` as a real uvicorn process on a loopback port, and the CLI going through it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from remedy.cases.store import SERVE_MARKER, CaseStore
from remedy.kb import KnowledgeBase
from remedy.kb.server.tokens import TokenStore

from ...miners.conftest import planted_cases
from ..conftest import corpus_cases

REMEDY = Path(sys.executable).parent / "remedy"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(*args: str, token: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "REMEDY_TOKEN": token}
    return subprocess.run([str(REMEDY), *map(str, args)], capture_output=True, text=True, env=env, timeout=300)


@contextmanager
def _running(kb: Path) -> Iterator[str]:
    """`remedy serve` on ``kb`` at a free loopback port, answering /health; yields its URL, stops it after."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [str(REMEDY), "serve", "--kb", str(kb), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(600):  # bounded: model loading on a busy machine can take a while
            if proc.poll() is not None:
                raise AssertionError(f"remedy serve exited: {proc.stderr.read()}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            raise AssertionError("remedy serve never answered /health")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.fixture(scope="module")
def server(tmp_path_factory, embedder):
    """A KB with the corpus and a writer token, served by `remedy serve` (one per module); stopped at the end."""
    tmp_path = tmp_path_factory.mktemp("e2e")
    kb = tmp_path / "kb"
    with KnowledgeBase.open(kb, embedder=embedder) as base:  # built in process: cold CLI runs are slow
        base.add_many(corpus_cases())
    tokens = TokenStore(CaseStore(kb / "remedy.duckdb"))
    _, token = tokens.create("writer", "e2e")
    extra = {name: tokens.create(role, name)[1] for name, role in (("root", "admin"), ("leaked", "reader"))}
    with _running(kb) as url:
        yield url, token, kb, tmp_path, extra
    assert not (kb / SERVE_MARKER).exists()  # a clean stop removes the marker


@pytest.mark.slow
def test_cli_goes_through_the_running_service(server):
    url, token, kb, tmp, _ = server
    assert json.loads((kb / SERVE_MARKER).read_text())["url"] == url
    q = _cli("query", "the lander hovers and never lands", "--server", url, "--json", token=token)
    assert q.returncode == 0, q.stderr
    assert json.loads(q.stdout)[0]["case_id"] == "c-lander-hover"
    table = _cli("query", "torque chatters", "--server", url, "-k", "1", token=token)
    assert table.returncode == 0 and "Pendulum-v1" in table.stdout, table.stderr
    stats = _cli("kb", "stats", "--server", url, "--json", token=token)
    assert stats.returncode == 0 and json.loads(stats.stdout)["store"]["total"] == 5, stats.stderr
    show = _cli("case", "show", "c-walker-scale", "--server", url, token=token)
    assert show.returncode == 0 and "BipedalWalker-v3" in show.stdout
    out = tmp / "out.jsonl"
    assert _cli("kb", "export", out, "--server", url, token=token).returncode == 0
    assert len(out.read_text().splitlines()) == 5


@pytest.mark.slow
def test_a_query_on_a_served_kb_asks_the_service_and_says_so(server):
    url, token, kb, _tmp, _ = server
    asked = _cli("query", "the lander hovers and never lands", "--kb", kb, "--json", token=token)
    assert asked.returncode == 0, asked.stderr
    assert json.loads(asked.stdout)[0]["case_id"] == "c-lander-hover"
    assert f"asking `remedy serve` at {url}" in asked.stderr
    alone = _cli("query", "the lander hovers and never lands", "--kb", kb, "--json")  # no token: not asked
    assert alone.returncode != 0 and "asking" not in alone.stderr
    assert f"--server {url}" in alone.stderr  # the lock error names the service instead


@pytest.mark.slow
def test_the_cli_prints_the_same_from_a_copy_and_through_the_service(server, embedder):
    url, token, _kb, tmp, _ = server
    exported = tmp / "served.jsonl"
    assert _cli("kb", "export", exported, "--server", url, token=token).returncode == 0
    with KnowledgeBase.open(tmp / "copy", embedder=embedder) as base:  # the same cases, created_at included
        base.import_file(exported)
    for args in (
        ["query", "the pendulum chatters between its torque bounds", "--json"],
        ["case", "similar", "c-lander-hover", "-k", "3", "--json"],
        ["case", "show", "c-walker-scale", "--json"],
        ["kb", "stats", "--json"],
    ):
        local = _cli(*args, "--kb", tmp / "copy")
        served = _cli(*args, "--server", url, token=token)
        assert local.returncode == served.returncode == 0, (args, local.stderr, served.stderr)
        assert _comparable(json.loads(served.stdout)) == _comparable(json.loads(local.stdout)), args


def _comparable(data: object) -> object:
    """JSON output without what differs by place (the KB's path) or by float noise between two
    processes' encoders (similarities to 3 decimals)."""
    if isinstance(data, list):
        return [_comparable(v) for v in data]
    if isinstance(data, dict):
        return {k: round(v, 3) if k == "similarity" else _comparable(v) for k, v in data.items() if k != "path"}
    return data


@pytest.mark.slow
def test_direct_access_to_a_served_kb_names_the_service_and_bad_tokens_fail(server):
    url, token, kb, _tmp, _ = server
    direct = _cli("kb", "stats", "--kb", kb)
    assert direct.returncode == 1 and f"served by `remedy serve` at {url}" in direct.stderr, direct.stderr
    denied = _cli("kb", "stats", "--server", url, token="rmd_not-a-token")
    assert denied.returncode == 1 and "401" in denied.stderr and "Traceback" not in denied.stderr
    missing = _cli("case", "show", "nope", "--server", url, token=token)
    assert missing.returncode == 1 and "404" in missing.stderr


@pytest.mark.slow
def test_a_leaked_token_is_revoked_while_the_service_runs(server):
    url, token, _kb, _tmp, extra = server
    leaked = {"Authorization": f"Bearer {extra['leaked']}"}
    assert httpx.get(f"{url}/v1/stats", headers=leaked, timeout=30).status_code == 200
    denied = _cli("tokens", "revoke", "leaked", "--server", url, token=token)  # a writer may not
    assert denied.returncode == 1 and "403" in denied.stderr and "Traceback" not in denied.stderr
    done = _cli("tokens", "revoke", "leaked", "--server", url, token=extra["root"])
    assert done.returncode == 0 and "revoked reader token leaked" in done.stdout, done.stderr
    after = httpx.get(f"{url}/v1/stats", headers=leaked, timeout=30)  # the very next request, no restart
    assert after.status_code == 401 and "revoked" in after.json()["detail"]
    assert httpx.get(f"{url}/v1/stats", headers={"Authorization": f"Bearer {token}"}, timeout=30).status_code == 200


@pytest.fixture(scope="module")
def rules_server(tmp_path_factory, embedder):
    """A KB with measured cases to mine (one planted rule) and a writer, reviewer and reader token, served."""
    kb = tmp_path_factory.mktemp("e2e-rules") / "kb"
    with KnowledgeBase.open(kb, embedder=embedder) as base:
        base.add_many(planted_cases())
    tokens = TokenStore(CaseStore(kb / "remedy.duckdb"))
    names = {"writer": "ci", "reviewer": "ada", "reader": "bob"}
    issued = {role: tokens.create(role, name)[1] for role, name in names.items()}
    with _running(kb) as url:
        yield url, issued


@pytest.mark.slow
def test_a_reviewer_works_on_rules_through_the_running_service(rules_server):
    url, token = rules_server
    mined = _cli("mine", "--server", url, "--json", token=token["writer"])
    assert mined.returncode == 0, mined.stderr
    rid = next(r["id"] for r in json.loads(mined.stdout)["rules"] if r["family"] == "action_smoothness")
    describe = ["diagnose", "--describe", "the torque chatters", "--env", "Pendulum-v1", "--tags", "jerky_actions"]
    before = _cli(*describe, "--server", url, "--json", token=token["reader"])
    assert before.returncode == 0 and rid not in json.loads(before.stdout)["diagnosis"]["cited_rules"], before.stderr

    denied = _cli("rules", "accept", rid, "--server", url, token=token["reader"])
    assert denied.returncode == 1 and "403" in denied.stderr and "Traceback" not in denied.stderr
    accepted = _cli("rules", "accept", rid, "--note", "seen it", "--server", url, token=token["reviewer"])
    assert accepted.returncode == 0 and f"accepted {rid}" in accepted.stdout and "by ada" in accepted.stdout

    shown = _cli("rules", "show", rid, "--server", url, "--json", token=token["reader"])
    (review,) = json.loads(shown.stdout)["reviews"]
    assert review["reviewer"] == "ada" and review["note"] == "seen it"
    after = _cli(*describe, "--server", url, "--json", token=token["reader"])
    assert rid in json.loads(after.stdout)["diagnosis"]["cited_rules"], after.stderr
