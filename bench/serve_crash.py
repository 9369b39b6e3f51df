"""Crash safety of `remedy serve`: SIGKILL it during a stream of imports, restart, count what was lost.

Prints figures; it is not a test. Each trial starts ``remedy serve`` on a free
loopback port, streams imports (batches of ``--batch`` new cases, one request
each) from one client, and kills the service with SIGKILL at a random moment
(seeded). Then it opens the KB the way a restarted service does (store first,
then the index reconciled) and checks:

- every batch the service acknowledged (HTTP 200) is in the store and the index;
- every batch without an answer is either whole or absent (an import is one transaction);
- the index holds exactly the stored cases after the reconcile.

    nice .venv/bin/python bench/serve_crash.py --trials 30
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from retrieval_speed import synth_cases
from service import start_server

from remedy.cases.io import case_to_json
from remedy.cases.store import CaseStore
from remedy.kb import KnowledgeBase
from remedy.kb.server.tokens import TokenStore

OUT = Path(__file__).parent / "out" / "crash.json"


def _stream(
    url: str, token: str, batches: list[list], acked: list[int], sent: list[int], stop: threading.Event
) -> None:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        for i, batch in enumerate(batches):
            if stop.is_set():
                return
            sent.append(i)
            try:
                r = http.post("/v1/cases/import", content="".join(case_to_json(c) + "\n" for c in batch).encode())
            except httpx.HTTPError:
                return  # the service died under this request: unacknowledged
            if r.status_code == 200:
                acked.append(i)


def trial(root: Path, token: str, n: int, args: argparse.Namespace, rng: np.random.Generator) -> dict:
    """One kill-and-check trial; returns its counts."""
    cases = synth_cases(args.batch * args.max_batches, seed=n, prefix=f"t{n}-")
    batches = [cases[i : i + args.batch] for i in range(0, len(cases), args.batch)]
    proc, url = start_server(root)
    acked: list[int] = []
    sent: list[int] = []
    stop = threading.Event()
    worker = threading.Thread(target=_stream, args=(url, token, batches, acked, sent, stop))
    worker.start()
    for _ in range(600):  # wait for the first acknowledgement (bounded), then kill at a random moment
        if acked or not worker.is_alive():
            break
        time.sleep(0.05)
    time.sleep(float(rng.uniform(0.0, args.max_delay)))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    stop.set()
    worker.join(timeout=120)
    return check(root, batches, acked, sent)


def check(root: Path, batches: list[list], acked: list[int], sent: list[int]) -> dict:
    """Open the KB as a restart does and count acknowledged losses and partial batches."""
    with KnowledgeBase.open(root) as kb:  # store, then the index reconciled with it
        stored, indexed = kb.store.ids(), kb.index.ids()
    lost = sum(1 for i in acked if not {c.case_id for c in batches[i]} <= (stored & indexed))
    unacked = [i for i in sent if i not in set(acked)]
    partial = sum(1 for i in unacked if 0 < len({c.case_id for c in batches[i]} & stored) < len(batches[i]))
    landed = sum(1 for i in unacked if {c.case_id for c in batches[i]} <= stored)
    return {
        "acked": len(acked),
        "unacked": len(unacked),
        "unacked_landed": landed,
        "lost_acked": lost,
        "partial": partial,
        "index_mismatch": int(stored != indexed),
    }


def run(trials: int, args: argparse.Namespace, workdir: Path) -> tuple[list[dict], dict]:
    """``trials`` kill-and-check trials on one KB under ``workdir``; returns each trial's counts and the totals."""
    rng = np.random.default_rng(args.seed)
    root = workdir / "kb"
    KnowledgeBase.open(root).close()
    _, token = TokenStore(CaseStore(root / "remedy.duckdb")).create("writer", "crash")
    rows = []
    for n in range(trials):
        rows.append(trial(root, token, n, args, rng))
        print(f"trial {n + 1}/{trials}: {rows[-1]}", flush=True)
    return rows, {k: sum(r[k] for r in rows) for k in rows[0]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (also the defaults a test starts from: ``parse_args([])``)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--batch", type=int, default=3, help="cases per import request")
    p.add_argument("--max-batches", type=int, default=400)
    p.add_argument("--max-delay", type=float, default=3.0, help="kill up to this many seconds after the first ack")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Run the trials and print totals (JSON in bench/out/crash.json)."""
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="remedy-bench-crash-") as tmp:
        rows, totals = run(args.trials, args, Path(tmp))
    print(
        f"\n{args.trials} trials: {totals['acked']} acknowledged imports, {totals['lost_acked']} lost; "
        f"{totals['unacked']} unacknowledged ({totals['unacked_landed']} landed whole, "
        f"{totals['partial']} partial); index out of step after restart in {totals['index_mismatch']} trials"
    )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"trials": rows, "totals": totals, "args": vars(args)}, indent=2))


if __name__ == "__main__":
    main()
