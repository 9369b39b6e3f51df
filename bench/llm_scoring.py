"""Scoring and patients of ``bench/llm_diagnosis.py``: hits per report, bootstrap intervals, the table,
and the built holdout patients shaped like reports (with their rollouts cached)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

BOOT = 2000
SEED = 0


def lm_usage(lm, start: int) -> tuple[int, int, int]:
    """(calls, prompt tokens, completion tokens) in the LM's history since ``start``."""
    calls = prompt = completion = 0
    for h in lm.history[start:]:
        calls += 1
        u = h.get("usage") or {}
        prompt += int(u.get("prompt_tokens") or 0)
        completion += int(u.get("completion_tokens") or 0)
    return calls, prompt, completion


def bootstrap(hits: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    """Percentile 95% interval of the mean of 0/1 hits over reports."""
    if not len(hits):
        return (float("nan"), float("nan"))
    means = hits[rng.integers(0, len(hits), size=(BOOT, len(hits)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def hits(rows: list[dict], reports: dict[str, dict], metric: str) -> np.ndarray:
    """0/1 per report: top-1 / top-3 cause or family top-3."""
    out = []
    for r in rows:
        truth = reports[r["id"]]
        if metric == "top1":
            out.append(bool(r["causes"][:1]) and r["causes"][0] in truth["causes"])
        elif metric == "top3":
            out.append(any(c in truth["causes"] for c in r["causes"][:3]))
        else:
            out.append(any(f in truth["families"] for f in (r["families"] or [])[:3]))
    return np.array(out, dtype=float)


def summarize(done: list[dict], reports: dict[str, dict], columns: list[str]) -> list[dict]:
    """One line per column: scores with intervals, counts of failures, LM cost."""
    lines = []
    for col in columns:
        rows = sorted((r for r in done if r["column"] == col), key=lambda r: r["id"])
        if not rows:
            continue
        line = {"column": col, "n": len(rows)}
        for m in ("top1", "top3", "family_top3"):
            if m == "family_top3" and col.startswith("lm choose"):  # a choose answer proposes no families
                line[m] = None
                continue
            h = hits(rows, reports, m)
            line[m] = float(h.mean())
            line[m + "_ci"] = bootstrap(h, np.random.default_rng(SEED))
        status = Counter(r["status"] for r in rows)
        line.update(
            parse=status["parse"],
            outside_only=status["outside"],
            outside_any=sum(bool(r["outside"]) for r in rows) + status["outside"],
            bad_patches=sum(r["bad_patches"] for r in rows),
            lm_errors=status["lm_error"],
            calls=sum(r.get("calls", 0) for r in rows),
            tokens=sum(r.get("prompt_tokens", 0) + r.get("completion_tokens", 0) for r in rows),
            seconds=sum(r.get("seconds", 0.0) for r in rows),
        )
        lines.append(line)
    return lines


def paired(done: list[dict], reports: dict[str, dict], a: str, b: str, metric: str) -> tuple[float, float, float, int]:
    """Mean difference b - a on the reports both columns scored, with a seeded paired bootstrap interval."""
    ra = {r["id"]: r for r in done if r["column"] == a}
    rb = {r["id"]: r for r in done if r["column"] == b}
    ids = sorted(set(ra) & set(rb))
    if not ids:
        return float("nan"), float("nan"), float("nan"), 0
    d = hits([rb[i] for i in ids], reports, metric) - hits([ra[i] for i in ids], reports, metric)
    lo, hi = bootstrap(d, np.random.default_rng(SEED))
    return float(d.mean()), lo, hi, len(ids)


def _pct(x) -> str:
    return "—" if x is None else f"{x:.0%}"


def _ci(line: dict, m: str) -> str:
    if line.get(m) is None:
        return f"{'—':>17}"
    lo, hi = line[m + "_ci"]
    return f"{line[m]:>4.0%} [{lo:.0%}, {hi:.0%}]".rjust(17)


def print_table(label: str, lines: list[dict]) -> None:
    """The table docs/benchmarks.md carries."""
    print(f"model: {label}")
    head = (
        f"{'column':<40} {'n':>3} {'top-1 [95% CI]':>17} {'top-3 [95% CI]':>17} {'fam-3 [95% CI]':>17} "
        f"{'parse':>5} {'outside':>7} {'badpatch':>8} {'lmerr':>5} {'calls':>5} {'tokens':>7} {'wall s':>7}"
    )
    print(head)
    print("-" * len(head))
    for x in lines:
        print(
            f"{x['column']:<40} {x['n']:>3} {_ci(x, 'top1')} {_ci(x, 'top3')} {_ci(x, 'family_top3')} "
            f"{x['parse']:>5} {x['outside_any']:>7} {x['bad_patches']:>8} {x['lm_errors']:>5} {x['calls']:>5} "
            f"{x['tokens']:>7} {x['seconds']:>7.0f}"
        )


def load_patients() -> list[dict]:
    """Every dev scenario (for the baselines) and every built holdout one, shaped like a report."""
    from remedy.cases.verify.scenarios import find_built, load_scenarios

    items = []
    for s in load_scenarios():
        if s.split != "dev" and find_built(s) is None:
            continue  # never trained here: only patients already built are scored
        items.append(
            {"id": s.name, "split": s.split, "patient": s}
            | {"causes": [g.value for g in s.ground_truth], "families": [f.value for f in s.expected_families]}
        )
    return items


def patient_context(scenario, cache: Path, episodes: int) -> dict:
    """The patient's subject, signature and evidence as ``diagnose_run`` computes them, cached in ``cache``.

    The rollout (seed 0, ``episodes`` episodes) is the costly part and the same for every column.
    """
    from remedy.cases.evidence.rollouts import collect_evidence
    from remedy.cases.evidence.signature import compute_signature
    from remedy.cases.model import EpisodeSummary, Signature, Subject
    from remedy.cases.verify.scenarios import find_built
    from remedy.kb.diagnose import failure_episodes, reward_text

    lines = cache.read_text().splitlines() if cache.exists() else []
    rows = {x["id"]: x for x in map(json.loads, lines) if x["n_episodes"] == episodes}
    row = rows.get(scenario.name)
    if row is None:
        run = find_built(scenario).run
        subject = run.subject()
        bundle = collect_evidence(run, n_episodes=episodes, seed=0)
        row = {
            "id": scenario.name,
            "n_episodes": episodes,
            "subject": subject.model_dump_json(),
            "signature": compute_signature(bundle, subject).model_dump_json(),
            "episodes": [e.model_dump_json() for e in failure_episodes(bundle)],
            "reward_code": reward_text(run),
            "notes": list(bundle.notes),
            "constraints": [c.expr for c in run.config.constraints],
        }
        with cache.open("a") as f:
            f.write(json.dumps(row) + "\n")
    return {
        "subject": Subject.model_validate_json(row["subject"]),
        "signature": Signature.model_validate_json(row["signature"]),
        "episodes": tuple(EpisodeSummary.model_validate_json(e) for e in row["episodes"]),
        "reward_code": row["reward_code"],
        "notes": tuple(row["notes"]),
        "constraints": tuple(row["constraints"]),
    }
