"""The optimizer asks a diagnoser what kind of stored program it runs; it never tests the diagnoser's name.

A backend registered under a new name with an existing ``program_kind`` is optimized as that kind,
and the version it stores is the one ``remedy diagnose`` then runs for it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from remedy.cases.errors import OptimizeError
from remedy.kb.diagnose import KBRetriever
from remedy.kb.facade import KnowledgeBase
from remedy.optimizer import job
from remedy.optimizer.job import OptimizeOptions, program_kind_for, run_optimize
from remedy.optimizer.versions import BACKENDS, ProgramStore
from remedy.retrieval import default_embedder, diagnosis
from remedy.retrieval.offline import OfflineDiagnoser

from .test_job import corpus


class HouseVote(OfflineDiagnoser):
    """The offline vote under another name: same capability, so the same kind of program."""

    name = "house-vote"


class HouseLM:
    """A language-model backend under a new name that runs ``llm`` programs."""

    name = "house-lm"
    needs_lm = True
    program_kind = "llm"

    def diagnose(self, ctx):  # pragma: no cover - never called here
        raise NotImplementedError


class NoPrograms:
    """A backend that runs no stored program versions."""

    name = "plain"

    def diagnose(self, ctx):  # pragma: no cover - never called here
        raise NotImplementedError


@pytest.fixture
def registered(monkeypatch):
    for name, factory in (("house-vote", HouseVote), ("house-lm", HouseLM), ("plain", NoPrograms)):
        monkeypatch.setitem(diagnosis._FACTORIES, name, factory)


def test_every_program_kind_has_its_optimizers_and_a_runner():
    assert set(job._OPTIMIZERS) == set(job._RUNNERS) == set(BACKENDS)


def test_a_new_name_is_optimized_as_the_kind_its_diagnoser_runs(registered):
    assert program_kind_for("house-lm") == "llm" and program_kind_for("house-vote") == "offline"
    OptimizeOptions(backend="house-lm", optimizer="gepa").check()
    with pytest.raises(OptimizeError, match="--backend house-lm needs --optimizer gepa"):
        OptimizeOptions(backend="house-lm").check()
    with pytest.raises(OptimizeError, match="--optimizer applies to --backend llm only"):
        OptimizeOptions(backend="house-vote", optimizer="gepa").check()
    with pytest.raises(OptimizeError, match="'plain' runs no stored program versions"):
        OptimizeOptions(backend="plain").check()
    with pytest.raises(OptimizeError, match="unknown --backend 'sideways'"):
        OptimizeOptions(backend="sideways").check()


def test_a_run_under_a_new_name_stores_a_version_of_its_kind(registered, tmp_path: Path):
    with KnowledgeBase.open(tmp_path / "kb", embedder=default_embedder()) as kb:
        kb.add_many(corpus())
        result = run_optimize(kb.store, KBRetriever(kb), OptimizeOptions(backend="house-vote", trials=4, reports=None))
        assert result.status == "done" and result.version is not None and result.version.backend == "offline"
        assert [v.id for v in ProgramStore(kb.store).list("offline")] == [result.version.id]
