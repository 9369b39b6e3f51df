"""Hostile requests against a real `remedy serve`: does /health keep answering, and does the service stop?

Prints figures; it is not a test (the tests under tests/kb/server/test_hostile_*.py pin each refusal).
It builds a temp KB holding five cases and a writer token, starts ``remedy serve`` on a free loopback
port (upload quota 1 MB so the quota is reached quickly), and fires each hostile request class of
issue 29, one after the other, with small artefacts that exercise the limits, while a second thread
polls ``/health`` back to back. For each class it prints the response status, the slowest /health
answer while the request was in flight (target: within 1 s) and the service's peak RSS then.
Last it runs a verify job, polls /health while the job runs, and sends SIGTERM mid-job: the service
must exit (and its fine-tuning children with it, or within their own limits).

    nice .venv/bin/python bench/hostile.py
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import shutil
import signal
import sys
import tarfile
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from retrieval_speed import synth_cases
from service import start_server

from remedy.cases.io import case_to_json
from remedy.cases.store import CaseStore
from remedy.kb import KnowledgeBase
from remedy.kb.client import tar_run
from remedy.kb.server.tokens import TokenStore

QUICK = Path(str(resources.files("remedy.cases") / "scenarios" / "checkpoints" / "cartpole_undertrained"))
NESTED_POWERS = "((((((((10**8)**8)**8)**8)**8)**8)**8)**8) > 0"
GiB = 1 << 30


# -- artefacts ------------------------------------------------------------------------------------


def _header(name: bytes, size: int, kind: bytes) -> bytes:
    """One raw 512-byte GNU tar header whose size field says ``size``."""
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


def header_claim(kind: bytes, size: int, pad: int = 2_200_000) -> bytes:
    """A gzip whose first tar header claims ``size`` bytes of long name (L) or PAX records (x)."""
    return gzip.compress(_header(b"././@LongLink", size, kind) + os.urandom(pad // 2) + b"A" * (pad // 2))


def gzip_bomb(inflated: int) -> bytes:
    """A tar of one ``inflated``-byte file of zeros, gzipped as a stream (never held inflated)."""
    out = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [out.compress(_header(b"run/big.bin", inflated, b"0"))]
    chunk = b"\0" * (1 << 20)
    for _ in range(inflated // len(chunk)):
        parts.append(out.compress(chunk))
    parts.append(out.flush())
    return b"".join(parts)


def long_bad_name() -> bytes:
    """A real GNU tar whose member has a 3,000-character absolute name (under the long-name cap)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("/" + "a" * 3_000)
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    return buf.getvalue()


def nested_power_run(tmp: Path) -> bytes:
    """The shipped CartPole run with a run.yaml constraint of eight nested powers."""
    run = tmp / QUICK.name
    shutil.copytree(QUICK, run, dirs_exist_ok=True)
    data = yaml.safe_load((run / "run.yaml").read_text())
    data["constraints"] = [{"name": "boom", "expr": NESTED_POWERS}]
    (run / "run.yaml").write_text(yaml.safe_dump(data))
    return tar_run(run)


def surrogate_record() -> bytes:
    rec = json.loads(case_to_json(synth_cases(1, seed=1, prefix="bad-")[0]))
    rec["case_id"], rec["signature"]["summary"] = "c-surrogate", "hovers \ud800 forever"
    return json.dumps(rec).encode() + b"\n"


