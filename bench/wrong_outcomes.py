"""What wrong-outcome cases in the KB do to diagnosis, with and without trust weighting.

Threat model: another team's export holds cases about the same failures as ours, but with wrong
outcomes -- a patch marked ``improved`` (positive effect, CI above zero) that is not, filed under
a wrong root cause. Agents copy retrieved experience, so such cases spread.

Procedure. The 13 fault scenarios' patients are built (cached) and each one's signature is
computed once (``--episodes``, default 20, seed 0; cached in ``--signatures``). The base KB holds real cases (``--base-kb``: for example
the KB `remedy bench run` filled, every case verified here). For each wrong fraction p and each
injection seed, round(p x N) wrong cases are added: each copies a random base case's subject and
signature (so it sits next to that scenario's patient in retrieval), swaps its diagnosis for a
root cause outside that scenario's ground truth and its patch for one of another family, marks
it ``improved``, dates it before the base cases and carries no scenario name (so the bench's
own-scenario exclusion does not hide it). Wrong cases are labelled ``imported`` (their real
provenance) or, in a harder variant, ``verified`` (so only corroboration can discount them).
Every scenario is then diagnosed by the offline diagnoser with its own cases excluded, once with
the weighting off (``imported_weight=1, contradiction_weight=0``) and once on (defaults), and
top-1 / top-3 root-cause accuracy against the ground truth is reported, averaged over seeds, with
"family tried": how often one of the first ``--candidates`` (default 2) patches the loop would
verify belongs to a family the scenario expects (a loop of that width can only fix the patient
then, so this bounds the fix rate at no training cost).

``--fix GLOB`` also measures real fix rates: the fix loop (``--fix-rounds`` x ``--candidates``
candidates, ``--fix-seeds`` seeds, screen then confirmation, as ``bench run``) on each matching
scenario that the oracle check found solvable, in three conditions: the base KB (weighting on),
and the base KB plus 20% wrong cases labelled ``imported`` (injection seed 0) with the weighting
off and on. One JSON line per (scenario, condition) goes to ``--fix-out`` as it ends; a rerun
skips lines already there.

    .venv/bin/python bench/wrong_outcomes.py --base-kb bench/out/wrong_base_kb [--seeds 5] [--json FILE]
    .venv/bin/python bench/wrong_outcomes.py --base-kb KB --seeds 0 --fix '*' --fix-out bench/data/wrong_fix.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

FRACTIONS = (0.0, 0.1, 0.2)


def patient_signatures(cache: Path, n_episodes: int = 20, names: set[str] | None = None) -> list[dict]:
    """Per scenario (``names`` only, when given): name, ground truth, subject, signature and the diagnosis
    inputs (rolled out once).

    Each scenario's entry is saved to ``cache`` as soon as it is computed, so a rerun resumes.
    """
    from remedy.cases.evidence.rollouts import collect_evidence
    from remedy.cases.evidence.signature import compute_signature
    from remedy.cases.verify.scenarios import build, load_scenarios
    from remedy.kb.diagnose import failure_episodes, reward_text

    done = {p["name"]: p for p in (pickle.loads(cache.read_bytes()) if cache.is_file() else [])}
    for s in load_scenarios():
        if s.name in done or (names is not None and s.name not in names):
            continue
        run = build(s)
        subject = run.subject()
        bundle = collect_evidence(run, n_episodes=n_episodes, seed=0)
        done[s.name] = {
            "name": s.name,
            "truth": [c.value for c in s.ground_truth],
            "subject": subject,
            "signature": compute_signature(bundle, subject),
            "episodes": failure_episodes(bundle),
            "reward_code": reward_text(run),
            "notes": tuple(bundle.notes),
            "constraints": tuple(c.expr for c in run.config.constraints),
        }
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_bytes(pickle.dumps(list(done.values())))
        print(f"signature of {s.name}: {', '.join(done[s.name]['signature'].symptoms) or '-'}", flush=True)
    return list(done.values())


def wrong_cases(base: list, truths: dict[str, set[str]], n: int, rng: random.Random, source: str) -> list:
    """``n`` cases with wrong outcomes, each copied from a random base case (see the module doc)."""
    from remedy.cases.model import Cause, Diagnosis, Effect, Provenance, RootCause, Source, Status, Verification
    from remedy.retrieval.diagnosis import patch_family

    earliest = min(c.provenance.created_at for c in base)
    causes = [c for c in RootCause if c != RootCause.unknown]
    out = []
    for i in range(n):
        src = rng.choice(base)
        truth = truths.get(src.scenario or "", set())
        wrong_cause = rng.choice([c for c in causes if c.value not in truth])
        family = patch_family(src.patch)
        others = [c.patch for c in base if patch_family(c.patch) != family] or [src.patch]
        eff = Effect(
            metric="return_iqm",
            treatment=150.0,
            control=50.0,
            diff=100.0,
            ci_low=40.0,
            ci_high=160.0,
            prob_improvement=0.95,
        )
        out.append(
            src.model_copy(
                update={
                    "case_id": f"wrong-{i}",
                    "source": Source(source),  # model_copy does not validate
                    "scenario": None,
                    "parent_id": None,
                    "diagnosis": Diagnosis(
                        causes=[Cause(cause=wrong_cause, confidence=0.9, rationale="their diagnosis")]
                    ),
                    "patch": rng.choice(others),
                    "verification": Verification(status=Status.improved, effect=eff, seeds=3, budget_steps=10_000),
                    "provenance": Provenance(created_at=earliest - timedelta(days=30 + i)),
                }
            )
        )
    return out


def accuracy(
    kb, patients: list[dict], weighted: bool, families: dict[str, set[str]], width: int = 2
) -> tuple[float, float, float]:
    """Mean top-1 and top-3 root-cause accuracy over the scenarios, and the share whose first
    ``width`` candidate patches include an expected family (``families``: scenario → families)."""
    from remedy.kb.bench import score_causes
    from remedy.kb.diagnose import diagnose_signature
    from remedy.retrieval.offline import OfflineDiagnoser

    knobs = {} if weighted else {"imported_weight": 1.0, "contradiction_weight": 0.0}
    diagnoser = OfflineDiagnoser(**knobs)
    top1 = top3 = tried = 0
    for p in patients:
        report = diagnose_signature(
            kb,
            p["subject"],
            p["signature"],
            diagnoser=diagnoser,
            exclude_scenario=p["name"],
            episodes=p["episodes"],
            reward_code=p["reward_code"],
            notes=p["notes"],
            constraints=p["constraints"],
        )
        a, b = score_causes(report.diagnosis.root_causes, p["truth"])
        top1, top3 = top1 + a, top3 + b
        tried += bool({c.family.value for c in report.candidates[:width]} & families[p["name"]])
    return top1 / len(patients), top3 / len(patients), tried / len(patients)


def fix_rates(kb_base: list, truths, scenarios, args) -> list[dict]:
    """Real fix loops on the solvable ``scenarios`` under base / +20% imported wrong (off, on); resumable."""
    from dataclasses import replace

    from remedy.cases.verify.solvability import ORACLE_FILE, latest_results
    from remedy.kb.bench import BenchSettings, run_bench
    from remedy.kb.facade import KnowledgeBase
    from remedy.retrieval.offline import OfflineDiagnoser

    records = latest_results(scenarios, ORACLE_FILE)
    chosen = [s for s in scenarios if s.name in records and records[s.name].verdict == "solvable"]
    out: Path = args.fix_out
    done = [json.loads(line) for line in out.read_text().splitlines()] if out.is_file() else []
    seen = {(r["scenario"], r["condition"]) for r in done}
    wrong = wrong_cases(kb_base, truths, round(0.2 * len(kb_base)), random.Random(0), "imported")
    conditions = (("base", [], True), ("wrong20-off", wrong, False), ("wrong20-on", wrong, True))
    settings = BenchSettings(rounds=args.fix_rounds, candidates=args.candidates, seeds=args.fix_seeds, baselines=False)
    print(f"fix loops: {len(chosen)} solvable scenarios x {len(conditions)} conditions", flush=True)
    for name, extra, weighted in conditions:
        knobs = {} if weighted else {"imported_weight": 1.0, "contradiction_weight": 0.0}
        todo = [s for s in chosen if (s.name, name) not in seen]
        if not todo:
            continue
        with tempfile.TemporaryDirectory() as tmp, KnowledgeBase.open(Path(tmp) / "kb") as kb:
            kb.add_many([*kb_base, *extra])
            for s in todo:
                cfg = replace(settings, diagnoser=OfflineDiagnoser(**knobs))
                res = run_bench(kb, [s], cfg, store=None, label=name).scenarios[0]
                row = {
                    "scenario": s.name,
                    "condition": name,
                    "n_wrong": len(extra),
                    "weighted": weighted,
                    "first_causes": res.first_causes,
                    "top1": res.top1,
                    "fixed": res.fixed,
                    "works": res.works,
                    "winning_patch": res.winning_patch,
                    "total_env_steps": res.total_env_steps,
                    "wall_s": round(res.total_wall_time_s, 1),
                }
                out.parent.mkdir(parents=True, exist_ok=True)
                with out.open("a") as fh:
                    fh.write(json.dumps(row, default=str) + "\n")
                done.append(row)
                print(json.dumps(row, default=str), flush=True)
    return done


def main() -> None:
    """Run every condition and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-kb", type=Path, required=True, help="a KB of real (verified/bench) cases")
    parser.add_argument("--seeds", type=int, default=5, help="injection seeds per fraction")
    parser.add_argument("--episodes", type=int, default=20, help="evaluation episodes per patient signature")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--candidates", type=int, default=2, help="candidates the loop verifies per round")
    parser.add_argument("--fix", default=None, metavar="GLOB", help="also run fix loops on these solvable scenarios")
    parser.add_argument("--fix-rounds", type=int, default=1)
    parser.add_argument("--fix-seeds", type=int, default=3)
    parser.add_argument("--fix-out", type=Path, default=Path("bench/data/wrong_outcomes_fix.jsonl"))
    parser.add_argument(
        "--signatures",
        type=Path,
        default=Path("bench/out/wrong_outcomes_signatures.pkl"),
        help="cache of the patients' signatures (rolled out once, reused by later runs)",
    )
    args = parser.parse_args()
    from remedy.cases.verify.scenarios import load_scenarios
    from remedy.kb.facade import KnowledgeBase

    start = time.time()
    truths = {s.name: {c.value for c in s.ground_truth} for s in load_scenarios()}
    families = {s.name: {f.value for f in s.expected_families} for s in load_scenarios()}
    with KnowledgeBase.open(args.base_kb, create=False) as src:
        base = list(src.cases())
    if args.fix is not None:
        from remedy.kb.bench import select_scenarios

        fixes = fix_rates(base, truths, select_scenarios(args.fix), args)
        for cond in ("base", "wrong20-off", "wrong20-on"):
            sel = [r for r in fixes if r["condition"] == cond]
            if sel:
                n_fixed = sum(r["fixed"] for r in sel)
                steps = sum(r["total_env_steps"] for r in sel)
                print(f"{cond:12s} fixed {n_fixed} of {len(sel)}; env steps {steps:,}")
        if args.seeds == 0:
            return
    patients = patient_signatures(args.signatures, args.episodes)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, KnowledgeBase.open(Path(tmp) / "kb") as kb:
        kb.add_many(base)
        print(f"base KB: {len(base)} cases; {len(patients)} scenarios", flush=True)
        for frac in FRACTIONS:
            for label in ("imported", "verified") if frac else ("-",):
                for seed in range(args.seeds if frac else 1):
                    wrong = (
                        wrong_cases(base, truths, round(frac * len(base)), random.Random(seed), label) if frac else []
                    )
                    kb.add_many(wrong)
                    for weighted in (False, True):
                        t1, t3, tried = accuracy(kb, patients, weighted, families, args.candidates)
                        rows.append(
                            {
                                "fraction": frac,
                                "wrong_source": label,
                                "seed": seed,
                                "n_wrong": len(wrong),
                                "weighted": weighted,
                                "top1": t1,
                                "top3": t3,
                                "family_tried": tried,
                            }
                        )
                        print(json.dumps(rows[-1]), flush=True)
                    kb.delete([c.case_id for c in wrong])
    table = _table(rows)
    print(f"\nfraction  wrong labelled  weighting  top-1  top-3  family in first {args.candidates}  (mean over seeds)")
    for r in table:
        print(
            f"{r['fraction']:>8.0%}  {r['wrong_source']:>14}  {'on' if r['weighted'] else 'off':>9}  "
            f"{r['top1']:.3f}  {r['top3']:.3f}  {r['family_tried']:.3f}"
        )
    print(
        f"base {len(base)} cases, {len(patients)} scenarios, {args.seeds} seeds; wall {time.time() - start:.0f} s; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows, "table": table, "base_cases": len(base)}, indent=2))


def _table(rows: list[dict]) -> list[dict]:
    keys = sorted({(r["fraction"], r["wrong_source"], r["weighted"]) for r in rows})
    out = []
    for frac, label, weighted in keys:
        sel = [r for r in rows if (r["fraction"], r["wrong_source"], r["weighted"]) == (frac, label, weighted)]
        out.append(
            {
                "fraction": frac,
                "wrong_source": label,
                "weighted": weighted,
                "top1": statistics.fmean(r["top1"] for r in sel),
                "top3": statistics.fmean(r["top3"] for r in sel),
                "family_tried": statistics.fmean(r.get("family_tried", float("nan")) for r in sel),
            }
        )
    return out


if __name__ == "__main__":
    main()
