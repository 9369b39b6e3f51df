"""Run-directory uploads: a good archive unpacks; escaping, linked, special or oversized ones are refused whole."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import pytest

from remedy.kb.client import tar_run
from remedy.kb.server.uploads import UploadError, UploadTooLargeError, unpack_run

QUICK = Path(str(resources.files("remedy.cases") / "scenarios" / "checkpoints" / "cartpole_undertrained"))


def _tar(add) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        add(tar)
    return buf.getvalue()


def _file(tar: tarfile.TarFile, name: str, data: bytes = b"x") -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _special(name: str, kind: bytes, linkname: str = "") -> Callable[[tarfile.TarFile], None]:
    def add(tar: tarfile.TarFile) -> None:
        _file(tar, "run/run.yaml", b"env_id: CartPole-v1\n")
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, linkname
        tar.addfile(info)

    return add


HOSTILE = {
    "absolute": lambda tar: _file(tar, "/tmp/remedy-upload-escape"),
    "dotdot": lambda tar: _file(tar, "run/../../remedy-upload-escape"),
    "symlink_out": _special("run/model.zip", tarfile.SYMTYPE, "/etc/passwd"),
    "hardlink": _special("run/model.zip", tarfile.LNKTYPE, "run/run.yaml"),
    "char_device": _special("run/dev", tarfile.CHRTYPE),
    "block_device": _special("run/blk", tarfile.BLKTYPE),
    "fifo": _special("run/fifo", tarfile.FIFOTYPE),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_archives_are_refused_and_leave_nothing(tmp_path, name):
    runs = tmp_path / "runs"
    with pytest.raises(UploadError):
        unpack_run(_tar(HOSTILE[name]), runs, max_bytes=10_000_000)
    assert not runs.exists() or not any(runs.iterdir())
    assert not (tmp_path / "remedy-upload-escape").exists() and not (tmp_path.parent / "remedy-upload-escape").exists()


def test_archive_unpacking_past_the_limit_is_refused(tmp_path):
    data = _tar(lambda tar: _file(tar, "run/big.bin", b"\0" * 200_000))  # gzip squeezes it to a few hundred bytes
    assert len(data) < 2_000
    with pytest.raises(UploadTooLargeError):
        unpack_run(data, tmp_path / "runs", max_bytes=100_000)


def test_not_a_tarball_is_refused(tmp_path):
    with pytest.raises(UploadError, match="not a readable .tar.gz"):
        unpack_run(b"PK\x03\x04 a zip, not a tarball", tmp_path / "runs", max_bytes=10_000)


def test_shipped_run_round_trips_through_the_api(served):
    r = served.client.post("/v1/runs", content=tar_run(QUICK), headers=served.auth("writer"))
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["env_id"] == "CartPole-v1" and body["algo"] == "PPO"
    unpacked = served.service.runs_dir / body["run_id"] / QUICK.name
    assert (unpacked / "model.zip").read_bytes() == (QUICK / "model.zip").read_bytes()


@pytest.mark.parametrize("name", ["symlink_out", "dotdot", "char_device"])
def test_hostile_upload_is_422_through_the_api(served, name):
    r = served.client.post("/v1/runs", content=_tar(HOSTILE[name]), headers=served.auth("writer"))
    assert r.status_code == 422 and r.json()["error"] == "UploadError", r.text
    assert not served.service.runs_dir.exists() or not any(served.service.runs_dir.iterdir())


def test_upload_over_the_size_limit_is_413(kb_path, embedder):
    from .conftest import serve

    for s in serve(kb_path, embedder, run_jobs=False, max_upload_bytes=1_000):
        r = s.client.post("/v1/runs", content=tar_run(QUICK), headers=s.auth("writer"))
        assert r.status_code == 413


def test_archive_without_run_yaml_is_refused(served):
    r = served.client.post("/v1/runs", content=_tar(lambda t: _file(t, "notes.txt")), headers=served.auth("writer"))
    assert r.status_code == 422 and "run.yaml" in r.json()["detail"]
    assert not any(served.service.runs_dir.iterdir())


def test_diagnose_an_uploaded_run(served):
    run_id = served.client.post("/v1/runs", content=tar_run(QUICK), headers=served.auth("writer")).json()["run_id"]
    r = served.client.post(
        "/v1/diagnose", json={"run_id": run_id, "episodes": 3, "k": 3}, headers=served.auth("reader")
    )
    assert r.status_code == 200, r.text
    report = r.json()
    assert report["diagnosis"]["causes"] and report["candidates"]
    assert report["signature"]["summary"]


def test_diagnose_a_signature_and_refuse_neither(served):
    from ..conftest import corpus_cases

    case = corpus_cases()[0]
    body = {"subject": case.subject.model_dump(mode="json"), "signature": case.signature.model_dump(mode="json")}
    r = served.client.post("/v1/diagnose", json=body, headers=served.auth("reader"))
    assert r.status_code == 200 and r.json()["diagnosis"]["backend"] == "offline", r.text
    r = served.client.post("/v1/diagnose", json={"k": 3}, headers=served.auth("reader"))
    assert r.status_code == 422 and "run_id" in r.json()["detail"]
    r = served.client.post("/v1/diagnose", json={"run_id": "../../etc"}, headers=served.auth("reader"))
    assert r.status_code == 422 and "no uploaded run" in r.json()["detail"]
