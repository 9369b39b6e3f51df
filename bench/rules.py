"""Do mined rules pay? Holdout diagnosis with rules mined from dev-scenario cases vs without.

Rules are mined from the dev-scenario cases of the bench exports (default
``reports/kb/dev-cases.jsonl``; several files are merged, each case once by id; holdout cases
are dropped should any be there). ``--mine-split holdout`` runs the reverse check: rules mined
from holdout cases, scored on the dev patients (nothing is tuned on either). A reviewer is
SIMULATED: every rule the miner keeps (q ≤ fdr) is accepted without a look. Each holdout
patient (shipped or cached build; trained into ``--cache`` only when missing, which takes
minutes each) is rolled out once; its signature is diagnosed cold (offline diagnoser, no
KB retrieval, so only the rules differ) twice: with the accepted rules whose conditions hold
and without. Printed: top-1 / top-3 root-cause accuracy and expected-family-in-top-3, side by
side with always answering the most frequent dev causes. Per-patient rows are cached as JSON
under ``--out`` so an interrupted run resumes.

    .venv/bin/python bench/rules.py [--export reports/kb/dev-cases.jsonl ...] [--episodes 10]
    .venv/bin/python bench/rules.py --mine-split holdout --export reports/kb/holdout-sc08-cases.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from remedy.cases.errors import TooFewCasesError
from remedy.cases.evidence.rollouts import collect_evidence
from remedy.cases.evidence.signature import compute_signature
from remedy.cases.io import read_cases
from remedy.cases.verify.scenarios import build, find_built, load_scenarios
from remedy.kb.baselines import score_constant
from remedy.kb.bench import dev_baseline_answer, score_causes
from remedy.kb.diagnose import diagnose_signature, failure_episodes
from remedy.kb.fixloop import one_torch_thread
from remedy.miners import Rule, RuleStatus, mine, rule_holds, subject_facts


def _mine(exports: list[Path], fdr: float, seed: int, split: str = "dev") -> tuple[list[Rule], int]:
    """The rules kept at ``fdr`` from the ``split`` cases of ``exports`` (each case once), all accepted."""
    other = {s.name for s in load_scenarios() if s.split != split}
    by_id = {c.case_id: c for export in exports for c in read_cases(export)[0]}
    cases = [c for c in by_id.values() if c.scenario not in other]
    try:
        result = mine(cases, fdr=fdr, seed=seed)
    except TooFewCasesError as err:
        print(f"no rules: {err}")
        return [], 0
    # the simulated reviewer accepts everything the miner kept
    return [r.model_copy(update={"status": RuleStatus.accepted}) for r in result.rules], result.n_attempts


def _row(s, rules: list[Rule], cache: Path, episodes: int) -> dict:
    built = find_built(s)
    run = built.run if built is not None else build(s, cache_dir=cache)
    subject = run.subject()
    bundle = collect_evidence(run, n_episodes=episodes, seed=0)
    signature = compute_signature(bundle, subject)
    facts = subject_facts(subject, signature)
    matched = [r for r in rules if rule_holds(r.conditions, facts)]
    row: dict = {
        "scenario": s.name,
        "ground_truth": [g.value for g in s.ground_truth],
        "rules_matched": [r.id for r in matched],
    }
    expected = {f.value for f in s.expected_families}
    for arm, arm_rules in (("without", ()), ("with", matched)):
        report = diagnose_signature(None, subject, signature, rules=arm_rules, episodes=failure_episodes(bundle))
        causes = [c.cause.value for c in report.diagnosis.causes]
        top1, top3 = score_causes(causes, s.ground_truth)
        fams = [c.family.value for c in report.candidates[:3]]
        row[arm] = {
            "causes": causes[:3],
            "families": fams,
            "top1": top1,
            "top3": top3,
            "family3": bool(expected & set(fams)),
        }
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--export", type=Path, nargs="+", default=[Path("reports/kb/dev-cases.jsonl")])
    ap.add_argument("--mine-split", choices=("dev", "holdout"), default="dev",
                    help="mine from this split's cases, score on the other split's patients")  # fmt: skip
    ap.add_argument("--fdr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--cache", type=Path, default=Path("bench/out/rules/cache"))
    ap.add_argument("--out", type=Path, default=Path("bench/out/rules"))
    args = ap.parse_args()
    one_torch_thread()
    scored = "holdout" if args.mine_split == "dev" else "dev"
    rules, attempts = _mine(args.export, args.fdr, args.seed, args.mine_split)
    print(f"{len(rules)} rules mined from {attempts} {args.mine_split} attempts and accepted (simulated reviewer)")
    for r in rules:
        e = r.evidence
        print(f"  {r.id} {r.condition_text} -> {r.family.value}: {e.wins}/{e.support}, q {e.q_value:.3g}")
    if not rules:  # the "with" arm would be the "without" arm: nothing to build or score
        print(f"no rule kept at fdr {args.fdr}: {scored} diagnosis with rules = without, by construction")
        return
    rows_dir = args.out / "rows" if scored == "holdout" else args.out / f"rows-{scored}"
    rows_dir.mkdir(parents=True, exist_ok=True)
    key = "-".join(sorted(r.id for r in rules)) or "none"
    rows = []
    for s in [s for s in load_scenarios() if s.split == scored]:
        path = rows_dir / f"{s.name}.json"
        cached = json.loads(path.read_text()) if path.is_file() else None
        if cached is None or cached.get("rules_key") != key:
            cached = {**_row(s, rules, args.cache, args.episodes), "rules_key": key}
            path.write_text(json.dumps(cached, indent=2) + "\n")
        rows.append(cached)
        print(f"{s.name:36s} without {cached['without']['causes'][:1]} with {cached['with']['causes'][:1]} "
              f"rules {len(cached['rules_matched'])}", flush=True)  # fmt: skip
    _print_table(rows, len(rules), attempts, args.mine_split, scored)


def _print_table(rows: list[dict], n_rules: int, attempts: int, mined: str = "dev", scored: str = "holdout") -> None:
    n = len(rows) or 1
    answer = dev_baseline_answer()
    b1, b3 = score_constant(answer, [r["ground_truth"] for r in rows])
    lines = [
        f"{scored.capitalize()} diagnosis, {len(rows)} patients, offline diagnoser, no retrieval; {n_rules} rules "
        f"mined from {attempts} {mined} attempts, all accepted (simulated reviewer)",
        "",
        "| diagnosis | top-1 | top-3 | expected family in top-3 |",
        "| --- | --- | --- | --- |",
    ]
    for arm in ("without", "with"):
        t1, t3, f3 = (sum(r[arm][k] for r in rows) / n for k in ("top1", "top3", "family3"))
        lines.append(f"| {arm} rules | {t1:.0%} | {t3:.0%} | {f3:.0%} |")
    lines.append(f"| always {', '.join(answer)} | {b1:.0%} | {b3:.0%} | - |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
