"""Verification cost with and without shared control arms (issue 9, part 1), side by side in one run.

For each scenario, the same cold fix loop (same diagnosis, candidates, seeds and budgets) runs
twice: every candidate training its own controls, then controls shared through a fresh cache.
Training is deterministic given the seed, so both passes reach the same statuses; what differs
is the env steps and wall time spent. Prints one row per scenario and the totals, then where
each verification's budget came from (parts 3: ``user``/``kb``/``scenario``/``prior``) and the
rollouts of the checkpoint each loop reused instead of recomputing (part 4: evidence episodes
and the budget patches' checkpoint controls).

``--kb DIR`` lets retrieval read a KB (read-only; attempts are stored nowhere) in BOTH passes,
so budgets can be learned from its confirmed fixes; the default is cold (priors only, so no
budget can come from the KB).

    .venv/bin/python bench/cost.py --scenarios 'cartpole_lr_too_low,acrobot_undertrained' --candidates 2 --seeds 3
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from remedy.cases.verify.scenarios import build, load_scenarios
from remedy.kb.bench import BenchSettings
from remedy.kb.fixloop import fix, one_torch_thread


def _pass(s, run, settings: BenchSettings, cache: str | None, kb=None) -> dict:
    t0 = time.perf_counter()
    res = fix(
        kb,
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
        "budget_sources": [a.budget_source for a in res.attempts],
        "rollouts": res.rollouts.as_dict(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", required=True, help="comma-separated names or globs")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--candidates", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("bench/out/cost.json"))
    ap.add_argument("--kb", type=Path, default=None, help="a KB directory retrieval reads (default: cold)")
    args = ap.parse_args()
    one_torch_thread()
    globs = args.scenarios.split(",")
    chosen = [s for s in load_scenarios() if any(fnmatch.fnmatch(s.name, g) for g in globs)]
    settings = BenchSettings(rounds=args.rounds, candidates=args.candidates, seeds=args.seeds, baselines=False)
    rows = []
    with contextlib.ExitStack() as stack:
        kb = None
        if args.kb is not None:
            from remedy.kb.facade import KnowledgeBase

            kb = stack.enter_context(KnowledgeBase.open(args.kb))
        for s in chosen:
            run = build(s)
            own = _pass(s, run, settings, None, kb)
            with tempfile.TemporaryDirectory(prefix="remedy-controls-") as cache:
                shared = _pass(s, run, settings, cache, kb)
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
    _print_budgets_and_rollouts(rows)


def _print_budgets_and_rollouts(rows: list[dict]) -> None:
    """Parts 3 and 4 per scenario (shared pass): budget sources used, rollouts of the checkpoint reused."""
    print("\n| scenario | budget sources (attempts) | episodes computed | episodes reused | env steps reused |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        sh = r["shared"]
        counts: dict[str, int] = {}
        for src in sh["budget_sources"]:
            counts[str(src)] = counts.get(str(src), 0) + 1
        ro = sh["rollouts"]
        sources = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "-"
        print(
            f"| {r['scenario']} | {sources} | {ro['computed_episodes']:,} | {ro['reused_episodes']:,} "
            f"| {ro['reused_env_steps']:,} |"
        )


if __name__ == "__main__":
    main()
