"""Service benchmark: query latency and throughput of `remedy serve` under concurrent clients.

Prints figures; it is not a test. For each KB size it builds a KB of synthetic
cases (``bench/retrieval_speed.py``'s templates, every summary embedded for real),
starts ``remedy serve`` on a free loopback port as its own process, and sends
``POST /v1/query`` (hybrid search, embedding included) from 1, 4 and 16
concurrent clients (threads, one httpx connection each), reporting p50/p95
latency and throughput. Then, with the service stopped, it times the same query
through the cold CLI (``remedy query TEXT --kb``) for contrast. Targets: p50 <= 20 ms at
1 client and >= 100 queries/s at 16 clients, 10k cases.

Arms, one after the other on the same KB, printed side by side: ``before`` is the
service as it shipped until the light query path (sentence-transformers encoder,
``REMEDY_EMBEDDER=torch``, one encoder call per request, every search asked of Lance: the bench's
launcher swaps the :class:`BatchingEmbedder` and the resident index out); ``numpy`` is `remedy serve`
with ``REMEDY_EMBEDDER=numpy`` (the numpy encoder, as shipped until the ONNX one); ``after`` is
`remedy serve` as it is (ONNX Runtime encoder, concurrent queries batched, searches answered from the
resident index). Beside each load row: the server's and the load generator's CPU per query (the
clients run on the same 2 cores, so their share is CPU the server does not get).

    nice .venv/bin/python bench/service.py --sizes 1000,10000 --queries 200 [--arms before,numpy,after]

``--keep DIR`` keeps the built KBs in DIR and reuses them on the next run (building 10k cases embeds
every summary: minutes on a loaded machine).
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
from retrieval_speed import synth_cases, synth_summary

from remedy.cases.store import CaseStore
from remedy.kb import KnowledgeBase
from remedy.kb.server.tokens import TokenStore

OUT = Path(__file__).parent / "out" / "service.json"
REMEDY = Path(sys.executable).parent / "remedy"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_kb(root: Path, size: int) -> tuple[str, float]:
    """A KB of ``size`` synthetic cases (reused when ``root`` holds it already) and a reader token;
    returns (token, seconds to build)."""
    start = time.perf_counter()
    with KnowledgeBase.open(root) as kb:
        if kb.count() != size:
            kb.add_many(synth_cases(size, seed=size, prefix="svc-"))
    _, token = TokenStore(CaseStore(root / "remedy.duckdb")).create("reader", "bench")
    return token, time.perf_counter() - start


# The "before" service: the same `remedy serve`, with each request encoding on its own.
_BEFORE = """
import sys
import remedy.retrieval.batching as batching
from remedy.kb.facade import KnowledgeBase
batching.BatchingEmbedder = lambda inner, **kw: inner
KnowledgeBase.hold_in_memory = lambda self: None  # every search asks Lance, as before the resident index
from remedy.kb.cli import main
sys.argv = ["remedy", *sys.argv[1:]]
main()
"""


#: arm -> REMEDY_EMBEDDER (None: unset, each command's default: numpy for the CLI, onnx for the service)
ARM_EMBEDDER: dict[str, str | None] = {"before": "torch", "numpy": "numpy", "after": None}


def _env(arm: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "REMEDY_EMBEDDER"}
    if ARM_EMBEDDER[arm] is not None:
        env["REMEDY_EMBEDDER"] = str(ARM_EMBEDDER[arm])
    return env


def _cpu_s(pid: int | None = None) -> float:
    """User + system CPU seconds of process ``pid`` (Linux /proc), or of this process."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(root: Path, arm: str = "after", extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    """`remedy serve` (arm ``after``) or the before-service on a free loopback port, with ``extra`` options,
    once /health answers (bounded wait)."""
    port = _port()
    url = f"http://127.0.0.1:{port}"
    serve = ["serve", "--kb", str(root), "--port", str(port), *extra]
    program = [sys.executable, "-c", _BEFORE] if arm == "before" else [str(REMEDY)]
    env = _env(arm)
    proc = subprocess.Popen([*program, *serve], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
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


def load(url: str, token: str, texts: list[str], clients: int, server_pid: int | None = None) -> dict[str, float]:
    """Split ``texts`` over ``clients`` threads; p50/p95 latency (ms), queries/s overall, and CPU ms per
    query of this load generator and (given its pid) of the server."""
    chunks = [texts[i::clients] for i in range(clients)]
    lat: list[float] = []
    threads = [threading.Thread(target=_client, args=(url, token, c, lat)) for c in chunks]
    cpu0 = (_cpu_s(), _cpu_s(server_pid) if server_pid else 0.0)
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    client_cpu, server_cpu = _cpu_s() - cpu0[0], (_cpu_s(server_pid) - cpu0[1]) if server_pid else float("nan")
    ms = np.array(lat) * 1000
    return {
        "clients": clients,
        "queries": len(lat),
        "p50_ms": float(np.percentile(ms, 50)),
        "p95_ms": float(np.percentile(ms, 95)),
        "qps": len(lat) / wall,
        "server_cpu_ms": 1000 * server_cpu / len(lat),
        "client_cpu_ms": 1000 * client_cpu / len(lat),
    }


def cold_cli(root: Path, text: str, runs: int, arm: str = "after") -> float:
    """Median wall seconds of `remedy query TEXT --kb ROOT` in a fresh process."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(
            [str(REMEDY), "query", text, "--kb", str(root), "--json"],
            check=True,
            capture_output=True,
            env=_env(arm),
        )
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_size(size: int, args: argparse.Namespace, work: Path) -> dict:
    root = work / f"kb-{size}"
    token, build_s = build_kb(root, size)
    rng = np.random.default_rng(args.seed)
    texts = [synth_summary(rng)[0] for _ in range(args.queries)]
    arms = {}
    for arm in args.arms:
        proc, url = start_server(root, arm)
        try:
            load(url, token, texts[: min(20, len(texts))], 1)  # warm-up: first requests pay lazy imports
            rows = [load(url, token, texts, c, proc.pid) for c in args.clients]
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        arms[arm] = {"load": rows, "cold_cli_s": cold_cli(root, texts[0], args.cli_runs, arm)}
    return {"size": size, "build_s": build_s, "arms": arms}


