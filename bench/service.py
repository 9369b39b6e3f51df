"""Service benchmark: query latency and throughput of `remedy serve` under concurrent clients.

Prints figures; it is not a test. For each KB size it builds a KB of synthetic
cases (``bench/retrieval.py``'s templates, every summary embedded for real),
starts ``remedy serve`` on a free loopback port as its own process, and sends
``POST /v1/query`` (hybrid search, embedding included) from 1, 4 and 16
concurrent clients (threads, one httpx connection each), reporting p50/p95
latency and throughput. Then, with the service stopped, it times the same query
through the cold CLI (``remedy query TEXT --kb``) for contrast. Target: query
p50 <= 30 ms at 10k cases.

    nice .venv/bin/python bench/service.py --sizes 1000,10000 --queries 200
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from remedy.cases.store import CaseStore
from remedy.kb import KnowledgeBase
from remedy.kb.server.tokens import TokenStore
from retrieval import synth_cases, synth_summary

OUT = Path(__file__).parent / "out" / "service.json"
REMEDY = Path(sys.executable).parent / "remedy"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_kb(root: Path, size: int) -> tuple[str, float]:
    """A KB of ``size`` synthetic cases and a reader token; returns (token, seconds to build)."""
    start = time.perf_counter()
    with KnowledgeBase.open(root) as kb:
        kb.add_many(synth_cases(size, seed=size, prefix="svc-"))
    _, token = TokenStore(CaseStore(root / "remedy.duckdb")).create("reader", "bench")
    return token, time.perf_counter() - start


def start_server(root: Path) -> tuple[subprocess.Popen, str]:
    """`remedy serve` on a free loopback port, once /health answers (bounded wait)."""
    port = _port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [str(REMEDY), "serve", "--kb", str(root), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    for _ in range(1200):
        if proc.poll() is not None:
            raise SystemExit(f"remedy serve exited: {proc.stderr.read()}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.25)
    proc.terminate()
    raise SystemExit("remedy serve never answered /health")


def _client(url: str, token: str, texts: list[str], out: list[float]) -> None:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as http:
        for text in texts:
            t0 = time.perf_counter()
            r = http.post("/v1/query", json={"text": text, "k": 10})
            out.append(time.perf_counter() - t0)
            r.raise_for_status()


def load(url: str, token: str, texts: list[str], clients: int) -> dict[str, float]:
    """Split ``texts`` over ``clients`` threads; p50/p95 latency (ms) and queries/s overall."""
    chunks = [texts[i::clients] for i in range(clients)]
    lat: list[float] = []
    threads = [threading.Thread(target=_client, args=(url, token, c, lat)) for c in chunks]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    ms = np.array(lat) * 1000
    return {
        "clients": clients,
        "queries": len(lat),
        "p50_ms": float(np.percentile(ms, 50)),
        "p95_ms": float(np.percentile(ms, 95)),
        "qps": len(lat) / wall,
    }


def cold_cli(root: Path, text: str, runs: int) -> float:
    """Median wall seconds of `remedy query TEXT --kb ROOT` in a fresh process."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(
            [str(REMEDY), "query", text, "--kb", str(root), "--json"],
            check=True,
            capture_output=True,
            env={**os.environ},
        )
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_size(size: int, args: argparse.Namespace, work: Path) -> dict:
    root = work / f"kb-{size}"
    token, build_s = build_kb(root, size)
    rng = np.random.default_rng(args.seed)
    texts = [synth_summary(rng)[0] for _ in range(args.queries)]
    proc, url = start_server(root)
    try:
        load(url, token, texts[: min(20, len(texts))], 1)  # warm-up: first requests pay lazy imports
        rows = [load(url, token, texts, c) for c in args.clients]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    cold = cold_cli(root, texts[0], args.cli_runs)
    return {"size": size, "build_s": build_s, "load": rows, "cold_cli_s": cold}


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print a table (JSON in bench/out/service.json)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1000,10000")
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--queries", type=int, default=200, help="queries per concurrency level")
    p.add_argument("--cli-runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.clients = [int(c) for c in args.clients.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="remedy-bench-service-") as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            results.append(run_size(size, args, Path(tmp)))
            r = results[-1]
            print(f"\n{size:,} cases (built in {r['build_s']:.0f} s); cold CLI query {r['cold_cli_s']:.1f} s")
            print(f"{'clients':>8} {'queries':>8} {'p50 ms':>8} {'p95 ms':>8} {'q/s':>8}")
            for row in r["load"]:
                print(
                    f"{row['clients']:>8} {row['queries']:>8} {row['p50_ms']:>8.1f} {row['p95_ms']:>8.1f} "
                    f"{row['qps']:>8.1f}",
                    flush=True,
                )
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"results": results, "loadavg": os.getloadavg()}, indent=2))


if __name__ == "__main__":
    main()
