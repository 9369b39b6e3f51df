"""`remedy doctor` reports sandbox capabilities, the embedding model and versions."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from remedy.kb import doctor as doctor_mod
from remedy.kb.cli import app


def test_doctor_json_names_capabilities_model_and_versions():
    res = CliRunner().invoke(app, ["doctor", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert isinstance(data["network_isolation"], bool)
    assert set(data["rlimits"]) == {"cpu", "memory", "core"}
    assert data["embedding_model"] == "all-MiniLM-L6-v2" and data["embedding_dim"] == 384
    assert data["versions"]["duckdb"] != "not installed"
    assert "OPENAI_API_KEY" not in data["worker_env"]


def test_missing_network_namespace_is_reported_as_a_problem(monkeypatch):
    import remedy.cases.patches.worker as worker

    monkeypatch.setattr(worker, "network_isolation_available", lambda: False)
    report = doctor_mod.run_doctor()
    assert not report.network_isolation
    assert any("host network" in p for p in report.problems)
