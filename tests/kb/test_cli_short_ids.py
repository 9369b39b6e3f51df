"""Similar-case tables show a short case id that `remedy case show` takes; in a pipe, `query` prints whole columns."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from remedy.cases.errors import CaseNotFoundError
from remedy.cases.model import new_case_id
from remedy.kb.cli import app
from remedy.kb.cli.render import SIMILAR_TSV, render_similar, short_id
from remedy.kb.facade import KnowledgeBase

from .conftest import make_case

runner = CliRunner()
LONG = new_case_id("lander", "hover", 1)


@pytest.fixture(scope="module")
def short_kb(tmp_path_factory, embedder):
    """Two generated-id cases sharing no prefix beyond ``c-``, and one readable id."""
    root = tmp_path_factory.mktemp("short") / "kb"
    other = new_case_id("pendulum", 2)
    assert other[:10] != LONG[:10]
    with KnowledgeBase.open(root, embedder=embedder) as kb:
        kb.add_many(
            [
                make_case(LONG, "LunarLander-v3", "continuous", summary="The lander hovers and never lands."),
                make_case(other, "Pendulum-v1", "continuous", summary="The torque chatters."),
                make_case("ex-cartpole-01", summary="The pole falls over quickly."),
            ]
        )
    return root


def test_short_id_cuts_generated_ids_only():
    assert short_id(LONG) == LONG[:10] and len(LONG) == 18
    assert short_id("ex-cartpole-01") == "ex-cartpole-01"


def test_table_has_the_short_id_and_case_show_takes_it(short_kb):
    with KnowledgeBase.open(short_kb) as kb:
        hits = kb.similar("the lander hovers", k=3)
        assert hits[0].case.case_id == LONG
        assert kb.get(LONG[:10]).case_id == LONG  # a unique prefix resolves
        with pytest.raises(CaseNotFoundError):
            kb.get("c-")  # too short to be a short id: stays an error with suggestions
    table = render_similar(hits)
    assert table.columns[0].header == "id" and LONG[:10] in list(table.columns[0].cells)
    shown = runner.invoke(app, ["case", "show", LONG[:10], "--kb", str(short_kb), "--json"])
    assert shown.exit_code == 0 and LONG in shown.output


def test_query_in_a_pipe_prints_tab_separated_columns(short_kb):
    result = runner.invoke(app, ["query", "the lander hovers", "--kb", str(short_kb), "-k", "2"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split("\t") == list(SIMILAR_TSV)
    first = dict(zip(SIMILAR_TSV, lines[1].split("\t"), strict=True))
    assert first["case_id"] == LONG and first["env_id"] == "LunarLander-v3" and first["rank"] == "1"
    assert len(lines) == 3
