"""The sandbox worker starts with a minimal, explicit environment: no API keys, no tokens."""

from __future__ import annotations

import os
import shutil
import subprocess

from remedy.cases.patches.worker import WORKER_ENV_VARS, Limits, rlimits_available, run_limited

_LIMITS = Limits(cpu_s=30, memory_mb=1024, wall_s=60)


def _worker_env() -> dict[str, str]:
    # `env` run by the worker prints exactly what the worker process was given
    out = run_limited(subprocess.check_output, [shutil.which("env")], limits=_LIMITS).decode()
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_worker_does_not_see_the_parents_secrets(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-should-not-leak")
    monkeypatch.setenv("REMEDY_LM", "openai/gpt-x")
    env = _worker_env()
    assert "OPENAI_API_KEY" not in env and "REMEDY_LM" not in env
    assert set(env) <= set(WORKER_ENV_VARS) | {"HOME", "TMPDIR"}


def test_worker_keeps_the_allow_listed_variables_and_a_scratch_home(monkeypatch):
    monkeypatch.setenv("LANG", "C.UTF-8")
    env = _worker_env()
    assert env["LANG"] == "C.UTF-8"
    assert env["HOME"] == env["TMPDIR"] != os.path.expanduser("~")


def test_rlimits_report_names_each_limit():
    assert set(rlimits_available()) == {"cpu", "memory", "core"}
