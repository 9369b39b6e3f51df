"""Commands that need no embedding must not import torch, sentence-transformers or LanceDB.

Those imports cost seconds (measured with ``python -X importtime``); a quick question such as
``remedy kb stats`` must not pay them. Each command runs in a fresh interpreter, which then
reports which heavy modules ended up in ``sys.modules``. The ``--help`` of every command
registered in ``remedy.kb.cli._COMMANDS`` is checked, new ones included; the commands listed in
``LIGHT`` are also run for real (add a new command there when it needs no embedding).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from remedy.kb.cli import _COMMANDS, app

HEAVY = ("torch", "sentence_transformers", "transformers", "lancedb", "scipy.stats")

#: registered command (group path) -> arguments that run it without embedding; "{kb}", "{out}" filled in
LIGHT = {
    "kb stats": ["--kb", "{kb}"],
    "kb schema": [],
    "kb export": ["{out}", "--kb", "{kb}"],
    "case show": ["{case}", "--kb", "{kb}"],
    "doctor": [],
}
#: commands that embed, roll out or train by design (their --help must still be light)
HEAVY_BY_DESIGN = {
    "patch check",
    "kb init",
    "kb reindex",
    "kb import",
    "query",
    "case similar",
    "similar",
    "signature",
    "verify",
    "diagnose",
    "fix",
    "bench build",
    "bench run",
    "bench curve",
    "demo",
}

# Runs several command lines in one interpreter (one start-up instead of many): if none of them
# leaves a heavy module in sys.modules, none of them imported one.
_PROBE = f"""
import json, sys
from remedy.kb.cli import main
codes = []
for argv in json.loads(sys.argv[1]):
    sys.argv = ["remedy", *argv]
    try:
        main()
    except SystemExit as ex:
        codes.append(ex.code or 0)
    else:
        codes.append(0)
print("\\nMODULES " + json.dumps({{"codes": codes, "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""


def _names() -> list[str]:
    names = []
    for group, name, _ in _COMMANDS:
        prefix = "" if group is app else next(g.name for g in app.registered_groups if g.typer_instance is group)
        names.append(f"{prefix} {name}".strip())
    return names


def _probe(*argvs: list[str]) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(argvs)], capture_output=True, text=True, env=env, timeout=300
    )
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("MODULES "))
    return json.loads(line.removeprefix("MODULES ")) | {"stderr": proc.stderr}


def test_listed_commands_are_registered():
    assert set(LIGHT) | HEAVY_BY_DESIGN <= set(_names())


def test_help_imports_nothing_heavy():
    assert _probe(["--help"])["heavy"] == []


def test_help_of_every_command_is_light():
    res = _probe(*([*name.split(), "--help"] for name in sorted(_names())))
    assert res["codes"] == [0] * len(_names()) and res["heavy"] == [], res["stderr"][-2000:]


def test_light_commands_import_nothing_heavy(light_kb, tmp_path):
    kb, case_id = light_kb
    fill = {"{kb}": str(kb), "{out}": str(tmp_path / "out.jsonl"), "{case}": case_id}
    names = sorted(LIGHT)
    res = _probe(*([*name.split(), *(fill.get(a, a) for a in LIGHT[name])] for name in names))
    assert res["codes"] == [0] * len(names), res["stderr"][-2000:]
    assert res["heavy"] == [], f"one of {names} imported {res['heavy']}"
    assert (tmp_path / "out.jsonl").stat().st_size > 0  # the export really ran


@pytest.fixture(scope="module")
def light_kb(tmp_path_factory):
    """A KB holding the bundled examples, made in this process (the subprocesses only read it)."""
    from remedy.kb.facade import KnowledgeBase
    from remedy.retrieval.embedder import default_embedder

    root = tmp_path_factory.mktemp("light") / "kb"
    with KnowledgeBase.open(root, embedder=default_embedder()) as kb:
        kb.load_examples()
        case_id = next(iter(kb.cases())).case_id
    return root, case_id


#: what a query may import (it searches the LanceDB index) and what it must not (the encoder runs in numpy;
#: ONNX Runtime is the service's encoder, too slow to load for one query)
NO_TORCH = ("torch", "sentence_transformers", "transformers", "onnxruntime", "onnx")


def test_query_and_describe_run_without_torch(light_kb):
    kb, _ = light_kb
    probe = _PROBE.replace(repr(HEAVY), repr(NO_TORCH))
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("REMEDY_EMBEDDER", None)
    argvs = [
        ["query", "the lander hovers above the pad", "--kb", str(kb), "--json"],
        ["diagnose", "--describe", "the pendulum chatters", "--env", "Pendulum-v1", "--kb", str(kb)],
    ]
    proc = subprocess.run(
        [sys.executable, "-c", probe, json.dumps(argvs)], capture_output=True, text=True, env=env, timeout=300
    )
    res = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("MODULES ")).removeprefix("MODULES "))
    assert res["codes"] == [0, 0], proc.stderr[-2000:]
    assert res["heavy"] == [], f"a query imported {res['heavy']}"


def test_help_loads_neither_numpy_nor_the_case_models():
    probe = _PROBE.replace(repr(HEAVY), repr(("numpy", "remedy.cases.model", "remedy.cases.patches.spec")))
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-c", probe, json.dumps([["--help"]])], capture_output=True, text=True, env=env
    )
    res = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("MODULES ")).removeprefix("MODULES "))
    assert res["codes"] == [0] and res["heavy"] == [], proc.stderr[-2000:]
