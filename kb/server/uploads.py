"""Uploaded run directories: a ``.tar.gz`` unpacked safely under the KB's ``runs/`` folder.

An archive is refused as a whole (nothing is left on disk) when any member has
an absolute path or a ``..`` part, is a symlink or hard link (a run directory
needs neither, and a link is the usual way out of the folder), a device file or
a FIFO, or when the archive is not gzip/tar, holds too many members, or unpacks
to more than the size limit. The members that pass are extracted with
tarfile's ``data`` filter as a second line of defence.
"""

from __future__ import annotations

import io
import re
import secrets
import shutil
import tarfile
from pathlib import Path, PurePosixPath

from remedy.cases.errors import RunDirError, ValidationError

__all__ = ["UploadError", "UploadTooLargeError", "unpack_run", "run_path", "MAX_MEMBERS"]

#: most members an uploaded archive may hold
MAX_MEMBERS = 2_000
_RUN_ID = re.compile(r"^run-[0-9a-f]{12}$")


class UploadError(ValidationError):
    """An uploaded archive is malformed or would escape its folder."""


class UploadTooLargeError(UploadError):
    """An upload (or what it unpacks to) is over the service's size limit."""


def _check_member(m: tarfile.TarInfo) -> None:
    name = PurePosixPath(m.name)
    if m.name.startswith(("/", "\\")) or name.is_absolute() or re.match(r"^[A-Za-z]:", m.name):
        raise UploadError(f"archive member {m.name!r} has an absolute path; tar the run directory with relative paths")
    if ".." in name.parts:
        raise UploadError(f"archive member {m.name!r} climbs out with '..'; tar the run directory itself")
    if m.issym() or m.islnk():
        raise UploadError(
            f"archive member {m.name!r} is a link ({m.linkname!r}); a run directory needs none, "
            "copy the file instead (tar --dereference)"
        )
    if not (m.isfile() or m.isdir()):
        raise UploadError(f"archive member {m.name!r} is a device, FIFO or other special file; remove it")


def _members(tar: tarfile.TarFile, max_bytes: int) -> list[tarfile.TarInfo]:
    members: list[tarfile.TarInfo] = []
    total = 0
    for m in tar:
        if len(members) >= MAX_MEMBERS:
            raise UploadTooLargeError(f"archive has more than {MAX_MEMBERS} members; upload only the run directory")
        _check_member(m)
        total += m.size
        if total > max_bytes:
            raise UploadTooLargeError(f"archive unpacks to more than {max_bytes:,} bytes; leave out large logs")
        members.append(m)
    return members


def _run_root(dest: Path) -> Path:
    """The unpacked run directory: ``dest`` itself, or its single top-level folder."""
    if (dest / "run.yaml").is_file():
        return dest
    subdirs = [p for p in dest.iterdir() if p.is_dir()]
    if len(subdirs) == 1 and (subdirs[0] / "run.yaml").is_file():
        return subdirs[0]
    raise RunDirError(
        "the archive holds no run.yaml at its top or in its single top folder; "
        "upload `tar czf run.tgz -C PARENT RUN_DIR`"
    )


def unpack_run(data: bytes, runs_dir: Path, max_bytes: int) -> tuple[str, Path]:
    """Unpack a gzipped tar of a run directory under ``runs_dir``; returns (run id, run directory)."""
    run_id = f"run-{secrets.token_hex(6)}"
    dest = runs_dir / run_id
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            members = _members(tar, max_bytes)
            dest.mkdir(parents=True)
            tar.extractall(dest, members=members, filter="data")
        return run_id, _run_root(dest)
    except (tarfile.TarError, EOFError, OSError) as err:
        shutil.rmtree(dest, ignore_errors=True)
        raise UploadError(f"the upload is not a readable .tar.gz ({err}); send `tar czf` output") from None
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise


def run_path(runs_dir: Path, run_id: str) -> Path:
    """The directory of an uploaded run; :class:`RunDirError` for an unknown or malformed id."""
    dest = runs_dir / run_id
    if not _RUN_ID.match(run_id) or not dest.is_dir():
        raise RunDirError(f"no uploaded run {run_id!r}; upload one with POST /v1/runs first")
    return _run_root(dest)
