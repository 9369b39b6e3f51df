"""Uploaded run directories: a ``.tar.gz`` unpacked safely under the KB's ``runs/`` folder.

An archive is refused as a whole (nothing is left on disk) when any member has
an absolute path or a ``..`` part, is a symlink or hard link (a run directory
needs neither, and a link is the usual way out of the folder), a device file, a
FIFO or a sparse file, or when the archive is not gzip/tar, holds too many
members, or unpacks to more than the size limit. The members that pass are
extracted with tarfile's ``data`` filter as a second line of defence.

Every size is checked before the bytes it announces are read: the gzip stream is
inflated once with a cap (a bomb stops at the cap, its output discarded), and a
GNU long-name or PAX header is refused on its declared size, because tarfile
reads such a header's whole payload into memory. Error messages quote at most
the start of a member name.

:class:`UploadShelf` keeps the uploads: who sent each one and how big it is, a
per-token quota, and expiry of uploads older than the service's time to live.
"""

from __future__ import annotations

import io
import json
import re
import secrets
import shutil
import tarfile
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TypeVar

from remedy.cases.errors import RunDirError, ValidationError

__all__ = [
    "UploadError",
    "UploadTooLargeError",
    "UploadQuotaError",
    "UploadShelf",
    "unpack_run",
    "run_path",
    "MAX_MEMBERS",
    "MAX_NAME_BYTES",
    "MAX_PAX_BYTES",
]

T = TypeVar("T")  # what an upload's validation returns (the run's config)

#: most members an uploaded archive may hold
MAX_MEMBERS = 2_000
#: largest GNU long name or long link target (Linux paths stop at 4,096 bytes)
MAX_NAME_BYTES = 4_096
#: largest PAX extended header (a few records of path, times and sizes)
MAX_PAX_BYTES = 64 * 1024
#: tar's own bytes (headers, padding) allowed on top of the unpacked size, per member
_TAR_OVERHEAD = 2 * 1024
_CHUNK = 1 << 20
_RUN_ID = re.compile(r"^run-[0-9a-f]{12}$")
_META = ".remedy-upload.json"  # in each upload's folder, written after unpacking: owner, bytes, time


class UploadError(ValidationError):
    """An uploaded archive is malformed or would escape its folder."""


class UploadTooLargeError(UploadError):
    """An upload (or what it unpacks to) is over the service's size limit."""


class UploadQuotaError(UploadTooLargeError):
    """Storing an upload would put its sender over the per-token quota."""


def _show(name: str, limit: int = 80) -> str:
    """A member name for an error message: quoted, and cut when long (a name may be megabytes)."""
    return repr(name[:limit] + "…") if len(name) > limit else repr(name)


class _BoundedTarInfo(tarfile.TarInfo):
    """A TarInfo that refuses oversized long-name and PAX headers before tarfile reads them.

    ``TarInfo._proc_member`` is where tarfile dispatches on the header type and then reads the
    payload of a GNU long name or a PAX header whole; checking the declared size here is the
    one place that sees every header, those that follow an extended header included.
    """

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK) and self.size > MAX_NAME_BYTES:
            raise UploadError(
                f"archive has a long-name header of {self.size:,} bytes (limit {MAX_NAME_BYTES:,}); "
                "use shorter paths inside the run directory"
            )
        if self.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE) and self.size > MAX_PAX_BYTES:
            raise UploadError(
                f"archive has a PAX header of {self.size:,} bytes (limit {MAX_PAX_BYTES:,}); "
                "create it with plain `tar czf`"
            )
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise UploadError("archive holds a sparse file; a run directory needs none, tar it without --sparse")
        return super()._proc_member(tarfile_)  # type: ignore[misc]


def _check_inflated_size(data: bytes, cap: int) -> None:
    """Inflate the gzip stream (every member of it) with output discarded; refuse past ``cap`` bytes."""
    total, rest = 0, data
    try:
        while rest:
            inflater = zlib.decompressobj(wbits=31)  # 31: gzip framing
            pending = rest
            while pending and not inflater.eof:
                total += len(inflater.decompress(pending, _CHUNK))
                pending = inflater.unconsumed_tail
                if total > cap:
                    raise UploadTooLargeError(f"archive inflates to more than {cap:,} bytes; leave out large logs")
            rest = inflater.unused_data if inflater.eof else b""
            if not inflater.eof or not rest.strip(b"\0"):
                return  # a truncated stream or trailing zeros: tarfile says what is wrong, if anything
    except zlib.error as err:
        raise UploadError(f"the upload is not a readable .tar.gz ({err}); send `tar czf` output") from None


