"""The diagnoser registry is a seam: callers ask a backend what it needs, never test its name.

A backend added with one ``register_diagnoser`` call (nothing else edited) runs through
``remedy diagnose``, and its ``preflight`` stops the command before any work.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import get_args

import pytest
from typer.testing import CliRunner

from remedy.cases.errors import DiagnosisError, LMError
from remedy.cases.model import Cause, Diagnosis, RootCause
from remedy.kb.cli import app
from remedy.kb.settings import DiagnoserName
from remedy.retrieval import diagnosis
from remedy.retrieval.diagnosis import DiagnosisReport, get_diagnoser, needs_lm, preflight, program_kind

KB_ROOT = Path(__file__).resolve().parents[2] / "kb"


def test_each_builtin_says_what_it_needs(monkeypatch):
    monkeypatch.delenv("REMEDY_LM", raising=False)
    offline, llm, auto = (get_diagnoser(name) for name in ("offline", "llm", "auto"))
    assert (needs_lm(offline), program_kind(offline)) == (False, "offline")
    assert (needs_lm(llm), program_kind(llm)) == (True, "llm")
    assert (needs_lm(auto), program_kind(auto)) == (False, None)  # falls back to offline without an LM
    preflight(offline)
    preflight(auto)
    with pytest.raises(LMError, match="REMEDY_LM"):
        preflight(llm)


def test_the_settings_name_the_builtin_diagnosers():
    assert set(get_args(DiagnoserName)) == set(diagnosis._BUILTIN)


def test_nothing_in_kb_compares_a_name_with_llm():
    """The CLI, the service and the diagnosis glue ask the backend (preflight, program_kind) instead."""
    found = []
    for path in KB_ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                consts = [c for c in (node.left, *node.comparators) if isinstance(c, ast.Constant)]
                inner = [e for c in node.comparators if isinstance(c, (ast.Tuple, ast.List, ast.Set)) for e in c.elts]
                if any(getattr(c, "value", None) == "llm" for c in [*consts, *inner]):
                    found.append(f"{path.relative_to(KB_ROOT.parent)}:{node.lineno}")
    assert found == []


class _Probe:
    """A backend from outside: a fixed answer, and a preflight that can refuse."""

    name = "probe"

    def __init__(self, ready: bool = True) -> None:
        self.ready = ready

    def preflight(self) -> None:
        if not self.ready:
            raise DiagnosisError("the probe backend is not ready; set PROBE_READY=1")

    def diagnose(self, ctx):
        cause = Cause(cause=RootCause.action_jitter, confidence=0.9, rationale="the probe always says so")
        return DiagnosisReport(signature=ctx.signature, diagnosis=Diagnosis(causes=[cause], backend=self.name))


def test_a_registered_backend_runs_through_the_cli(monkeypatch, tmp_path):
    monkeypatch.setitem(diagnosis._FACTORIES, "probe", _Probe)
    args = ["diagnose", "--describe", "the pendulum chatters", "--diagnoser", "probe", "--kb", str(tmp_path / "kb")]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout[result.stdout.index("{") :])
    assert report["diagnosis"]["backend"] == "probe"
    assert [c["cause"] for c in report["diagnosis"]["causes"]] == ["action_jitter"]


def test_a_backend_that_cannot_run_stops_the_command_first(monkeypatch, tmp_path):
    monkeypatch.setitem(diagnosis._FACTORIES, "probe", lambda: _Probe(ready=False))
    result = CliRunner().invoke(app, ["diagnose", str(tmp_path), "--diagnoser", "probe"])
    assert isinstance(result.exception, DiagnosisError) and "PROBE_READY" in str(result.exception)
