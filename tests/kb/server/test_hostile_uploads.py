"""Hostile uploads (issue 29): header sizes checked before tarfile reads them, inflated bytes capped,
small error bodies, per-token quota and expiry. Every archive here is a few kilobytes."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import tarfile
import threading
import time
from importlib import resources
from pathlib import Path

import pytest
import yaml

from remedy.kb.client import tar_run
from remedy.kb.server.app import _Sweeper
from remedy.kb.server.uploads import (
    MAX_NAME_BYTES,
    UploadError,
    UploadQuotaError,
    UploadShelf,
    UploadTooLargeError,
    unpack_run,
)

from .conftest import serve

QUICK = Path(str(resources.files("remedy.cases") / "scenarios" / "checkpoints" / "cartpole_undertrained"))
GiB = 1 << 30


def _header(name: bytes, size: int, kind: bytes) -> bytes:
    """One raw 512-byte GNU tar header whose size field says ``size`` (no payload follows it here)."""
    h = bytearray(512)
    h[0 : len(name)] = name
    h[100:108], h[108:116], h[116:124] = b"0000644\0", b"0000000\0", b"0000000\0"
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"00000000000\0"
    h[156:157] = kind
    h[257:265] = b"ustar  \0"
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def _claims(kind: bytes, size: int) -> bytes:
    """A 1-KB gzip whose first header claims ``size`` bytes of long name (L) or PAX records (x)."""
    return gzip.compress(_header(b"././@LongLink", size, kind) + b"A" * 512)


def _real_tar(add) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.GNU_FORMAT) as tar:
        add(tar)
    return buf.getvalue()


def _file(tar: tarfile.TarFile, name: str, data: bytes = b"x") -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize(
    ("kind", "size", "what"),
    [(b"L", 2 * GiB, "long-name header"), (b"K", 2 * GiB, "long-name header"), (b"x", 128 << 20, "PAX header")],
)
def test_huge_declared_headers_are_refused_before_they_are_read(tmp_path, kind, size, what):
    """The 2.2 MB upload that took the service to 17.5 GB: now refused on the header's size field."""
    with pytest.raises(UploadError, match=what) as err:
        unpack_run(_claims(kind, size), tmp_path / "runs", max_bytes=10_000_000)
    assert len(str(err.value)) < 300
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_real_long_name_over_the_limit_is_refused_and_not_echoed(tmp_path):
    name = "run/" + "n" * (MAX_NAME_BYTES + 100)
    with pytest.raises(UploadError, match="long-name header") as err:
        unpack_run(_real_tar(lambda t: _file(t, name)), tmp_path / "runs", max_bytes=10_000_000)
    assert "nnnnnnnnnn" not in str(err.value)


def test_a_long_bad_name_is_quoted_cut_short(tmp_path):
    name = "/" + "a" * 3_000  # under the long-name cap, but absolute
    with pytest.raises(UploadError, match="absolute path") as err:
        unpack_run(_real_tar(lambda t: _file(t, name)), tmp_path / "runs", max_bytes=10_000_000)
    assert len(str(err.value)) < 300


def test_sparse_members_are_refused(tmp_path):
    data = gzip.compress(_header(b"run/sparse", 0, b"S") + b"\0" * 1024)
    with pytest.raises(UploadError, match="sparse"):
        unpack_run(data, tmp_path / "runs", max_bytes=10_000_000)


def test_inflated_bytes_are_capped_as_a_stream(tmp_path):
    """5 MB of zeros squeezed to a few KB: refused at the cap, whatever the tar headers say."""
    bomb = gzip.compress(b"\0" * 5_000_000)
    assert len(bomb) < 10_000
    with pytest.raises(UploadTooLargeError, match="inflates to more than"):
        unpack_run(bomb, tmp_path / "runs", max_bytes=1_000)


def test_hostile_headers_get_small_error_bodies_through_the_api(served):
    for kind, size in ((b"L", 2 * GiB), (b"x", 128 << 20)):
        r = served.client.post("/v1/runs", content=_claims(kind, size), headers=served.auth("writer"))
        assert r.status_code == 422 and r.json()["error"] == "UploadError", r.text
        assert len(r.content) < 1_000
    assert not served.service.runs_dir.exists() or not any(served.service.runs_dir.iterdir())


