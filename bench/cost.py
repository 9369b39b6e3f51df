"""Verification cost per confirmed fix: own controls, shared controls, shared controls + racing (issue 9).

For each scenario, the same cold fix loop (same diagnosis, candidates, seeds and budgets) runs once
per column: ``own`` (every candidate trains its own controls, no racing: the "before"); ``shared``
(controls shared through a fresh cache per scenario: part 1); ``shared+racing`` (shared controls,
and a race whose stage 1 on ``--race-fraction`` of the budget and ``--race-seeds`` seeds drops the
candidates that show no gain or cannot win: part 2, :mod:`remedy.cases.verify.racing`). Training is deterministic
given the seed, so ``own`` and ``shared`` reach the same statuses; racing screens fewer candidates
at the full budget and may differ. Part 3 (budgets learned from the KB) shows as the budget sources
of the racing column, part 4 (rollouts once) as the checkpoint rollouts each loop reused.

Resumable: one JSON line per (scenario, column) is appended to ``--out`` as it finishes, and
lines already there (same settings) are skipped, so a long run can stop and go on in chunks
(``--shard I/N`` takes every N-th scenario from the I-th, ``--columns`` one column at a time).
Patients the oracle records found not failing at their budget are skipped (no fault to fix).
``--report-only`` renders the tables from the file. ``shared+racing-afresh`` races without letting
the survivors go on from their stage-1 runs (racing rule 2: every survivor trains its full budget from
the checkpoint); ``shared+racing`` lets them go on (rule 3). ``shared+racing+confirm`` is
``shared+racing`` whose confirmations (run only for a candidate that cleared its screen) train
``--confirm-seeds`` seeds per arm (default ``CONFIRM_SEEDS``, 8) instead of ``--seeds``; the other
columns confirm on ``--seeds``, as the fix loop did when they were run. ``own+confirm`` is ``own``
with those confirmations: the "before" under the same confirmation rule, to tell what the four parts
save from what more confirmation seeds add. Training is deterministic given the seed, so ``own`` and
``own+confirm`` differ only on the patients where a screen cleared; elsewhere ``own+confirm``'s line is
``own``'s (marked ``same_as: own``) and nothing is trained again. ``shared+racing+sequential`` is
``shared+racing+confirm`` whose confirmations decide sequentially (``confirm_design="sequential"``: a look
at 4 seeds per arm stops a decisive confirmation there, else all 8 are trained), so the two columns show
the env steps the sequential design saves per confirmed fix on real patients.

The lines in ``bench/data/cost-dev.jsonl`` were measured when every seed of a verification was evaluated on
one shared block of episodes; render them with ``--evaluation one_block --report-only``. A new run (every
seed its own block) writes lines marked ``evaluation: blocks``, so the two are never mixed or skipped as done.

``--kb DIR`` lets retrieval read a KB (read-only; attempts are stored nowhere) in every pass, so
budgets can be learned from its confirmed fixes; the default is cold (priors only).

    .venv/bin/python bench/cost.py --split dev --columns own --out bench/data/cost-dev.jsonl
    .venv/bin/python bench/cost.py --scenarios 'cartpole_lr_too_low' --candidates 3 --seeds 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from remedy.cases.verify.racing import RACE_FRACTION, RACE_SEEDS, RULE_VERSION, RaceSettings
from remedy.cases.verify.scenarios import build
from remedy.cases.verify.solvability import ORACLE_FILE, not_failing
from remedy.cases.verify.verification import CONFIRM_SEEDS, EARLIER_SCREEN_CONFIDENCE, SCREEN_CONFIDENCE
from remedy.kb.bench import BenchSettings, select_scenarios
from remedy.kb.fixloop import fix, one_torch_thread

#: the columns: (name, shared controls, racing, survivors go on from stage 1, confirmations on
#: ``--confirm-seeds`` seeds instead of ``--seeds``)
COLUMNS = (
    ("own", False, False, False, False),
    ("shared", True, False, False, False),
    ("shared+racing-afresh", True, True, False, False),
    ("shared+racing", True, True, True, False),
    ("shared+racing+confirm", True, True, True, True),
    ("own+confirm", False, False, False, True),
    ("shared+racing+sequential", True, True, True, True),
)
#: columns whose confirmations decide sequentially (looks at 4 and 8 seeds, ``confirm_design="sequential"``)
SEQUENTIAL = frozenset({"shared+racing+sequential"})
NAMES = tuple(c[0] for c in COLUMNS)
#: the verification's evaluation design a line was measured under: every seed on its own block of episodes
#: (``EVAL_BLOCK_STRIDE``), or, before that, every seed on one shared block (the lines of bench/data/cost-dev.jsonl)
BLOCKS, ONE_BLOCK = "blocks", "one_block"
#: racing rule 3 differs from rule 2 only in that survivors go on from their stage-1 runs, so a rule-2
#: ``shared+racing`` line is a ``shared+racing-afresh`` line of rule 3 (:func:`_read` reads it as one)
AFRESH_RULE = 2


def _pass(
    s, run, settings: BenchSettings, cache: str | None, race: RaceSettings, kb=None, store=None, design: str = ""
) -> dict:
    t0 = time.perf_counter()
    config = replace(settings.verify_config(s), control_cache=cache)
    res = fix(
        kb,
        run,
        store=store,
        config=replace(config, confirm_design=design) if design else config,
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
        "fixed": res.improved,  # confirmed improved (this file's meaning since before the strict "fixed")
        "works": res.fixed,
        "env_steps_to_fix": res.env_steps_to_fix,
        "stopped_early": res.stopped_early,
        "budget_sources": [a.budget_source for a in res.attempts],
        "rollouts": res.rollouts.as_dict(),
    }


def _column(s, name: str, settings: BenchSettings, race: RaceSettings, kb=None, store=None) -> dict:
    """One column's fix loop on one scenario; a shared column starts from an empty control cache."""
    _, shared, racing, resume, confirm = next(c for c in COLUMNS if c[0] == name)
    how = replace(race, resume=resume) if racing else RaceSettings(enabled=False)
    if not confirm:  # the earlier columns confirmed on as many seeds as they screened
        settings = replace(settings, confirm_seeds=settings.seeds)
    run = build(s)
    if not shared:
        return _pass(s, run, settings, None, how, kb, store)
    design = "sequential" if name in SEQUENTIAL else ""
    with tempfile.TemporaryDirectory(prefix="remedy-controls-") as cache:
        return _pass(s, run, settings, cache, how, kb, store, design)