def chunked(total: int) -> Iterator[bytes]:
    """A JSON query body sent without Content-Length."""
    yield b'{"text": "'
    for _ in range(total // 65_536):
        yield b"x" * 65_536
    yield b'"}'


# -- measuring ------------------------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` in MB (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


@dataclass
class Prober:
    """Polls /health back to back in a thread, and samples the server's RSS."""

    url: str
    pid: int
    samples: list[tuple[float, float, int]] = field(default_factory=list)  # (start, latency s, status)
    rss: list[tuple[float, float]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with httpx.Client(timeout=120) as http:
            while not self.stop.is_set():
                start = time.monotonic()
                try:
                    status = http.get(f"{self.url}/health").status_code
                except httpx.HTTPError:
                    status = 0
                self.samples.append((start, time.monotonic() - start, status))
                self.rss.append((time.monotonic(), rss_mb(self.pid)))
                time.sleep(0.02)

    def window(self, t0: float, t1: float) -> tuple[float, float, int]:
        """(slowest /health latency, peak RSS MB, failed polls) for polls overlapping [t0, t1]."""
        hits = [(lat, st) for s, lat, st in list(self.samples) if s <= t1 and s + lat >= t0]
        rss = [r for t, r in list(self.rss) if t0 <= t <= t1 + 0.5]
        return (
            max((lat for lat, _ in hits), default=float("nan")),
            max(rss, default=0.0),
            sum(st != 200 for _, st in hits),
        )


@dataclass
class Row:
    """One line of the table."""

    name: str
    status: str
    seconds: float
    health_max_s: float
    rss_mb: float
    failed_polls: int
    note: str = ""


def fire(prober: Prober, name: str, send: Callable[[], httpx.Response], note: str = "") -> Row:
    """Send one hostile request and measure /health around it."""
    time.sleep(0.3)  # a few quiet polls first
    t0 = time.monotonic()
    try:
        r = send()
        status = f"{r.status_code} ({len(r.content):,} B)"
    except httpx.HTTPError as err:
        status = f"no answer: {type(err).__name__}"
    t1 = time.monotonic()
    time.sleep(0.3)
    lat, rss, failed = prober.window(t0, t1)
    return Row(name, status, t1 - t0, lat, rss, failed, note)


def requests(http: httpx.Client, tmp: Path) -> list[tuple[str, Callable[[], httpx.Response], str]]:
    """Every hostile request class: (name, send, note); artefacts are built here, before any timing."""
    post = http.post
    gz = {"content-type": "application/gzip"}
    js = {"content-type": "application/json"}
    nd = {"content-type": "application/x-ndjson"}
    deep = "[" * 100_000 + "]" * 100_000
    big_summary = b'{"signature": {"features": {}, "symptoms": [], "summary": "' + b"x" * 28_000_000 + b'"}}'
    powers, bomb = nested_power_run(tmp), gzip_bomb(GiB)
    claims = {
        k: header_claim(kind, size)
        for k, (kind, size) in {"2g": (b"L", 2 * GiB), "128m": (b"L", 128 << 20), "pax": (b"x", 128 << 20)}.items()
    }
    bad_name, surrogate, run = long_bad_name(), surrogate_record(), tar_run(QUICK)
    return [
        ("idle (no request)", lambda: (time.sleep(2.0), http.get("/health"))[1], "baseline on this machine"),
        (
            "constraint: nested powers (upload)",
            lambda: post("/v1/runs", content=powers, headers=gz),
            "validated on upload",
        ),
        (
            "tar: GNU long name claims 2 GiB",
            lambda: post("/v1/runs", content=claims["2g"], headers=gz),
            f"{len(claims['2g']):,} B upload",
        ),
        ("tar: GNU long name claims 128 MiB", lambda: post("/v1/runs", content=claims["128m"], headers=gz), ""),
        ("tar: PAX header claims 128 MiB", lambda: post("/v1/runs", content=claims["pax"], headers=gz), ""),
        (
            "tar: 3,000-char absolute name",
            lambda: post("/v1/runs", content=bad_name, headers=gz),
            "name cut in the error",
        ),
        (
            "gzip bomb: tar of 1 GiB of zeros",
            lambda: post("/v1/runs", content=bomb, headers=gz),
            f"{len(bomb):,} B upload",
        ),
        ("similar: 28 MB summary", lambda: post("/v1/similar", content=big_summary, headers=js), "before LanceDB"),
        ("similar: 5,000-char summary", lambda: post("/v1/similar", json={"signature": {"summary": "x" * 5_000}}), ""),
        ("query: JSON nested 100k deep", lambda: post("/v1/query", content='{"text": ' + deep + "}", headers=js), ""),
        ("import: array nested 100k deep", lambda: post("/v1/cases/import", content=deep, headers=js), ""),
        ("import: lone surrogate", lambda: post("/v1/cases/import", content=surrogate, headers=nd), ""),
        (
            "query: 4 MB chunked body",
            lambda: post("/v1/query", content=chunked(4 << 20), headers=js),
            "no Content-Length",
        ),
        ("diagnose: uploaded run, 100 episodes", lambda: _diagnose(http, run), "rollouts in the service"),
        ("uploads past the 1 MB quota", lambda: _fill_quota(http, run), "status of the refused one"),
    ]


def _fill_quota(http: httpx.Client, data: bytes) -> httpx.Response:
    for _ in range(40):
        r = http.post("/v1/runs", content=data, headers={"content-type": "application/gzip"})
        if r.status_code != 201:
            return r
    return r


def _diagnose(http: httpx.Client, data: bytes) -> httpx.Response:
    run_id = http.post("/v1/runs", content=data).json()["run_id"]
    return http.post("/v1/diagnose", json={"run_id": run_id, "episodes": 100, "k": 3})


def job_and_sigterm(prober: Prober, http: httpx.Client, proc, args: argparse.Namespace) -> list[Row]:
    """A verify job: /health while it runs, then SIGTERM mid-job and the time the service takes to exit."""
    # the job's upload must fit the quota the earlier rows used up: free it first
    for folder in (args.kb / "runs").iterdir():
        shutil.rmtree(folder, ignore_errors=True)
    run_id = http.post("/v1/runs", content=tar_run(QUICK)).json()["run_id"]
    body = {
        "run_id": run_id,
        "patch": {"kind": "hyperparameters", "changes": {"learning_rate": 0.001}},
        "seeds": 2,
        "budget": args.job_budget,
        "episodes": 5,
        "n_envs": 2,
        "confirm": False,
    }
    job = http.post("/v1/jobs/verify", json=body).json()
    t0 = time.monotonic()
    for _ in range(600):
        state = http.get(f"/v1/jobs/{job['job_id']}").json()["state"]
        if state != "queued":
            break
        time.sleep(0.1)
    time.sleep(args.job_seconds)
    t1 = time.monotonic()
    lat, rss, failed = prober.window(t0, t1)
    rows = [Row("verify job running (before SIGTERM)", state, t1 - t0, lat, rss, failed, f"job {job['job_id']}")]
    children = _descendants(proc.pid)
    t2 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=60)
        status = f"exit {code}"
    except Exception:
        proc.kill()
        status = "ignored: SIGKILLed after 60 s"
    gone = time.monotonic() - t2
    time.sleep(1.0)
    alive = [p for p in children if Path(f"/proc/{p}").exists() and _state(p) not in ("Z", "X")]
    rows.append(
        Row(
            "SIGTERM while the job runs",
            status,
            gone,
            float("nan"),
            0.0,
            0,
            f"children alive 1 s later: {len(alive)}/{len(children)}",
        )
    )
    return rows


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                kids = []
            out.extend(kids)
            todo.extend(kids)
    return out


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--job-budget", type=int, default=20_000, help="env steps per arm of the verify job")
    parser.add_argument("--job-seconds", type=float, default=8.0, help="seconds of /health polling during the job")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="remedy-hostile-") as tmp_s:
        tmp = Path(tmp_s)
        args.kb = tmp / "kb"
        with KnowledgeBase.open(args.kb) as kb:
            kb.add_many(synth_cases(50, seed=0, prefix="h-"))
        _, token = TokenStore(CaseStore(args.kb / "remedy.duckdb")).create("writer", "bench")
        proc, url = start_server(args.kb, extra=("--upload-quota-mb", "1"))
        prober = Prober(url, proc.pid)
        poller = threading.Thread(target=prober.run, daemon=True)
        poller.start()
        headers = {"Authorization": f"Bearer {token}"}
        rows: list[Row] = []
        try:
            with httpx.Client(base_url=url, headers=headers, timeout=300) as http:
                for name, send, note in requests(http, tmp):
                    rows.append(fire(prober, name, send, note))
                    print(_line(rows[-1]), flush=True)
                for row in job_and_sigterm(prober, http, proc, args):
                    rows.append(row)
                    print(_line(row), flush=True)
        finally:
            prober.stop.set()
            if proc.poll() is None:
                proc.kill()
        print()
        print(_table(rows))
        slow = [r.name for r in rows if r.health_max_s > 1.0]
        print(f"\n/health slower than 1 s during: {', '.join(slow) if slow else 'none'}")


def _line(r: Row) -> str:
    return (
        f"{r.name}: {r.status} in {r.seconds:.2f} s, /health max {r.health_max_s:.3f} s, RSS {r.rss_mb:.0f} MB {r.note}"
    )


def _table(rows: list[Row]) -> str:
    head = "| request class | response | took s | max /health s | failed polls | server RSS MB | note |"
    lines = [head, "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        health = "-" if r.health_max_s != r.health_max_s else f"{r.health_max_s:.3f}"
        rss = "-" if not r.rss_mb else f"{r.rss_mb:.0f}"
        lines.append(f"| {r.name} | {r.status} | {r.seconds:.2f} | {health} | {r.failed_polls} | {rss} | {r.note} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
