"""Diagnosis accuracy per split next to the trivial baselines, on every patient already built.

No fine-tuning: each built patient (shipped or in the build cache; nothing is trained here) is
rolled out, its signature computed and diagnosed cold (offline diagnoser, no KB: the built-in
priors only, so no example or bench case can leak an answer). Top-1 / top-3 are scored against the ground truth and printed per split next to
always answering the most frequent dev cause and the fixed dev top-3.

    .venv/bin/python bench/accuracy.py            # JSON + Markdown under bench/data/
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from remedy.cases.verify.scenarios import find_built, load_scenarios
from remedy.cases.verify.solvability import latest_results
from remedy.kb.baselines import score_constant
from remedy.kb.bench import dev_baseline_answer, score_causes
from remedy.kb.diagnose import diagnose_run
from remedy.kb.fixloop import one_torch_thread


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path("bench/data"))
    args = ap.parse_args()
    one_torch_thread()
    answer = dev_baseline_answer()
    suite = load_scenarios()
    verdicts = {name: r.verdict for name, r in latest_results(suite).items()}
    rows = []
    for s in suite:
        built = find_built(s)
        if built is None:
            continue
        report = diagnose_run(None, built.run, n_episodes=args.episodes, exclude_scenario=s.name)
        causes = [c.cause.value for c in report.diagnosis.causes]
        top1, top3 = score_causes(causes, s.ground_truth)
        rows.append(
            {
                "scenario": s.name,
                "split": s.split,
                "family": s.family,
                "ground_truth": [g.value for g in s.ground_truth],
                "causes": causes[:3],
                "top1": top1,
                "top3": top3,
                "oracle_verdict": verdicts.get(s.name),
            }
        )
        print(f"{s.split:7s} {s.name:40s} top1={top1!s:5s} top3={top3!s:5s} {', '.join(causes[:3])}", flush=True)
    lines = [
        "# Diagnosis accuracy per split (cold, offline diagnoser, built patients only)",
        "",
        f"Baseline answer (most frequent ground-truth causes on the bundled dev split): {', '.join(answer)}",
        "",
        "'failing' leaves out patients that `bench build` found already succeeding (verdict not_failing).",
        "",
        "| split | patients | n | top-1 | top-3 | always the most frequent cause: top-1 | fixed top-3: top-3 |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    summary = {}
    for split in ("dev", "holdout"):
        for which in ("all built", "failing"):
            part = [
                r
                for r in rows
                if r["split"] == split and (which == "all built" or r["oracle_verdict"] != "not_failing")
            ]
            n = len(part) or 1
            b1, b3 = score_constant(answer, [r["ground_truth"] for r in part])
            f = summary[f"{split} ({which})"] = {
                "n": len(part),
                "top1": sum(r["top1"] for r in part) / n,
                "top3": sum(r["top3"] for r in part) / n,
                "baseline_top1": b1,
                "baseline_top3": b3,
            }
            lines.append(f"| {split} | {which} | {f['n']} | {f['top1']:.0%} | {f['top3']:.0%} | {b1:.0%} | {b3:.0%} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "accuracy.json").write_text(
        json.dumps({"answer": answer, "summary": summary, "rows": rows}, indent=2) + "\n"
    )
    (args.out / "accuracy.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
