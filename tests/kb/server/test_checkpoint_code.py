"""A reader's diagnose of a writer's hostile upload runs none of the upload's code (issue 29)."""

from __future__ import annotations

import base64
import json
import pickle
import shutil
import zipfile
from importlib import resources
from pathlib import Path

import cloudpickle

from remedy.kb.client import tar_run

QUICK = Path(str(resources.files("remedy.cases") / "scenarios" / "checkpoints" / "cartpole_undertrained"))


class _OpenMarker:
    """Unpickling this calls ``open(marker, "w")``: the file appears iff the pickle was executed."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _hostile_run(tmp_path: Path, marker: Path, *, stats: bool = True) -> Path:
    run = tmp_path / "run"
    shutil.copytree(QUICK, run)
    mp = run / "model.zip"
    with zipfile.ZipFile(mp) as zf:
        entries = {name: zf.read(name) for name in zf.namelist()}
    data = json.loads(entries["data"])
    payload = base64.b64encode(cloudpickle.dumps(_OpenMarker(marker))).decode()
    data["lr_schedule"][":serialized:"] = payload  # a key SB3 always reads, its recorded text kept
    data["evil"] = {":type:": "<class 'object'>", ":serialized:": payload}
    entries["data"] = json.dumps(data).encode()
    with zipfile.ZipFile(mp, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, raw in entries.items():
            zf.writestr(name, raw)
    if stats:
        (run / "vecnormalize.pkl").write_bytes(pickle.dumps(_OpenMarker(marker)))
    return run


def _diagnose(served, run: Path):
    r = served.client.post("/v1/runs", content=tar_run(run), headers=served.auth("writer"))
    assert r.status_code == 201, r.text
    body = {"run_id": r.json()["run_id"], "episodes": 2, "k": 3}
    return served.client.post("/v1/diagnose", json=body, headers=served.auth("reader"))


def test_diagnose_of_a_hostile_upload_runs_no_code(served, tmp_path):
    marker = tmp_path / "pwned"
    r = _diagnose(served, _hostile_run(tmp_path / "model_only", marker, stats=False))
    assert r.status_code == 200, r.text  # the checkpoint's payload replaced, the agent diagnosed
    assert not marker.exists()
    r = _diagnose(served, _hostile_run(tmp_path / "with_stats", marker))
    assert r.status_code >= 400 and "is not allowed in normalization statistics" in r.text  # the pickle, refused
    assert not marker.exists()