def test_an_upload_is_validated_on_acceptance(served, tmp_path):
    """A run.yaml with a constraint that would hang every env step is refused at upload, not kept."""
    run = tmp_path / QUICK.name
    shutil.copytree(QUICK, run)
    data = yaml.safe_load((run / "run.yaml").read_text())
    data["constraints"] = [{"name": "boom", "expr": "((((((((10**8)**8)**8)**8)**8)**8)**8)**8) > 0"}]
    (run / "run.yaml").write_text(yaml.safe_dump(data))
    r = served.client.post("/v1/runs", content=tar_run(run), headers=served.auth("writer"))
    assert r.status_code == 422 and "nests powers" in r.json()["detail"], r.text
    assert "\n" not in r.json()["detail"]
    assert not any(served.service.runs_dir.iterdir())


def test_remedy_signature_refuses_the_same_run_in_one_line(tmp_path, monkeypatch, capsys):
    """`remedy signature` read the run.yaml through the same RunDir.load and hung the same way."""
    from remedy.kb.cli import main

    run = tmp_path / QUICK.name
    shutil.copytree(QUICK, run)
    data = yaml.safe_load((run / "run.yaml").read_text())
    data["constraints"] = [{"name": "boom", "expr": "((((((((10**8)**8)**8)**8)**8)**8)**8)**8) > 0"}]
    (run / "run.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setattr("sys.argv", ["remedy", "signature", str(run), "--episodes", "1"])
    with pytest.raises(SystemExit) as ex:
        main()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert ex.value.code == 1 and len(err) == 1 and "nests powers" in err[0], err


# -- quota and expiry -------------------------------------------------------------------------


def test_uploads_count_against_the_senders_quota(kb_path, embedder):
    size = tar_run(QUICK)
    for s in serve(kb_path, embedder, run_jobs=False, upload_quota_bytes=100_000):
        first = s.client.post("/v1/runs", content=size, headers=s.auth("writer"))
        assert first.status_code == 201, first.text
        second = s.client.post("/v1/runs", content=size, headers=s.auth("writer"))
        assert second.status_code == 413 and second.json()["error"] == "UploadQuotaError", second.text
        assert "quota" in second.json()["detail"]
        other = s.service.tokens.create("writer", "another")[1]
        third = s.client.post("/v1/runs", content=size, headers={"Authorization": f"Bearer {other}"})
        assert third.status_code == 201, third.text  # the quota is per token
        assert len([p for p in s.service.runs_dir.iterdir() if p.is_dir()]) == 2


def test_quota_counts_what_is_kept(tmp_path):
    shelf = UploadShelf(tmp_path / "runs", max_bytes=10_000_000, quota_bytes=100_000, ttl_seconds=None)
    data = tar_run(QUICK)
    run_id, _ = shelf.accept(data, "ada", lambda p: None)
    assert 60_000 < shelf.used("ada") < 100_000 and shelf.used("bob") == 0
    with pytest.raises(UploadQuotaError):
        shelf.accept(data, "ada", lambda p: None)
    shelf.remove(run_id)
    assert shelf.used("ada") == 0
    shelf.accept(data, "ada", lambda p: None)  # room again


def test_old_uploads_expire_except_those_of_active_jobs(tmp_path):
    shelf = UploadShelf(tmp_path / "runs", max_bytes=10_000_000, quota_bytes=None, ttl_seconds=3600)
    a, _ = shelf.accept(tar_run(QUICK), "ada", lambda p: None)
    b, _ = shelf.accept(tar_run(QUICK), "ada", lambda p: None)
    assert shelf.expire() == []  # fresh
    assert shelf.expire(keep={b}, now=time.time() + 7200) == [a]
    assert [u.run_id for u in shelf.uploads()] == [b]
    assert not (tmp_path / "runs" / a).exists()


def test_expired_uploads_are_removed_at_start_up(kb_path, embedder):
    for s in serve(kb_path, embedder, run_jobs=False):
        run_id = s.client.post("/v1/runs", content=tar_run(QUICK), headers=s.auth("writer")).json()["run_id"]
    legacy = kb_path / "runs" / "run-0123456789ab"  # an upload from before quotas: judged by its folder's time
    shutil.copytree(QUICK, legacy / QUICK.name)
    week_ago = time.time() - 7 * 24 * 3600
    os.utime(legacy, (week_ago, week_ago))
    for s in serve(kb_path, embedder, run_jobs=False, upload_ttl_hours=24):
        assert [u.run_id for u in s.service.uploads.uploads()] == [run_id]


def test_the_sweeper_repeats_until_stopped():
    calls, twice = [], threading.Event()

    def sweep() -> None:
        calls.append(1)
        if len(calls) >= 2:
            twice.set()

    sweeper = _Sweeper(sweep, 0.01)
    assert twice.wait(30)
    sweeper.stop()
    n = len(calls)
    time.sleep(0.05)
    assert len(calls) == n
