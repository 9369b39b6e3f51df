"""One interface, two transports: the local KnowledgeBase and the served KB (RemedyClient) answer alike.

Two copies of one KB (the corpus and the planted rule's cases): one opened locally, one served
in process (the app's TestClient carries the client's requests, so routes run for real). Each
call of ``KBCalls`` is asked of both, and each CLI command is run with ``--kb`` and with
``--server``; the answers must agree (the KB's path aside).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from remedy.cases.io import write_cases
from remedy.cases.model import Source
from remedy.kb.cli import app as cli
from remedy.kb.cli import connect
from remedy.kb.client import KBCalls, RemedyClient
from remedy.kb.facade import KnowledgeBase

from ...miners.conftest import planted_cases
from ..conftest import corpus_cases, make_case
from .conftest import Served, serve

URL = "http://testserver"
runner = CliRunner()


@pytest.fixture(scope="module")
def twins(tmp_path_factory, embedder) -> Iterator[tuple[KnowledgeBase, RemedyClient, Served]]:
    """The same cases in a local KB and a served one; yields (local, client of the served, the service)."""
    root = tmp_path_factory.mktemp("twins")
    with KnowledgeBase.open(root / "served", embedder=embedder) as base:
        base.add_many([*corpus_cases(), *planted_cases()])
    shutil.copytree(root / "served", root / "local")
    for s in serve(root / "served", embedder, run_jobs=False):
        with KnowledgeBase.open(root / "local", embedder=embedder) as local:
            yield local, RemedyClient(URL, s.tokens["writer"], http=s.client), s


@pytest.fixture
def cli_both(twins, monkeypatch):
    """Run a command with ``--kb`` (the local copy) and with ``--server``; returns both outputs."""
    local, _, served = twins
    monkeypatch.setattr(
        connect, "client", lambda server: RemedyClient(server, served.tokens["writer"], http=served.client)
    )

    def run(*args: str) -> tuple[str, str]:
        outs = []
        for where in (["--kb", str(local.root)], ["--server", URL]):
            result = runner.invoke(cli, [*args, *where])
            assert result.exit_code == 0, (where, result.output, result.exception)
            outs.append(result.stdout)  # stderr holds the local KB's (transient) reconcile progress
        return outs[0], outs[1]

    return run


def test_the_local_kb_and_the_client_offer_the_same_calls(twins):
    local, remote, _ = twins
    both: list[KBCalls] = [local, remote]  # mypy checks each against the protocol
    assert all(callable(getattr(b, name)) for b in both for name in ("similar", "stats", "mine", "review"))


@pytest.mark.parametrize(
    "filters",
    [
        {},
        {"k": 3, "mode": "text"},
        {"env_id": "Pendulum-v1", "only_improved": True},
        {"action_space": "discrete", "mode": "vector", "min_effect": 0.0},
    ],
)
def test_similar_to_a_text_agrees(twins, filters):
    local, remote, _ = twins
    text = "the lander hovers above the pad and never lands"
    mine, theirs = local.similar(text, **filters), remote.similar(text, **filters)
    assert [h.as_dict() for h in theirs] == [h.as_dict() for h in mine] and mine
    assert [h.case for h in theirs] == [h.case for h in mine]


def test_similar_to_a_stored_case_agrees_and_leaves_the_case_out(twins):
    local, remote, _ = twins
    case = local.get("c-lander-hover")
    mine, theirs = local.similar(case, k=3), remote.similar(case, k=3)
    assert [h.as_dict() for h in theirs] == [h.as_dict() for h in mine] and len(mine) == 3
    assert case.case_id not in {h.case.case_id for h in theirs}


def test_similar_to_a_signature_and_get_agree(twins):
    local, remote, _ = twins
    case = local.get("c-walker-scale")
    assert remote.get(case.case_id) == case
    mine, theirs = local.similar(case.signature, k=4), remote.similar(case.signature, k=4)
    assert [h.as_dict() for h in theirs] == [h.as_dict() for h in mine]


@pytest.mark.parametrize("index", [False, True])
def test_stats_agree(twins, index):
    local, remote, _ = twins
    mine, theirs = local.stats(index=index), remote.stats(index=index)
    assert replace(theirs, path=mine.path) == mine
    assert (mine.index_rows is None) is (not index)


def test_export_agrees(twins, tmp_path):
    local, remote, _ = twins
    n_local, n_remote = local.export(tmp_path / "l.jsonl"), remote.export(tmp_path / "r.jsonl")
    assert n_local == n_remote == local.count()
    assert (tmp_path / "l.jsonl").read_text() == (tmp_path / "r.jsonl").read_text()


def test_mine_review_and_import_agree(twins, tmp_path):
    local, remote, served = twins
    mined = [b.mine(min_support=3, seed=1) for b in (local, remote)]
    strip = {"rules": {"__all__": {"evidence": {"mined_at"}}}}
    assert mined[1].model_dump(exclude=strip) == mined[0].model_dump(exclude=strip) and mined[0].new
    rid = mined[0].new[0]
    assert [r.id for r in remote.rules()] == [r.id for r in local.rules()]
    reviewer = RemedyClient(URL, served.tokens["reviewer"], http=served.client)
    note = "pendulum only"
    reviewed = [local.review(rid, "rejected", "reviewer", note), reviewer.review(rid, "rejected", None, note)]
    assert [r.status for r in reviewed] == ["rejected", "rejected"]
    assert [(v.reviewer, v.note) for r in reviewed for v in r.reviews] == [("reviewer", note)] * 2
    assert remote.rule(rid).status == local.rule(rid).status == "rejected"

    theirs = make_case("c-imported-walker", "BipedalWalker-v3", "continuous", "SAC", "The walker falls.")
    path = tmp_path / "one.jsonl"
    write_cases(path, [theirs.model_copy(update={"source": Source.verified})])
    reports = [b.import_file(path, mark_imported=True) for b in (local, remote)]
    assert asdict(reports[1]) == asdict(reports[0]) and reports[0].added == 1
    assert local.get(theirs.case_id).source == remote.get(theirs.case_id).source == Source.imported


@pytest.mark.parametrize(
    "args",
    [
        ["query", "torque chatters between its bounds", "--json"],
        ["query", "torque chatters between its bounds", "--env", "Pendulum-v1", "-k", "2"],
        ["case", "show", "c-walker-scale", "--json"],
        ["case", "show", "c-walker-scale"],
        ["case", "similar", "c-walker-scale", "--json"],
        ["case", "similar", "c-pendulum-jitter", "-k", "2", "--only-improved"],
    ],
)
def test_each_command_prints_the_same_locally_and_served(cli_both, args):
    local, served = cli_both(*args)
    assert served == local and local.strip()


def test_stats_print_the_same_but_the_path(cli_both, twins):
    local, served = (json.loads(out) for out in cli_both("kb", "stats", "--json"))
    assert {**served, "path": local["path"]} == local
    assert Path(served["path"]) == twins[2].service.kb.root


def test_rules_print_the_same_but_their_times(cli_both, twins):
    for base in twins[:2]:  # mined on each side (again, if an earlier test did: evidence updated, same ids)
        base.mine(seed=1)
    local, served = (_untimed(json.loads(out)) for out in cli_both("rules", "list", "--json"))
    assert served == local and local


def _untimed(data: object) -> object:
    """``data`` without the times of mining and review (each side mined and reviewed at its own moment)."""
    if isinstance(data, dict):
        return {k: _untimed(v) for k, v in data.items() if k not in ("mined_at", "at")}
    if isinstance(data, list):
        return [_untimed(v) for v in data]
    return data
