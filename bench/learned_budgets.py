"""Would budgets from experience fire on the bench patients now? (issue 9, part 3)

A budget is learned only from at least ``MIN_BUDGET_CASES`` confirmed fixes of the candidate's
family among the patient's neighbours at ``BUDGET_SIMILARITY_FLOOR`` similarity or more
(:mod:`remedy.retrieval.budgets`). Until the 80% screen the bench KBs held one confirmed fix in
all, so it never fired. This script loads the given exports into a temporary KB (each case once
by id), diagnoses every patient of ``--split`` warm with its own scenario's cases excluded (the
signatures rolled out once and cached, as ``bench/wrong_outcomes.py`` does; missing patients are
trained into the scenario cache), and prints, per patient, the first ``--candidates`` candidates
and where their budget came from: learned (steps, fraction of the patient's training, the cases)
or the default rule. Nothing is trained for verification; it answers "does part 3 fire" and "what
would it choose", not "what does it save".

    .venv/bin/python bench/learned_budgets.py --export reports/kb/dev-sc08-cases.jsonl \
        reports/kb/holdout-sc08-cases.jsonl reports/kb/dev-run-sc08-cases.jsonl --split dev
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from wrong_outcomes import patient_signatures


def _cases(exports: list[Path]) -> list:
    from remedy.cases.io import read_cases

    return list({c.case_id: c for export in exports for c in read_cases(export)[0]}.values())


def _row(kb, p: dict, width: int) -> dict:
    from remedy.kb.diagnose import diagnose_signature

    report = diagnose_signature(
        kb,
        p["subject"],
        p["signature"],
        exclude_scenario=p["name"],
        episodes=p["episodes"],
        reward_code=p["reward_code"],
        notes=p["notes"],
        constraints=p["constraints"],
    )
    cands = []
    for c in report.candidates[:width]:
        learned = None
        if c.budget is not None:
            learned = {"kind": "verify budget", "steps": c.budget.steps, "fraction": c.budget.fraction,
                       "cases": c.budget.cases}  # fmt: skip
        elif c.patch.budget_only and "learned from the KB" in c.rationale:
            steps = sum(int(getattr(part, "extra_steps", 0)) for part in c.patch.parts)
            learned = {"kind": "extra steps", "steps": steps, "cases": [x for x in c.cites if x.startswith("c-")]}
        cands.append({"family": c.family.value, "patch": c.patch.description or str(c.patch.parts[0]),
                      "learned": learned})  # fmt: skip
    return {"scenario": p["name"], "train_steps": p["subject"].train_steps, "candidates": cands}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--export", type=Path, nargs="+", required=True, help="JSONL case exports (merged by case id)")
    ap.add_argument("--split", choices=("dev", "holdout", "all"), default="dev")
    ap.add_argument("--scenarios", default=None, help="name glob within the split")
    ap.add_argument("--candidates", type=int, default=2, help="candidates the loop would verify")
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--signatures", type=Path, default=Path("bench/out/wrong_outcomes_signatures.pkl"))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    from remedy.cases.verify.scenarios import load_scenarios
    from remedy.kb.facade import KnowledgeBase

    names = {s.name for s in load_scenarios(args.scenarios) if args.split in ("all", s.split)}
    cases = _cases(args.export)
    confirmed = sum(
        1 for c in cases if c.verification and c.verification.status.value == "improved" and c.verification.stage
        and c.verification.stage.value == "confirm"
    )  # fmt: skip
    patients = [p for p in patient_signatures(args.signatures, args.episodes, names) if p["name"] in names]
    with tempfile.TemporaryDirectory() as tmp, KnowledgeBase.open(Path(tmp) / "kb") as kb:
        kb.add_many(cases)
        rows = [_row(kb, p, args.candidates) for p in sorted(patients, key=lambda p: p["name"])]
    fired = [r for r in rows if any(c["learned"] for c in r["candidates"])]
    print(
        f"KB: {len(cases)} cases, {confirmed} confirmed fixes; {len(rows)} {args.split} patients, own scenario excluded"
    )
    print(f"\n| patient | train steps | first {args.candidates} candidates | learned budget |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        fams = ", ".join(c["family"] for c in r["candidates"])
        learned = "; ".join(
            f"{c['family']}: {c['learned']['kind']} {c['learned']['steps']:,} from {len(c['learned']['cases'])} cases"
            for c in r["candidates"]
            if c["learned"]
        )
        print(f"| {r['scenario']} | {r['train_steps']:,} | {fams} | {learned or 'default rule'} |")
    print(f"\nlearned budgets fired on {len(fired)} of {len(rows)} patients")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"cases": len(cases), "confirmed": confirmed, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
