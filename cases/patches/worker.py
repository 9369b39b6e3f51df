"""Run a function in a fresh, resource-limited child process.

:func:`run_limited` is the one way Remedy runs anything that touches untrusted
patch code (fuzzing a reward, fine-tuning with it). The child is a new Python
interpreter (the equivalent of multiprocessing's "spawn", but started with
``python -I`` and without re-importing the caller's ``__main__``), in its own
process group and scratch working directory, with ``RLIMIT_CPU`` and
``RLIMIT_AS`` set before the job is even unpickled, a wall-clock deadline
enforced by the parent (the whole process group is killed), and -- where the
OS allows it -- a new, empty network namespace (``unshare(CLONE_NEWNET)``), so
not even loopback is reachable. Whatever the child does (crash, hang, exhaust
memory, kill itself) the parent gets a :class:`SandboxError` with one clear
reason and carries on.

Arguments and results cross the process boundary by pickle (cloudpickle for
the function when it cannot be pickled by reference), so ``fn`` should be a
module-level function and its result picklable.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import SandboxError

__all__ = ["Limits", "run_limited", "network_isolation_available", "rlimits_available", "WORKER_ENV_VARS"]

log = logging.getLogger(__name__)

#: CLONE_NEWNET from <sched.h>: a new network namespace (only an unconfigured loopback inside).
CLONE_NEWNET = 0x40000000
#: env vars that size native thread pools; each pool thread reserves address space under RLIMIT_AS.
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")
#: the only parent variables a worker sees (locale, search path, headless rendering, thread pools).
#: Untrusted patch code runs in the worker, and a user's environment holds LM API keys and tokens.
WORKER_ENV_VARS = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "MUJOCO_GL", "PYOPENGL_PLATFORM", *_THREAD_VARS)


@dataclass(frozen=True)
class Limits:
    """Resource limits for one child: CPU seconds, address space (MB), wall seconds, network.

    ``threads`` caps native thread pools (OpenMP/BLAS) in the child; ``None``
    leaves them to the libraries (each thread costs address space under the
    memory limit, so many-core machines want a cap).
    """

    cpu_s: float = 600
    memory_mb: int = 4096
    wall_s: float = 900
    no_network: bool = True
    threads: int | None = 1


# The child's bootstrap. It runs with only the standard library loaded: limits
# first, then the network namespace, then sys.path, and only then is the job
# unpickled (so imports the job triggers already count against the limits).
_CHILD_SOURCE = r"""
import ctypes, math, os, pickle, resource, sys

def _limit(which, value):
    try:
        soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value[0], hard), min(value[1], hard)
        resource.setrlimit(which, value)
        return True
    except (ValueError, OSError):
        return False

def _die_with_parent(parent):
    # a `kill -9` of the process that started this worker (say a `remedy fix`) must not leave
    # it training as an orphan: Linux sends SIGKILL here when that thread's process dies
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before the guard was set
        os._exit(1)

def _main():
    _die_with_parent(int(sys.argv[2]))
    out = os.fdopen(int(sys.argv[1]), "wb")
    stdin = sys.stdin.buffer
    head = pickle.load(stdin)
    _limit(resource.RLIMIT_CORE, (0, 0))
    cpu = max(1, math.ceil(head["cpu_s"]))
    _limit(resource.RLIMIT_CPU, (cpu, cpu + 2))
    mem = int(head["memory_mb"]) * 1024 * 1024
    _limit(resource.RLIMIT_AS, (mem, mem))
    isolated = False
    if head["no_network"]:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            isolated = libc.unshare(head["clone_newnet"]) == 0
        except (OSError, AttributeError):
            isolated = False
    sys.path[:] = head["sys_path"]
    try:
        fn, args, kwargs = pickle.loads(pickle.load(stdin))
        value = fn(*args, **kwargs)
        data = pickle.dumps(("ok", value, isolated), protocol=pickle.HIGHEST_PROTOCOL)
    except MemoryError as ex:
        data = pickle.dumps(("memory", "MemoryError", str(ex)[:500], isolated))
    except RecursionError as ex:
        data = pickle.dumps(("err", "RecursionError", str(ex)[:500], isolated))
    except BaseException as ex:
        try:
            msg = str(ex)
        except BaseException:
            msg = "<unprintable>"
        data = pickle.dumps(("err", type(ex).__name__, msg[:2000], isolated))
    out.write(len(data).to_bytes(8, "big") + data)  # length first: the parent need not wait for EOF
    out.flush()