def _settings_key(args: argparse.Namespace, column: str) -> dict:
    """What makes two lines of a column comparable: a line written under other settings is neither skipped
    nor reported. Only racing columns depend on the race settings and the racing rule's version."""
    key: dict = {
        "rounds": args.rounds,
        "candidates": args.candidates,
        "seeds": args.seeds,
        "kb": None if args.kb is None else str(args.kb),
    }
    if dict((c[0], c[2]) for c in COLUMNS)[column]:
        key.update(race_fraction=round(args.race_fraction, 4), race_seeds=args.race_seeds, race_rule=RULE_VERSION)
    if dict((c[0], c[4]) for c in COLUMNS)[column]:
        key.update(confirm_seeds=args.confirm_seeds)
    if args.evaluation != ONE_BLOCK:  # lines written before every seed had its own block carry no such key
        key.update(evaluation=args.evaluation)
    if (
        args.screen_confidence != EARLIER_SCREEN_CONFIDENCE
    ):  # lines written before the screen had its own level screened at 0.95
        key.update(screen_confidence=args.screen_confidence)
    return key


def _read(path: Path, args: argparse.Namespace) -> dict[tuple[str, str], dict]:
    """The lines of ``path`` written under the current settings, by (scenario, column); the last line wins."""
    done: dict[tuple[str, str], dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                row = _as_afresh(json.loads(line))
                if row.get("column") in NAMES and row.get("settings") == _settings_key(args, row["column"]):
                    done[(row["scenario"], row["column"])] = row
    return done


def _same_as_own(
    done: dict[tuple[str, str], dict], scenario: str, column: str, args: argparse.Namespace
) -> dict | None:
    """``own+confirm``'s line from ``own``'s when no screen of ``own`` cleared: the two differ only in the
    confirmations' seed count and training is deterministic given the seed, so without a confirmation they are
    the same computation (marked ``same_as: own``). None when it must run."""
    own = done.get((scenario, "own"))
    if column != "own+confirm" or own is None or "confirm" in own["stages"]:
        return None
    return {**own, "column": column, "settings": _settings_key(args, column), "same_as": "own"}


def _as_afresh(row: dict) -> dict:
    """A rule-2 ``shared+racing`` line as the ``shared+racing-afresh`` line of the current rule it equals."""
    settings = row.get("settings") or {}
    if row.get("column") != "shared+racing" or settings.get("race_rule") != AFRESH_RULE:
        return row
    return {**row, "column": "shared+racing-afresh", "settings": {**settings, "race_rule": RULE_VERSION}}


def _table(rows: dict[tuple[str, str], dict], scenarios: list[str], columns: list[str]) -> None:
    print("\n| scenario | column | env steps | wall s | confirmed fix | stopped early | statuses |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in scenarios:
        for col in columns:
            c = rows.get((name, col))
            if c is None:
                continue
            steps = ", ".join(f"{st}:{s}" for st, s in zip(c["stages"], c["statuses"]))
            fixed = "yes" if c["fixed"] else "no"
            print(f"| {name} | {col} | {c['env_steps']:,} | {c['wall_s']} | {fixed} | {c['stopped_early']} | {steps} |")


def _totals(rows: dict[tuple[str, str], dict], scenarios: list[str], columns: list[str]) -> None:
    """Per column, over the scenarios every listed column has finished (so the columns compare like for like)."""
    common = [n for n in scenarios if all((n, c) in rows for c in columns)]
    print(f"\nTotals over the {len(common)} scenario(s) every column has finished:")
    print("\n| column | env steps | ratio to first | wall s | confirmed fixes | env steps per confirmed fix |")
    print("| --- | --- | --- | --- | --- | --- |")
    first = sum(rows[(n, columns[0])]["env_steps"] for n in common) if columns else 0
    for col in columns:
        steps = sum(rows[(n, col)]["env_steps"] for n in common)
        wall = sum(rows[(n, col)]["wall_s"] for n in common)
        fixes = sum(bool(rows[(n, col)]["fixed"]) for n in common)
        per_fix = f"{steps / fixes:,.0f}" if fixes else "- (no fix)"
        ratio = f"{steps / first:.2f}" if first else "-"
        print(f"| {col} | {steps:,} | {ratio} | {wall:.0f} | {fixes} of {len(common)} | {per_fix} |")


def _budgets_and_rollouts(rows: dict[tuple[str, str], dict], scenarios: list[str], column: str) -> None:
    """Parts 3 and 4 per scenario: budget sources used, rollouts of the checkpoint reused."""
    print(
        f"\n| scenario ({column}) | budget sources (attempts) | episodes computed | episodes reused | env steps reused |"
    )
    print("| --- | --- | --- | --- | --- |")
    for name in scenarios:
        c = rows.get((name, column))
        if c is None:
            continue
        counts: dict[str, int] = {}
        for src in c["budget_sources"]:
            counts[str(src)] = counts.get(str(src), 0) + 1
        ro = c["rollouts"]
        sources = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "-"
        print(
            f"| {name} | {sources} | {ro['computed_episodes']:,} | {ro['reused_episodes']:,} "
            f"| {ro['reused_env_steps']:,} |"
        )


def _chosen(globs: list[str | None], split: str | None, shard: tuple[int, int]) -> list:
    """The scenarios matching ``globs`` (None: all) in ``split``, minus patients the oracle found not failing,
    then every N-th from the I-th (``shard``)."""
    chosen: dict[str, object] = {}
    for g in globs:
        for s in select_scenarios(g, split=split or "all"):
            chosen.setdefault(s.name, s)
    skip = not_failing(list(chosen.values()), ORACLE_FILE)
    kept = [s for name, s in chosen.items() if name not in skip]
    i, n = shard
    return kept[i::n]


def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard takes I/N, e.g. 0/2 (got {text!r})") from None
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"--shard I/N needs 0 <= I < N (got {text!r})")
    return i, n


def _columns(text: str) -> list[str]:
    cols = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in cols if c not in NAMES]
    if bad or not cols:
        raise argparse.ArgumentTypeError(f"unknown column(s) {bad or text!r}; choose from {', '.join(NAMES)}")
    return cols


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--scenarios", help="comma-separated names or globs")
    which.add_argument("--split", choices=("dev", "holdout"), help="every failing scenario of a split")
    ap.add_argument("--columns", type=_columns, default=list(NAMES), help=f"comma-separated, of {', '.join(NAMES)}")
    ap.add_argument("--shard", type=_shard, default=(0, 1), help="I/N: every N-th scenario from the I-th")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--candidates", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument(
        "--confirm-seeds", type=int, default=CONFIRM_SEEDS, help="confirmation seeds of the +confirm columns"
    )
    ap.add_argument(
        "--screen-confidence",
        type=float,
        default=SCREEN_CONFIDENCE,
        help="two-sided level at which a screen passes (0.95: the lines measured before it had its own level)",
    )
    ap.add_argument("--race-fraction", type=float, default=RACE_FRACTION)
    ap.add_argument("--race-seeds", type=int, default=RACE_SEEDS)
    ap.add_argument("--out", type=Path, default=Path("bench/out/cost.jsonl"), help="JSON lines, appended (resume)")
    ap.add_argument("--kb", type=Path, default=None, help="a KB directory retrieval reads (default: cold)")
    ap.add_argument("--report-only", action="store_true", help="render the tables from --out; run nothing")
    ap.add_argument(
        "--store-kb",
        type=Path,
        default=None,
        help="store the attempts of --store-column as cases in this KB (retrieval stays as --kb says: cold by "
        "default), e.g. to mine or optimize on what the shipped loop verified",
    )
    ap.add_argument(
        "--store-export", type=Path, default=None, help="JSONL export of --store-kb, rewritten after each stored pass"
    )
    ap.add_argument(
        "--store-column", default="shared+racing+confirm", help="the column whose attempts --store-kb keeps"
    )
    ap.add_argument(
        "--evaluation",
        choices=(BLOCKS, ONE_BLOCK),
        default=BLOCKS,
        help=f"which lines to read and write: '{BLOCKS}' (every seed its own block of evaluation episodes, the "
        f"current verification) or '{ONE_BLOCK}' (lines measured before that; report them with --report-only)",
    )
    args = ap.parse_args()
    race = RaceSettings(fraction=args.race_fraction, seeds=args.race_seeds)
    race.check()
    globs = args.scenarios.split(",") if args.scenarios else [None]
    chosen = _chosen(globs, args.split, args.shard)
    done = _read(args.out, args)
    if not args.report_only:
        one_torch_thread()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as stack:
            kb = None
            if args.kb is not None:
                from remedy.kb.facade import KnowledgeBase

                kb = stack.enter_context(KnowledgeBase.open(args.kb))
            store = None
            if args.store_kb is not None:  # attempts of --store-column land here; retrieval never reads it
                from run_split import export_kb, open_kb  # refilled from --store-export when empty (fresh machine)

                store = stack.enter_context(open_kb(args.store_kb, args.store_export))
            for s in chosen:
                for col in args.columns:
                    if (s.name, col) in done:
                        continue
                    row = _same_as_own(done, s.name, col, args)
                    row = row or {
                        "scenario": s.name,
                        "column": col,
                        "settings": _settings_key(args, col),
                        **_column(s, col, args_settings(args), race, kb, store if col == args.store_column else None),
                    }
                    # one whole line per finished pass: a kill loses only the pass that was running
                    with args.out.open("a") as fh:
                        fh.write(json.dumps(row) + "\n")
                    done[(s.name, col)] = row
                    if store is not None and args.store_export is not None and col == args.store_column:
                        export_kb(store, args.store_export)
                    print(f"{s.name} {col}: {row['env_steps']:,} env steps, fixed={row['fixed']}", flush=True)
    names = [s.name for s in chosen]
    _table(done, names, args.columns)
    _totals(done, names, args.columns)
    for col in ("shared+racing", "shared+racing+confirm"):
        if col in args.columns:
            _budgets_and_rollouts(done, names, col)
    if not done:
        sys.exit(f"no finished lines in {args.out} under these settings; run without --report-only first")


def args_settings(args: argparse.Namespace) -> BenchSettings:
    """The bench settings of the fix loops (no baselines: this bench compares verification costs only)."""
    return BenchSettings(
        rounds=args.rounds,
        candidates=args.candidates,
        seeds=args.seeds,
        confirm_seeds=args.confirm_seeds,
        screen_confidence=args.screen_confidence,
        baselines=False,
    )


if __name__ == "__main__":
    main()
