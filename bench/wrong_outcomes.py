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
top-1 / top-3 root-cause accuracy against the ground truth is reported, averaged over seeds.
Diagnosis accuracy only: fix rates (a fix loop per scenario per condition) were not measured.

    .venv/bin/python bench/wrong_outcomes.py --base-kb bench/out/wrong_base_kb [--seeds 5] [--json FILE]
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


def patient_signatures(cache: Path, n_episodes: int = 20) -> list[dict]:
    """Per scenario: name, ground truth, subject, signature and the diagnosis inputs (rolled out once).

    Each scenario's entry is saved to ``cache`` as soon as it is computed, so a rerun resumes.
    """
    from remedy.cases.evidence.rollouts import collect_evidence
    from remedy.cases.evidence.signature import compute_signature
    from remedy.cases.verify.scenarios import build, load_scenarios
    from remedy.kb.diagnose import failure_episodes, reward_text

    done = {p["name"]: p for p in (pickle.loads(cache.read_bytes()) if cache.is_file() else [])}
    for s in load_scenarios():
        if s.name in done:
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


def accuracy(kb, patients: list[dict], weighted: bool) -> tuple[float, float]:
    """Mean top-1 and top-3 root-cause accuracy of the offline diagnoser over the scenarios."""
    from remedy.kb.bench import score_causes
    from remedy.kb.diagnose import diagnose_signature
    from remedy.retrieval.offline import OfflineDiagnoser

    knobs = {} if weighted else {"imported_weight": 1.0, "contradiction_weight": 0.0}
    diagnoser = OfflineDiagnoser(**knobs)
    top1 = top3 = 0
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
    return top1 / len(patients), top3 / len(patients)


def main() -> None:
    """Run every condition and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-kb", type=Path, required=True, help="a KB of real (verified/bench) cases")
    parser.add_argument("--seeds", type=int, default=5, help="injection seeds per fraction")
    parser.add_argument("--episodes", type=int, default=20, help="evaluation episodes per patient signature")
    parser.add_argument("--json", type=Path, default=None)
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
    with KnowledgeBase.open(args.base_kb, create=False) as src:
        base = list(src.cases())
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
                        t1, t3 = accuracy(kb, patients, weighted)
                        rows.append(
                            {
                                "fraction": frac,
                                "wrong_source": label,
                                "seed": seed,
                                "n_wrong": len(wrong),
                                "weighted": weighted,
                                "top1": t1,
                                "top3": t3,
                            }
                        )
                        print(json.dumps(rows[-1]), flush=True)
                    kb.delete([c.case_id for c in wrong])
    table = _table(rows)
    print("\nfraction  wrong labelled  weighting  top-1  top-3   (mean over seeds)")
    for r in table:
        print(
            f"{r['fraction']:>8.0%}  {r['wrong_source']:>14}  {'on' if r['weighted'] else 'off':>9}  "
            f"{r['top1']:.3f}  {r['top3']:.3f}"
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
            }
        )
    return out


if __name__ == "__main__":
    main()
