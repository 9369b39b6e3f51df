"""Verification cost with and without shared control arms (issue 9, part 1), side by side in one run.

For each scenario, the same cold fix loop (same diagnosis, candidates, seeds and budgets) runs
twice: every candidate training its own controls, then controls shared through a fresh cache.
Training is deterministic given the seed, so both passes reach the same statuses; what differs
is the env steps and wall time spent. Prints one row per scenario and the totals.

    .venv/bin/python bench/cost.py --scenarios 'cartpole_lr_too_low,acrobot_undertrained' --candidates 2 --seeds 3
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from remedy.cases.verify.scenarios import build, load_scenarios
from remedy.kb.bench import BenchSettings
from remedy.kb.fixloop import fix, one_torch_thread


def _pass(s, run, settings: BenchSettings, cache: str | None) -> dict:
    t0 = time.perf_counter()
    res = fix(
        None,
        run,
        store=None,
        config=replace(settings.verify_config(s), control_cache=cache),
        rounds=settings.rounds,
        candidates=settings.candidates,
        scenario=s,
        exclude_scenario=s.name,
        exclude_ids=s.examples_excluded,
        out_dir=tempfile.mkdtemp(prefix="remedy-cost-"),
    )
    return {
        "env_steps": res.total_env_steps,
        "wall_s": round(time.perf_counter() - t0, 1),
        "statuses": [a.status for a in res.attempts],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", required=True, help="comma-separated names or globs")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--candidates", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("bench/out/cost.json"))
    args = ap.parse_args()
    one_torch_thread()
    globs = args.scenarios.split(",")
    chosen = [s for s in load_scenarios() if any(fnmatch.fnmatch(s.name, g) for g in globs)]
    settings = BenchSettings(rounds=args.rounds, candidates=args.candidates, seeds=args.seeds, baselines=False)
    rows = []
    for s in chosen:
        run = build(s)
        own = _pass(s, run, settings, None)
        with tempfile.TemporaryDirectory(prefix="remedy-controls-") as cache:
            shared = _pass(s, run, settings, cache)
        rows.append({"scenario": s.name, "own": own, "shared": shared})
        print(json.dumps(rows[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2) + "\n")
    print("\n| scenario | env steps, own controls | env steps, shared | ratio | wall s own / shared | statuses equal |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        o, sh = r["own"], r["shared"]
        ratio = sh["env_steps"] / o["env_steps"] if o["env_steps"] else float("nan")
        same = o["statuses"] == sh["statuses"]
        print(
            f"| {r['scenario']} | {o['env_steps']:,} | {sh['env_steps']:,} | {ratio:.2f} | {o['wall_s']} / {sh['wall_s']} | {same} |"
        )
    tot_o = sum(r["own"]["env_steps"] for r in rows)
    tot_s = sum(r["shared"]["env_steps"] for r in rows)
    if tot_o:
        print(f"| total | {tot_o:,} | {tot_s:,} | {tot_s / tot_o:.2f} | | |")


if __name__ == "__main__":
    main()