def _check_member(m: tarfile.TarInfo) -> None:
    name = PurePosixPath(m.name)
    if m.name.startswith(("/", "\\")) or name.is_absolute() or re.match(r"^[A-Za-z]:", m.name):
        raise UploadError(
            f"archive member {_show(m.name)} has an absolute path; tar the run directory with relative paths"
        )
    if ".." in name.parts:
        raise UploadError(f"archive member {_show(m.name)} climbs out with '..'; tar the run directory itself")
    if m.issym() or m.islnk():
        raise UploadError(
            f"archive member {_show(m.name)} is a link ({_show(m.linkname)}); a run directory needs none, "
            "copy the file instead (tar --dereference)"
        )
    if not (m.isfile() or m.isdir()):
        raise UploadError(f"archive member {_show(m.name)} is a device, FIFO or other special file; remove it")


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
    _check_inflated_size(data, max_bytes + MAX_MEMBERS * _TAR_OVERHEAD)
    run_id = f"run-{secrets.token_hex(6)}"
    dest = runs_dir / run_id
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz", tarinfo=_BoundedTarInfo) as tar:
            members = _members(tar, max_bytes)
            dest.mkdir(parents=True)
            tar.extractall(dest, members=members, filter="data")
        return run_id, _run_root(dest)
    except (tarfile.TarError, EOFError, OSError, UnicodeError) as err:
        shutil.rmtree(dest, ignore_errors=True)
        reason = str(err)[:200]
        raise UploadError(f"the upload is not a readable .tar.gz ({reason}); send `tar czf` output") from None
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise


def run_path(runs_dir: Path, run_id: str) -> Path:
    """The directory of an uploaded run; :class:`RunDirError` for an unknown or malformed id."""
    dest = runs_dir / run_id
    if not _RUN_ID.match(run_id) or not dest.is_dir():
        raise RunDirError(f"no uploaded run {_show(run_id, 40)}; upload one with POST /v1/runs first")
    return _run_root(dest)


# -- the shelf: quota and expiry ---------------------------------------------------------------


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


@dataclass(frozen=True)
class Upload:
    """One stored upload: its id, who sent it (a token name), its unpacked size and when it arrived."""

    run_id: str
    owner: str | None
    size: int
    created: float


class UploadShelf:
    """The ``runs/`` folder of a service: uploads accepted within a per-token quota, expired after a TTL.

    ``quota_bytes`` bounds the unpacked bytes one token may keep stored (``None``: no quota);
    ``ttl_seconds`` is how long an upload is kept (``None``: forever). Uploads are accepted one
    at a time, so two concurrent uploads cannot both slip under the quota.
    """

    def __init__(self, runs_dir: Path, max_bytes: int, quota_bytes: int | None, ttl_seconds: float | None) -> None:
        self.runs_dir, self.max_bytes = runs_dir, max_bytes
        self.quota_bytes, self.ttl_seconds = quota_bytes, ttl_seconds
        self._lock = threading.Lock()

    def accept(self, data: bytes, owner: str | None, validate: Callable[[Path], T]) -> tuple[str, T]:
        """Unpack ``data``, check it with ``validate(run_dir)`` and keep it; returns (run id, what validate returned).

        An archive that fails any check, or would put ``owner`` over the quota, leaves nothing behind.
        """
        with self._lock:
            used = self.used(owner)
            if self.quota_bytes is not None and used >= self.quota_bytes:
                raise self._over_quota(owner, used)
            limit = self.max_bytes if self.quota_bytes is None else min(self.max_bytes, self.quota_bytes - used)
            try:
                run_id, path = unpack_run(data, self.runs_dir, limit)
            except UploadTooLargeError:
                if limit < self.max_bytes:
                    raise self._over_quota(owner, used) from None
                raise
            try:
                checked = validate(path)
                meta = {"owner": owner, "size": _dir_bytes(self.runs_dir / run_id), "created": time.time()}
                self._meta_path(run_id).write_text(json.dumps(meta))
            except BaseException:
                self.remove(run_id)  # an unusable run is not kept
                raise
            return run_id, checked

    def _over_quota(self, owner: str | None, used: int) -> UploadQuotaError:
        return UploadQuotaError(
            f"token {owner!r} keeps {used:,} bytes of uploads; with this one it would pass its quota of "
            f"{self.quota_bytes:,} bytes. Uploads expire on their own; ask the operator for a larger "
            "--upload-quota-mb"
        )

    def _meta_path(self, run_id: str) -> Path:
        # beside the unpacked run, so ``runs/`` holds one entry per upload; written after unpacking, so
        # an archive cannot bring its own
        return self.runs_dir / run_id / _META

    def uploads(self) -> list[Upload]:
        """Every stored upload (an upload from before quotas has no owner and its folder's time)."""
        if not self.runs_dir.is_dir():
            return []
        out = []
        for folder in self.runs_dir.iterdir():
            if not (folder.is_dir() and _RUN_ID.match(folder.name)):
                continue
            try:
                meta = json.loads(self._meta_path(folder.name).read_text())
                out.append(Upload(folder.name, meta.get("owner"), int(meta["size"]), float(meta["created"])))
            except (OSError, ValueError, KeyError, TypeError):
                out.append(Upload(folder.name, None, 0, folder.stat().st_mtime))
        return out

    def used(self, owner: str | None) -> int:
        """Bytes of uploads stored for ``owner``."""
        return sum(u.size for u in self.uploads() if u.owner == owner)

    def remove(self, run_id: str) -> None:
        """Delete an upload (its folder, record included)."""
        shutil.rmtree(self.runs_dir / run_id, ignore_errors=True)

    def expire(self, keep: Iterable[str] = (), now: float | None = None) -> list[str]:
        """Remove uploads older than the TTL, except ids in ``keep`` (runs of queued or running jobs)."""
        if self.ttl_seconds is None:
            return []
        cutoff, kept = (now if now is not None else time.time()) - self.ttl_seconds, set(keep)
        with self._lock:
            old = [u.run_id for u in self.uploads() if u.created < cutoff and u.run_id not in kept]
            for run_id in old:
                self.remove(run_id)
        return old