_main()
"""


def run_limited(
    fn: Callable[..., Any],
    *args: Any,
    limits: Limits = Limits(),
    scratch_dir: Path | None = None,
    **kwargs: Any,
) -> Any:
    """Run ``fn(*args, **kwargs)`` in a fresh limited child process and return its result.

    The child works in ``scratch_dir`` (a temporary directory, removed
    afterwards, when not given). Raises :class:`SandboxError` when the child
    times out, exceeds its memory or CPU limit, dies from a signal, or raises
    (the message names the remote exception type and text, not a traceback).
    The error carries ``reason`` (``timeout``, ``memory``, ``cpu``, ``signal``,
    ``exception``, ``protocol``) and, for exceptions, ``remote_type``.
    """
    payload = _dump_job(fn, args, kwargs)
    head = {
        "cpu_s": float(limits.cpu_s),
        "memory_mb": int(limits.memory_mb),
        "no_network": bool(limits.no_network),
        "clone_newnet": CLONE_NEWNET,
        "sys_path": list(sys.path),
    }
    with _scratch(scratch_dir) as cwd, tempfile.TemporaryFile() as log_file:
        status, data = _run_child(head, payload, cwd, limits, log_file)
        if status == "answer":
            answer = _unpickle(data)
            if answer[0] == "ok":
                return _result(answer, limits)
            data = answer
        raise _failure(status, data, limits, _tail(log_file))


def network_isolation_available() -> bool:
    """Whether a child can get its own network namespace here (probed once per process)."""
    return _probe_isolation()


def rlimits_available() -> dict[str, bool]:
    """Which resource limits this process may set on a child (CPU time, address space, core size)."""
    import resource

    names = {"cpu": "RLIMIT_CPU", "memory": "RLIMIT_AS", "core": "RLIMIT_CORE"}
    return {
        key: hasattr(resource, attr) and resource.getrlimit(getattr(resource, attr))[1] != 0
        for key, attr in names.items()
    }


@lru_cache(maxsize=1)
def _probe_isolation() -> bool:
    try:
        return bool(run_limited(_isolation_probe, limits=Limits(cpu_s=30, memory_mb=1024, wall_s=60)))
    except SandboxError:
        return False


def _isolation_probe() -> bool:
    """Runs in the child: True when no non-loopback interface exists and loopback is down."""
    import socket

    try:
        socket.create_connection(("127.0.0.1", 9), timeout=1).close()
    except OSError as ex:
        return getattr(ex, "errno", None) == 101  # ENETUNREACH: only in an unconfigured namespace
    return False


# --------------------------------------------------------------------------- parent side


def _dump_job(fn: Callable[..., Any], args: tuple, kwargs: dict) -> bytes:
    try:
        if not _importable_by_child(fn):
            return _dump_by_value(fn, args, kwargs)
        return pickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as ex:
        raise SandboxError(
            f"cannot send {getattr(fn, '__name__', fn)!r} to a worker process ({type(ex).__name__}: {ex}); "
            "pass a module-level function and picklable arguments"
        ) from ex


def _importable_by_child(fn: Callable[..., Any]) -> bool:
    """Whether the child can import ``fn``'s module by name from ``sys.path`` (unlike ``__main__`` or a
    test file pytest imported by path, which only the parent's ``sys.modules`` knows)."""
    name = getattr(fn, "__module__", None)
    if not name or name == "__main__" or "<" in getattr(fn, "__qualname__", ""):
        return False
    module_file = getattr(sys.modules.get(name), "__file__", None)
    if module_file is None:
        return True  # builtins and the like
    spec = _top_level_spec(name.partition(".")[0])
    if spec is None:
        return False
    roots = [Path(p) for p in (spec.submodule_search_locations or [os.path.dirname(spec.origin or "")])]
    real = [r for r in roots if r.is_dir()]
    # a package found elsewhere than the module's file would import the wrong code; placeholder
    # locations (editable installs' path hooks) cannot be compared and are trusted
    return not real or any(Path(module_file).resolve().is_relative_to(r.resolve()) for r in real)


def _top_level_spec(top: str) -> Any:
    """Find ``top`` the way a fresh interpreter would: through the finders, never ``sys.modules``."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        try:
            spec = find(top, None) if find else None
        except Exception:
            continue
        if spec is not None:
            return spec
    return None


def _dump_by_value(fn: Callable[..., Any], args: tuple, kwargs: dict) -> bytes:
    import cloudpickle  # pickles functions by value, for modules the child cannot import

    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    if module is not None and module.__name__ != "__main__":
        cloudpickle.register_pickle_by_value(module)
    return cloudpickle.dumps((fn, args, kwargs))


@contextmanager
def _scratch(scratch_dir: Path | None) -> Iterator[Path]:
    if scratch_dir is not None:
        path = Path(scratch_dir)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    path = Path(tempfile.mkdtemp(prefix="remedy-worker-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _child_env(cwd: Path, limits: Limits) -> dict[str, str]:
    """A minimal, explicit environment: the allow-list above, HOME and TMPDIR in the scratch dir."""
    env = {k: os.environ[k] for k in WORKER_ENV_VARS if k in os.environ}
    env["HOME"] = env["TMPDIR"] = str(cwd)
    if limits.threads is not None:
        for var in _THREAD_VARS:
            env[var] = str(int(limits.threads))
    return env


def _run_child(head: dict, payload: bytes, cwd: Path, limits: Limits, log_file: Any) -> tuple[str, Any]:
    """Start the child, feed it the job, collect its answer; returns (status, data)."""
    read_fd, write_fd = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _CHILD_SOURCE, str(write_fd), str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=log_file,
            stderr=log_file,
            pass_fds=(write_fd,),
            cwd=str(cwd),
            env=_child_env(cwd, limits),
            start_new_session=True,  # own process group: a timeout kills everything it started
        )
    except OSError as ex:
        os.close(read_fd)
        os.close(write_fd)
        raise SandboxError(f"cannot start a worker process: {ex}") from ex
    os.close(write_fd)
    # fed from a thread: a large job fills the pipe, and a child that never reads must not block the deadline
    feeder = threading.Thread(target=_feed, args=(proc, head, payload), daemon=True)
    feeder.start()
    try:
        data, timed_out = _collect(read_fd, time.monotonic() + float(limits.wall_s))
        if not timed_out:
            _await_exit(proc.pid, 5.0)
    finally:
        os.close(read_fd)
        _kill_group(proc.pid)  # the leader is alive or a zombie here, so its group id is still ours
        proc.wait()
        feeder.join(timeout=5)
    if timed_out:
        return "timeout", None
    return ("answer", data) if data else ("died", proc.returncode)


def _await_exit(pid: int, timeout: float) -> None:
    """Wait up to ``timeout`` s for ``pid`` to exit without reaping it (WNOWAIT)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return
        except ChildProcessError:
            return
        time.sleep(0.01)


