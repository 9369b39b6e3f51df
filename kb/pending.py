"""Crash repair between the store write and the index write: the ``index-pending/`` files.

Each write first leaves the ids it writes in ``index-pending/`` and removes them once the index has
them; a process killed in between leaves the file, and the next reconcile re-indexes those ids
(:meth:`remedy.kb.facade.KnowledgeBase.reconcile`), so a changed case is repaired, not only a
missing id.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from pathlib import Path

from remedy.cases.errors import DiskFullError, KBPathError, is_disk_full
from remedy.cases.model import Case

__all__ = ["PENDING_DIR", "PendingWrite", "finished_writes", "drop"]

#: one file per write in progress, naming the ids written
PENDING_DIR = "index-pending"

#: names of this process's pending-write files still in progress (other threads' writes): not finished
_IN_FLIGHT: set[str] = set()


class PendingWrite:
    """The file in ``index-pending/`` naming the ids of one write, from before its store write until its
    index write returned. A process killed in between leaves it; the next reconcile re-indexes them."""

    def __init__(self, root: Path, cases: dict[str, Case]) -> None:
        self.path = root / PENDING_DIR / f"{os.getpid()}-{uuid.uuid4().hex}.json"
        self.ids = list(cases)
        self.keep = False  # set once the store may hold new content the index lacks

    def __enter__(self) -> PendingWrite:
        if self.ids:
            _IN_FLIGHT.add(self.path.name)
            try:
                self.path.parent.mkdir(exist_ok=True)
                self.path.write_text(json.dumps(self.ids))
            except OSError as err:  # the first write of an import: a full disk shows up here
                _IN_FLIGHT.discard(self.path.name)
                self.path.unlink(missing_ok=True)
                if is_disk_full(err):
                    raise DiskFullError(
                        f"no space left on device writing {self.path.parent}; free space and retry; nothing was stored"
                    ) from None
                raise KBPathError(
                    f"cannot write {self.path.parent}: {err.strerror or err}; check its permissions"
                ) from None
        return self

    def stored(self) -> None:
        """The store write returned: until :meth:`indexed`, the index may be behind."""
        self.keep = True

    def indexed(self) -> None:
        """The index write returned too: nothing is left to repair."""
        self.keep = False

    def __exit__(self, *exc: object) -> None:
        _IN_FLIGHT.discard(self.path.name)
        if not self.keep:  # a failed store write changed nothing; a failed index write is kept for reconcile
            self.path.unlink(missing_ok=True)


def finished_writes(root: Path) -> dict[Path, set[str]]:
    """Pending-write files whose write is over (its process is gone, or it is ours and not in flight) → ids."""
    folder = root / PENDING_DIR
    if not folder.is_dir():
        return {}
    out = {}
    for path in folder.glob("*.json"):
        pid = path.name.split("-", 1)[0]
        if path.name in _IN_FLIGHT or not pid.isdigit() or _alive(int(pid)):
            continue
        try:
            ids = json.loads(path.read_text())
        except (OSError, ValueError):
            ids = []  # cut short by the crash before its store write began: nothing to repair
        out[path] = {i for i in ids if isinstance(i, str)} if isinstance(ids, list) else set()
    return out


def _alive(pid: int) -> bool:
    """True if another live process has this id (this process counts as gone: see ``_IN_FLIGHT``)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def drop(markers: dict[Path, set[str]]) -> None:
    for path in markers:
        with contextlib.suppress(OSError):
            path.unlink()