def _print(r: dict, arms: list[str]) -> None:
    cold = ", ".join(f"{a} {r['arms'][a]['cold_cli_s']:.2f} s" for a in arms)
    print(f"\n{r['size']:,} cases (built in {r['build_s']:.0f} s); cold CLI query: {cold}")
    head = "".join(f" | {a + ' p50 ms':>13} {a + ' p95 ms':>13} {a + ' q/s':>10} {'cpu ms/q s+c':>13}" for a in arms)
    print(f"{'clients':>8}{head}")
    for i, clients in enumerate(r["arms"][arms[0]]["load"]):
        cells = "".join(
            f" | {row['p50_ms']:>13.1f} {row['p95_ms']:>13.1f} {row['qps']:>10.1f} "
            f"{row['server_cpu_ms']:>7.1f}+{row['client_cpu_ms']:<5.1f}"
            for row in (r["arms"][a]["load"][i] for a in arms)
        )
        print(f"{clients['clients']:>8}{cells}", flush=True)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print a table (JSON in bench/out/service.json)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1000,10000")
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--queries", type=int, default=200, help="queries per concurrency level")
    p.add_argument("--cli-runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--arms",
        default="before,numpy,after",
        help="before (torch, unbatched), numpy (REMEDY_EMBEDDER=numpy) and/or after (shipped: ONNX Runtime)",
    )
    p.add_argument("--keep", type=Path, default=None, help="keep the built KBs here and reuse them")
    args = p.parse_args(argv)
    args.clients = [int(c) for c in args.clients.split(",")]
    args.arms = [a for a in args.arms.split(",") if a]
    if unknown := sorted(set(args.arms) - set(ARM_EMBEDDER)):
        p.error(f"unknown arm(s) {', '.join(unknown)}; choose from {', '.join(ARM_EMBEDDER)}")
    results = []
    with tempfile.TemporaryDirectory(prefix="remedy-bench-service-") as tmp:
        work = args.keep or Path(tmp)
        for size in (int(s) for s in args.sizes.split(",")):
            results.append(run_size(size, args, work))
            _print(results[-1], args.arms)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"results": results, "loadavg": os.getloadavg()}, indent=2))


if __name__ == "__main__":
    main()
