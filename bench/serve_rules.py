"""How long the rule and describe routes of `remedy serve` take on the dev bench KB (prints figures; asserts nothing).

Builds a KB from ``reports/kb/dev-cases.jsonl`` (the real verified dev-scenario cases), runs the
app in process (FastAPI's TestClient: handler time, no network) and times, as medians over
``--repeats`` calls after one warm-up: ``POST /v1/mine`` (the miner over every case, rules
stored), ``GET /v1/rules``, ``POST /v1/rules/{id}/accept`` and ``POST /v1/diagnose`` with a
``describe`` text. The mining figure is what decides whether mining needs a job: a request that
answers in about a second does not.

    nice .venv/bin/python bench/serve_rules.py [--repeats 5] [--fdr 0.1]

At the default ``--fdr 0.1`` the dev cases (one confirmed ``improved``) yield no rule, so there
is nothing to accept; ``--fdr 1.0`` keeps every rule with a win, which gives the accept timing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from remedy.kb import KnowledgeBase
from remedy.kb.server import create_app

DEV = Path(__file__).resolve().parents[1] / "reports" / "kb" / "dev-cases.jsonl"
OUT = Path(__file__).parent / "out" / "serve_rules.json"
TEXTS = [
    "The lander hovers above the pad until the time limit and never lands.",
    "Torque chatters between its bounds every step.",
    "The car rocks at the bottom of the valley and never reaches the flag.",
]


def timed(call: Callable[[], httpx.Response], repeats: int) -> tuple[float, httpx.Response]:
    """Median milliseconds of ``call`` over ``repeats`` runs after one warm-up; the last response."""
    r = call()
    r.raise_for_status()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        r = call()
        times.append((time.perf_counter() - t0) * 1000)
        r.raise_for_status()
    return statistics.median(times), r


def main(argv: list[str] | None = None) -> None:
    """Run the timings and print them (JSON in bench/out/serve_rules.json)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--fdr", type=float, default=0.1, help="the mining request's fdr (1.0: every rule with a win)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="remedy-bench-rules-") as tmp:
        kb_path = Path(tmp) / "kb"
        with KnowledgeBase.open(kb_path) as kb:
            n_cases = kb.import_file(DEV).added
        app = create_app(kb_path, run_jobs=False)
        with TestClient(app) as client:
            service = app.state.service
            auth = {"Authorization": f"Bearer {service.tokens.create('reviewer', 'bench')[1]}"}
            mine_ms, mined = timed(lambda: client.post("/v1/mine", json={"fdr": args.fdr}, headers=auth), args.repeats)
            rules = mined.json()["rules"]
            list_ms, _ = timed(lambda: client.get("/v1/rules", headers=auth), args.repeats)
            figures = {"cases": n_cases, "rules": len(rules), "mine_ms": mine_ms, "list_ms": list_ms}
            if rules:
                url = f"/v1/rules/{rules[0]['id']}/accept"
                figures["accept_ms"], _ = timed(lambda: client.post(url, headers=auth), args.repeats)
            describe = [
                timed(lambda t=t: client.post("/v1/diagnose", json={"describe": t}, headers=auth), args.repeats)[0]
                for t in TEXTS
            ]
            figures["describe_ms"] = statistics.median(describe)
    print(
        f"dev bench KB: {figures['cases']} cases, {figures['rules']} rules mined at fdr {args.fdr:g} "
        f"(medians of {args.repeats} calls)"
    )
    for key, label in [
        ("mine_ms", "POST /v1/mine"),
        ("list_ms", "GET /v1/rules"),
        ("accept_ms", "POST /v1/rules/{id}/accept"),
        ("describe_ms", "POST /v1/diagnose (describe)"),
    ]:
        if key in figures:
            print(f"{label:<32} {figures[key]:>8.0f} ms")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({**figures, "fdr": args.fdr, "repeats": args.repeats, "loadavg": os.getloadavg()}))


if __name__ == "__main__":
    main()
