"""Verification cost: own controls, shared controls, shared controls + racing (issue 9, parts 1-2), in one run.

For each scenario, the same cold fix loop (same diagnosis, candidates, seeds and budgets) runs
three times: every candidate training its own controls; controls shared through a fresh cache;
and shared controls with racing (stage 1 on ``--race-fraction`` of the budget and
``--race-seeds`` seeds drops the candidates that show no gain or cannot win; :mod:`remedy.cases.verify.racing`).
Training is deterministic given the seed, so the first two passes reach the same statuses;
racing screens fewer candidates at the full budget and may differ. Prints one row per scenario
and column, then per column the totals: env steps, wall time, confirmed fixes, env steps per
confirmed fix; then, for the racing column, where each verification's budget came from (part 3:
``user``/``kb``/``scenario``/``prior``/``patch``) and the rollouts of the checkpoint each loop reused
instead of recomputing (part 4: evidence episodes and the budget patches' checkpoint controls).

``--kb DIR`` lets retrieval read a KB (read-only; attempts are stored nowhere) in every pass, so
budgets can be learned from its confirmed fixes; the default is cold (priors only, so no budget
can come from the KB).

    .venv/bin/python bench/cost.py --scenarios 'cartpole_lr_too_low,acrobot_undertrained' --candidates 3 --seeds 3
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

from remedy.cases.verify.racing import RACE_FRACTION, RACE_SEEDS, RaceSettings
from remedy.cases.verify.scenarios import build, load_scenarios
from remedy.kb.bench import BenchSettings
from remedy.kb.fixloop import fix, one_torch_thread

#: the columns: (name, shared controls, racing)
COLUMNS = (("own", False, False), ("shared", True, False), ("shared+racing", True, True))


def _pass(s, run, settings: BenchSettings, cache: str | None, race: RaceSettings, kb=None) -> dict:
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
        race=race,
    )
    return {
        "env_steps": res.total_env_steps,
        "wall_s": round(time.perf_counter() - t0, 1),
        "statuses": [a.status for a in res.attempts],
        "stages": [a.stage for a in res.attempts],
        "fixed": res.fixed,
        "stopped_early": res.stopped_early,
        "budget_sources": [a.budget_source for a in res.attempts],
        "rollouts": res.rollouts.as_dict(),
    }


def _scenario(s, settings: BenchSettings, race: RaceSettings, kb=None) -> dict:
    """The three passes on one scenario; each shared pass starts from an empty control cache."""
    run = build(s)
    row: dict = {"scenario": s.name}
    for name, shared, racing in COLUMNS:
        how = race if racing else RaceSettings(enabled=False)
        if not shared:
            row[name] = _pass(s, run, settings, None, how, kb)
            continue
        with tempfile.TemporaryDirectory(prefix="remedy-controls-") as cache:
            row[name] = _pass(s, run, settings, cache, how, kb)
    return row


def _table(rows: list[dict]) -> None:
    print("\n| scenario | column | env steps | wall s | confirmed fix | stopped early | statuses |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        for name, _, _ in COLUMNS:
            c = r[name]
            print(
                f"| {r['scenario']} | {name} | {c['env_steps']:,} | {c['wall_s']} | {'yes' if c['fixed'] else 'no'} "
                f"| {c['stopped_early']} | {', '.join(f'{st}:{s}' for st, s in zip(c['stages'], c['statuses']))} |"
            )
    print("\n| column | env steps | ratio to own | wall s | confirmed fixes | env steps per confirmed fix |")
    print("| --- | --- | --- | --- | --- | --- |")
    own = sum(r["own"]["env_steps"] for r in rows)
    for name, _, _ in COLUMNS:
        steps = sum(r[name]["env_steps"] for r in rows)
        wall = sum(r[name]["wall_s"] for r in rows)
        fixes = sum(bool(r[name]["fixed"]) for r in rows)
        per_fix = f"{steps / fixes:,.0f}" if fixes else "- (no fix)"
        ratio = f"{steps / own:.2f}" if own else "-"
        print(f"| {name} | {steps:,} | {ratio} | {wall:.0f} | {fixes} of {len(rows)} | {per_fix} |")


def _budgets_and_rollouts(rows: list[dict], column: str = "shared+racing") -> None:
    """Parts 3 and 4 per scenario: budget sources used, rollouts of the checkpoint reused."""
    print(
        f"\n| scenario ({column}) | budget sources (attempts) | episodes computed | episodes reused | env steps reused |"
    )
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        c = r[column]
        counts: dict[str, int] = {}
        for src in c["budget_sources"]:
            counts[str(src)] = counts.get(str(src), 0) + 1
        ro = c["rollouts"]
        sources = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "-"
        print(
            f"| {r['scenario']} | {sources} | {ro['computed_episodes']:,} | {ro['reused_episodes']:,} "
            f"| {ro['reused_env_steps']:,} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", required=True, help="comma-separated names or globs")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--candidates", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--race-fraction", type=float, default=RACE_FRACTION)
    ap.add_argument("--race-seeds", type=int, default=RACE_SEEDS)
    ap.add_argument("--out", type=Path, default=Path("bench/out/cost.json"))
    ap.add_argument("--kb", type=Path, default=None, help="a KB directory retrieval reads (default: cold)")
    args = ap.parse_args()
    one_torch_thread()
    race = RaceSettings(fraction=args.race_fraction, seeds=args.race_seeds)
    race.check()
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
            rows.append(_scenario(s, settings, race, kb))
            print(json.dumps(rows[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2) + "\n")
    _table(rows)
    _budgets_and_rollouts(rows)


if __name__ == "__main__":
    main()
