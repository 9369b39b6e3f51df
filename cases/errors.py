"""Every error Remedy raises on purpose, under one root: :class:`RemedyError`.

Messages are written for the person at the terminal: they say what went wrong
and what to do next. The CLI prints ``str(err)`` as one red line and exits
non-zero; nothing here should ever surface as a traceback for a user mistake.
"""

from __future__ import annotations

import errno

__all__ = [
    "RemedyError",
    "KBError",
    "KBNotFoundError",
    "KBPathError",
    "KBLockedError",
    "KBVersionError",
    "DiskFullError",
    "is_disk_full",
    "CaseNotFoundError",
    "RuleNotFoundError",
    "MiningError",
    "TooFewCasesError",
    "ValidationError",
    "ImportFileError",
    "IndexMismatchError",
    "RunDirError",
    "CheckpointError",
    "EnvError",
    "PatchError",
    "PatchRejectedError",
    "SandboxError",
    "VerificationError",
    "ScenarioError",
    "ReportPathError",
    "DiagnosisError",
    "LMError",
    "OptimizeError",
    "AlgorithmError",
    "ServiceError",
]


class RemedyError(Exception):
    """Root of every error Remedy raises on purpose. ``str(err)`` is the user-facing line."""


class KBError(RemedyError):
    """Something is wrong with the knowledge base on disk."""


class KBNotFoundError(KBError):
    """The KB directory does not exist (and was not asked to be created)."""


class KBPathError(KBError):
    """The KB path is unusable: a file where a directory should be, or unwritable."""


class KBLockedError(KBError):
    """Another process holds the DuckDB file; carries the holder's PID when DuckDB names it."""

    def __init__(self, message: str, pid: int | None = None) -> None:
        super().__init__(message)
        self.pid = pid


class KBVersionError(KBError):
    """The KB was written by a newer Remedy (schema version above what this one knows)."""


class DiskFullError(KBError):
    """A write to the KB ran out of disk space ("No space left on device"); the message says what was kept."""


def is_disk_full(err: BaseException) -> bool:
    """Whether ``err`` (or an exception it was raised from or during) is a full disk: ``OSError`` ENOSPC,
    or a library error whose text carries it (DuckDB's IO errors, Lance's "os error 28")."""
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return True
        text = str(e)
        if "No space left on device" in text or "os error 28" in text:
            return True
        e = e.__cause__ or e.__context__
    return False


class CaseNotFoundError(KBError):
    """No case with the given id is stored."""


class RuleNotFoundError(KBError):
    """No mined rule with the given id is stored (the message names close ids)."""


class MiningError(RemedyError):
    """Rules cannot be mined from what the KB holds."""


class TooFewCasesError(MiningError):
    """Too few measured cases to mine; ``have`` and ``need`` say how many."""

    def __init__(self, message: str, have: int = 0, need: int = 0) -> None:
        super().__init__(message)
        self.have, self.need = have, need


class ValidationError(RemedyError):
    """A value from outside (file, HTTP, CLI) does not fit the case model."""


class ImportFileError(ValidationError):
    """An import file is malformed; ``problems`` lists (line, message) pairs."""

    def __init__(self, message: str, problems: list[tuple[int, str]] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []


class IndexMismatchError(KBError):
    """The vector index was built with another embedding model or dimension."""


class RunDirError(RemedyError):
    """A run directory is missing, incomplete, or its run.yaml is invalid."""


class CheckpointError(RunDirError):
    """The checkpoint is missing, corrupt, or does not fit the environment."""


class EnvError(RemedyError):
    """An environment id is unknown or cannot be constructed."""


class PatchError(RemedyError):
    """A patch file cannot be read or parsed."""


class PatchRejectedError(PatchError):
    """A patch does not fit the env/algorithm or broke a sandbox rule; ``rule`` names which."""

    def __init__(self, message: str, rule: str = "") -> None:
        super().__init__(message)
        self.rule = rule


class SandboxError(RemedyError):
    """Untrusted code was stopped by the sandbox (static check, fuzz, or resource limit)."""


class VerificationError(RemedyError):
    """A verification job could not be run at all (as opposed to a ``failed`` case)."""


class ScenarioError(RemedyError):
    """A fault-scenario file is missing or invalid."""


class ReportPathError(RemedyError):
    """A report directory is unusable: a file where a directory should be, or not writable."""


class DiagnosisError(RemedyError):
    """A diagnosis could not be produced."""


class LMError(DiagnosisError):
    """The configured language model is unreachable or kept answering unparseably."""


class OptimizeError(RemedyError):
    """An optimization job cannot run as asked: too few examples, an unknown backend, a bad option, no version."""


class AlgorithmError(RemedyError):
    """An algorithm name is unknown, or its package is not installed."""


class ServiceError(RemedyError):
    """A `remedy serve` refused a request or could not be reached; ``status`` is the HTTP status (0: unreachable)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status