def _feed(proc: subprocess.Popen, head: dict, payload: bytes) -> None:
    try:
        assert proc.stdin is not None  # Popen(stdin=PIPE) always sets it
        pickle.dump(head, proc.stdin)
        pickle.dump(payload, proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass  # the child died before reading; its exit status tells why


def _collect(fd: int, deadline: float) -> tuple[bytes, bool]:
    """Read one length-prefixed answer (or up to EOF) before the deadline; returns (bytes, timed_out).

    The length prefix lets a child that leaves a grandchild holding the pipe
    still finish on time.
    """
    buf = bytearray()
    while True:
        if len(buf) >= 8 and len(buf) - 8 >= int.from_bytes(buf[:8], "big"):
            return bytes(buf[8 : 8 + int.from_bytes(buf[:8], "big")]), False
        left = deadline - time.monotonic()
        if left <= 0:
            return b"", True
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if not ready:
            continue
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"", False  # EOF before a whole answer: the child died; its exit status says how
        buf += chunk


def _kill_group(pid: int) -> None:
    with suppress(ProcessLookupError, PermissionError, OSError):
        os.killpg(pid, signal.SIGKILL)


def _tail(log_file: Any, n: int = 400) -> str:
    try:
        log_file.seek(0, os.SEEK_END)
        size = log_file.tell()
        log_file.seek(max(0, size - n))
        text = log_file.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""
    return " ".join(text.split())[-n:]


def _unpickle(data: bytes) -> tuple:
    try:
        answer = pickle.loads(data)
    except Exception as ex:
        return ("protocol", f"worker sent an unreadable result ({type(ex).__name__}: {ex})")
    if not isinstance(answer, tuple) or not answer:
        return ("protocol", "worker sent an answer of the wrong shape")
    return answer


def _result(answer: tuple, limits: Limits) -> Any:
    _, value, isolated = answer
    if limits.no_network and not isolated:
        _warn_no_isolation()
    return value


@lru_cache(maxsize=1)
def _warn_no_isolation() -> None:
    log.warning("network isolation (a new network namespace) is unavailable here; workers run with the host network")


def _failure(status: str, data: Any, limits: Limits, tail: str) -> SandboxError:
    """Turn a child's bad end into one SandboxError with a clear reason."""
    if status == "timeout":
        return _err(f"timed out after {limits.wall_s:g}s (wall-clock limit)", "timeout")
    if status == "died":
        return _died(data, limits, tail)
    tag, *rest = data
    if tag == "protocol":
        return _err(rest[0], "protocol")
    if tag == "memory":
        return _err(f"exceeded memory limit ({limits.memory_mb} MB)", "memory", "MemoryError")
    if tag == "err":
        remote_type, message = rest[0], rest[1]
        text = f"raised {remote_type}: {message}" if message else f"raised {remote_type}"
        return _err(text, "exception", remote_type)
    return _err(f"worker sent an unexpected answer {tag!r}", "protocol")  # pragma: no cover


def _died(returncode: int | None, limits: Limits, tail: str) -> SandboxError:
    suffix = f" (last output: {tail})" if tail else ""
    if returncode is not None and returncode < 0:
        sig = -returncode
        if sig == signal.SIGXCPU:
            return _err(f"exceeded CPU-time limit ({math.ceil(limits.cpu_s)}s)", "cpu")
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        hint = " (out of memory, or the CPU-time hard limit)" if sig == signal.SIGKILL else ""
        return _err(f"killed by signal {sig} ({name}){hint}{suffix}", "signal")
    if returncode == 1 and "MemoryError" in tail:  # the bootstrap itself ran out of memory
        return _err(f"exceeded memory limit ({limits.memory_mb} MB)", "memory", "MemoryError")
    return _err(f"worker exited with status {returncode} without a result{suffix}", "died")


def _err(message: str, reason: str, remote_type: str | None = None) -> SandboxError:
    err = SandboxError(message)
    err.reason = reason  # type: ignore[attr-defined]
    err.remote_type = remote_type  # type: ignore[attr-defined]
    return err
