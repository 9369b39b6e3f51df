"""The limited worker process: results, exceptions, wall/CPU/memory limits, crashes, scratch dir, network."""

from __future__ import annotations

import math
import os
import socket
import time
from pathlib import Path

import pytest

from remedy.cases.errors import SandboxError
from remedy.cases.patches.worker import Limits, network_isolation_available, run_limited

FAST = Limits(cpu_s=20, memory_mb=1024, wall_s=30)


def _cwd_and_write() -> str:
    Path("scratch.txt").write_text("x")
    return os.getcwd()


def _connect(port: int) -> str:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError as ex:
        return f"refused: {ex}"
    return "connected"


def _pid() -> int:
    return os.getpid()


def test_returns_the_result_from_another_process():
    assert run_limited(math.factorial, 10, limits=FAST) == 3628800
    assert run_limited(_pid, limits=FAST) != os.getpid()


def test_kwargs_and_closures_travel():
    assert run_limited(sorted, [3, 1, 2], reverse=True, limits=FAST) == [3, 2, 1]
    offset = 5
    assert run_limited(lambda x: x + offset, 1, limits=FAST) == 6


def test_remote_exception_becomes_sandbox_error_with_type_and_message():
    with pytest.raises(SandboxError, match=r"raised ValueError: invalid literal") as info:
        run_limited(int, "not a number", limits=FAST)
    assert info.value.reason == "exception" and info.value.remote_type == "ValueError"
    assert "Traceback" not in str(info.value)


def test_wall_clock_limit_kills_the_child():
    start = time.monotonic()
    with pytest.raises(SandboxError, match=r"timed out after 1s") as info:
        run_limited(time.sleep, 60, limits=Limits(cpu_s=20, memory_mb=1024, wall_s=1))
    assert info.value.reason == "timeout"
    assert time.monotonic() - start < 30  # generous: the point is that it did not wait 60 s


def test_memory_limit():
    with pytest.raises(SandboxError, match=r"exceeded memory limit \(512 MB\)") as info:
        run_limited(bytearray, 10**10, limits=Limits(cpu_s=20, memory_mb=512, wall_s=30))
    assert info.value.reason == "memory"


def test_cpu_time_limit_on_a_c_level_loop():
    # sum(range(...)) never returns to the interpreter loop, so only the rlimit can stop it
    with pytest.raises(SandboxError, match=r"CPU-time limit") as info:
        run_limited(sum, range(10**13), limits=Limits(cpu_s=1, memory_mb=1024, wall_s=60))
    assert info.value.reason == "cpu"


def test_a_crashing_child_does_not_take_the_parent_down():
    with pytest.raises(SandboxError, match=r"killed by signal 6 \(SIGABRT\)"):
        run_limited(os.abort, limits=FAST)
    with pytest.raises(SandboxError, match=r"without a result"):
        run_limited(os._exit, 3, limits=FAST)
    assert run_limited(math.sqrt, 4.0, limits=FAST) == 2.0  # and the next job runs normally


def test_scratch_dir_is_the_working_dir_and_is_removed(tmp_path):
    cwd = run_limited(_cwd_and_write, limits=FAST)
    assert cwd != os.getcwd() and not Path(cwd).exists()
    kept = tmp_path / "scratch"
    assert run_limited(_cwd_and_write, limits=FAST, scratch_dir=kept) == str(kept)
    assert (kept / "scratch.txt").read_text() == "x"


def test_unpicklable_argument_is_a_clear_error():
    import threading

    with pytest.raises(SandboxError, match=r"cannot send .* to a worker process"):
        run_limited(len, threading.Lock(), limits=FAST)


def test_child_cannot_reach_a_listener_the_parent_opened():
    if not network_isolation_available():
        pytest.skip("no network namespaces here (unshare(CLONE_NEWNET) refused); workers share the host network")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        assert _connect(port) == "connected"  # reachable from the parent
        result = run_limited(_connect, port, limits=FAST)
    assert result.startswith("refused"), result
    # with isolation switched off the same child connects, so the refusal above is the namespace's doing
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        open_limits = Limits(cpu_s=20, memory_mb=1024, wall_s=30, no_network=False)
        assert run_limited(_connect, server.getsockname()[1], limits=open_limits) == "connected"


def _fork_a_sleeper() -> int:
    pid = os.fork()
    if pid == 0:  # the grandchild keeps the result pipe open and would outlive the job
        time.sleep(60)
        os._exit(0)
    return pid


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")  # a zombie waiting for init to reap it is dead too


def test_a_forked_grandchild_neither_blocks_the_answer_nor_survives():
    start = time.monotonic()
    pid = run_limited(_fork_a_sleeper, limits=Limits(cpu_s=20, memory_mb=1024, wall_s=50))
    assert time.monotonic() - start < 40  # the answer came back without waiting for the sleeper
    deadline = time.monotonic() + 10
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(pid)


_PARENT = """
import sys, time
from pathlib import Path
from remedy.cases.patches.worker import Limits, run_limited
sys.path.insert(0, sys.argv[2])
from test_worker import _record_pid_and_sleep
run_limited(_record_pid_and_sleep, sys.argv[1], limits=Limits(cpu_s=60, memory_mb=1024, wall_s=120))
"""


def _record_pid_and_sleep(path: str) -> None:
    Path(path).write_text(str(os.getpid()))
    time.sleep(120)


def test_a_worker_dies_with_the_process_that_started_it(tmp_path):
    """A `kill -9` of a fix loop must not leave its training workers running as orphans."""
    import signal
    import subprocess
    import sys

    marker = tmp_path / "worker.pid"
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(marker), str(Path(__file__).parent)])
    try:
        deadline = time.monotonic() + 60
        while not (marker.exists() and marker.read_text()) and time.monotonic() < deadline:
            assert parent.poll() is None, "the parent exited before its worker started"
            time.sleep(0.05)
        worker = int(marker.read_text())
        assert not _gone(worker)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while not _gone(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(worker)
    finally:
        if parent.poll() is None:
            parent.kill()
