"""The learning curve: does Remedy diagnose better as its experience grows, above the arms that need no memory?

Data: every real attempt the project has exported (``reports/kb/*.jsonl``) and whatever the case
factory has shipped (``bench/data/factory/*.parquet``), deduplicated by case id; rerun as the
factory grows. An *attempt* is a screen with its confirmations (``cases.outcomes.final_verdicts``);
a *patient* is a bundled fault scenario with at least one attempt, seen as its first-round
signature (what the diagnoser saw), scored against the scenario's answer key.

Two splits:

- ``holdout``: the holdout scenarios are the patients; training attempts are the dev scenarios' ones;
- ``lofo`` (leave one family out): for each scenario family, its scenarios (dev and holdout) are the
  patients and the other families' attempts are the training pool.

For each split, training KBs of 0, 25, 50 and 100% of the pool's attempts (``--seeds`` random subsets
at 25 and 50%, seeded; 0 and 100% have one subset), and per patient:

- ``vote``: the offline diagnoser with retrieval over the subset (exact cosine over the bundled
  embedder's vectors of each case's indexed text, the KB's ``vector`` search mode; the product's
  default ``hybrid`` mode adds a BM25 candidate pool), the patient's own scenario never in it;
- ``ranker``: the same vote reordered by a remedy ranker fitted on the subset's attempts
  (``remedy.optimizer.ranker``; at 0% there is nothing to fit and it is the vote);
- the arms that need no memory: ``empty_kb`` (the same diagnoser, priors only; the 0% point),
  ``taxonomy`` (the root cause whose one-line taxonomy meaning is closest to the signature's text:
  the failure-mode list alone) and ``most_frequent`` (the commonest first answer-key cause among the
  subset's scenarios; none at 0%).

Top-1 cause per patient is averaged over subsets, then a 95% percentile bootstrap over patients
(seeded) gives each interval, and a paired bootstrap gives ``vote`` and ``ranker`` minus ``empty_kb``.

    .venv/bin/python bench/learning_curve.py             # diagnosis only: minutes
    .venv/bin/python bench/learning_curve.py --fix-loops --shard 0/4 --work bench/out/lc   # hours: NOT run yet

``--fix-loops`` runs the real fix loop (``bench/run_split.run_scenarios``) per split, fraction,
subset and arm (``vote``: a KB of the subset; ``ranker``: the same KB with the subset's ranker
active), one JSON per patient under ``<work>/<cell>/<arm>/`` (resumable; ``--shard i/n`` takes every
n-th cell), and ``--fix-report`` tabulates the confirmed-fix rate and env steps per confirmed fix.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from remedy.cases.io import read_cases, write_cases
from remedy.cases.model import Case, RootCause, Signature, Source, Subject
from remedy.cases.outcomes import final_verdicts
from remedy.cases.verify.scenarios import Scenario, bundled_scenarios
from remedy.cases.verify.solvability import latest_results
from remedy.kb.bench import lofo_families, lofo_split
from remedy.optimizer.dataset import build_examples
from remedy.optimizer.ranker import AttemptRow, RankerSettings, attempt_rows, fit_ranker
from remedy.retrieval.diagnosis import DiagnosisContext, RetrievedCase, patch_family
from remedy.retrieval.embedder import default_embedder
from remedy.retrieval.index import signature_text
from remedy.retrieval.neighbours import by_patient, pool_size
from remedy.retrieval.offline import OfflineDiagnoser, OfflineSettings
from remedy.retrieval.remedy_ranker import RemedyRanker, rerank
from remedy.retrieval.taxonomy import CAUSE_TEXT
from remedy.retrieval.taxonomy import DIAGNOSABLE as CAUSES

FRACTIONS = (0.0, 0.25, 0.5, 1.0)
SOURCES = ("reports/kb/*.jsonl", "bench/data/factory/*.parquet")
OUT = Path("bench/data/learning_curve.json")
PLOT = Path("reports/learning-curve.png")
#: ``vote_by_case``: the vote before retrieval by past failure (the k nearest cases, each attempt voting alone)
ARMS = ("vote", "vote_by_case", "ranker", "ranker_only", "empty_kb", "taxonomy", "most_frequent")
ARM_STYLES = (
    ("vote", "-o"),
    ("vote_by_case", ":o"),
    ("ranker", "-s"),
    ("ranker_only", "-x"),
    ("most_frequent", ":^"),
    ("taxonomy", "--"),
    ("empty_kb", "--"),
)


@dataclass(frozen=True)
class Attempt:
    """One measured attempt: its cases (screen and final verdict), scenario and training row."""

    case_ids: tuple[str, ...]
    scenario: str | None
    row: AttemptRow
    family: str = ""  # the patch family tried


@dataclass(frozen=True)
class Patient:
    """A scenario's first-round failure and its answer key."""

    name: str
    family: str
    split: str
    subject: Subject
    signature: Signature
    truth: frozenset[RootCause]


def load(globs: tuple[str, ...]) -> list[Case]:
    """Measured cases of every source file, deduplicated by case id (first file wins), bundled examples aside."""
    seen: dict[str, Case] = {}
    for pattern in globs:
        for path in sorted(Path().glob(pattern)):
            for c in read_cases(path)[0]:
                seen.setdefault(c.case_id, c)
    return [c for c in seen.values() if c.verification is not None and c.source != Source.example]


def attempts_of(cases: list[Case]) -> list[Attempt]:
    """Each attempt with its training row (``attempt_rows`` walks ``final_verdicts`` in the same order)."""
    pairs = final_verdicts(cases)
    rows = attempt_rows(cases)
    return [
        Attempt(tuple(dict.fromkeys((s.case_id, f.case_id))), s.scenario, r, patch_family(s.patch).value)
        for (s, f), r in zip(pairs, rows)
    ]


def fixed_families(attempts: list[Attempt]) -> dict[str, set[str]]:
    """Scenario -> the patch families confirmed ``improved`` on it (the label of the family columns)."""
    out: dict[str, set[str]] = defaultdict(set)
    for a in attempts:
        if a.scenario and a.row.status == "improved":
            out[a.scenario].add(a.family)
    return out


def patients_of(cases: list[Case], scenarios: dict[str, Scenario]) -> list[Patient]:
    """One patient per scenario with attempts: its first attempt group's first-round signature."""
    out: dict[str, Patient] = {}
    for ex in build_examples(cases):
        name = ex.group.removeprefix("scenario:")
        if not ex.group.startswith("scenario:") or name in out or name not in scenarios:
            continue
        s = scenarios[name]
        out[name] = Patient(name, s.family or name, s.split, ex.subject, ex.signature, frozenset(s.ground_truth))
    return sorted(out.values(), key=lambda p: p.name)


def folds(patients: list[Patient], attempts: list[Attempt], scenarios: dict[str, Scenario], split: str):
    """(fold name, test patients, training pool) for the split."""
    if split == "holdout":
        test = [p for p in patients if p.split == "holdout"]
        pool = [a for a in attempts if a.scenario not in scenarios or scenarios[a.scenario].split == "dev"]
        return [("holdout", test, pool)]
    out = []
    for family in lofo_families(list(scenarios.values())):
        held = {s.name for s in lofo_split(list(scenarios.values()), family)}  # the family, never in training
        test = [p for p in patients if p.name in held]
        if test:
            out.append((family, test, [a for a in attempts if a.scenario not in held]))
    return out


def subsets(pool: list[Attempt], seeds: int) -> list[tuple[float, int, list[Attempt]]]:
    """(fraction, seed, attempts) for every fraction; seeded random subsets of attempts."""
    out = []
    for frac in FRACTIONS:
        n_seeds = 1 if frac in (0.0, 1.0) else seeds
        for seed in range(n_seeds):
            rng = np.random.default_rng([seed, int(frac * 100)])
            k = round(frac * len(pool))
            idx = sorted(rng.choice(len(pool), size=k, replace=False).tolist()) if k else []
            out.append((frac, seed, [pool[i] for i in idx]))
    return out


class Retrieval:
    """Exact cosine over every case's indexed text, embedded once (the KB's vector search mode)."""

    def __init__(self, cases: list[Case], patients: list[Patient]) -> None:
        emb = default_embedder()
        self.cases = cases
        self.index = {c.case_id: i for i, c in enumerate(cases)}
        self.space = np.array([c.subject.traits.action_space.value for c in cases])
        self.scenario = np.array([c.scenario or "" for c in cases])
        vc = emb.encode([signature_text(c.signature) for c in cases])
        vp = emb.encode([signature_text(p.signature) for p in patients])
        self.sims = {p.name: vc @ v for p, v in zip(patients, vp)}
        cause_vecs = emb.encode([CAUSE_TEXT[c] for c in CAUSES])
        self.taxonomy = {p.name: RootCause(CAUSES[int(np.argmax(cause_vecs @ v))]) for p, v in zip(patients, vp)}

    def similar(self, patient: Patient, ids: list[int], k: int = 10, by: str = "patient") -> tuple[RetrievedCase, ...]:
        """The cases of the ``k`` nearest past failures (patients) among the cases ``ids`` with the patient's
        action space, its own scenario excluded: as a diagnosis retrieves (``remedy.retrieval.neighbours``);
        ``by="case"``: the ``k`` nearest cases, as it retrieved before."""
        if not ids:
            return ()
        idx = np.array(ids)
        ok = (self.space[idx] == patient.subject.traits.action_space.value) & (self.scenario[idx] != patient.name)
        idx = idx[ok]
        sims = self.sims[patient.name][idx]
        order = np.argsort(-sims, kind="stable")[: pool_size(k) if by == "patient" else k]
        near = [RetrievedCase(self.cases[idx[i]], float(sims[i])) for i in order]
        return tuple(by_patient(near, k) if by == "patient" else near)


#: the vote's settings for every arm (``--cause-credit`` changes how a case's outcome credits causes)
VOTE: dict[str, OfflineSettings] = {"settings": OfflineSettings()}
#: what the ``vote_by_case`` arm changes: every attempt votes alone
BY_CASE = {"repeat_share": False}


def top1(
    patient: Patient,
    cases: tuple[RetrievedCase, ...],
    ranker: RemedyRanker | None,
    mode: str = "blend",
    changes: dict[str, Any] | None = None,
) -> tuple[float, str | None]:
    """(1.0 when the top cause is in the patient's answer key, the top candidate's family); ``mode``: the cause
    order; ``changes``: settings that differ from the vote's."""
    ctx = DiagnosisContext(subject=patient.subject, signature=patient.signature, cases=cases)
    report = OfflineDiagnoser(VOTE["settings"].model_copy(update=changes or {})).diagnose(ctx)
    if ranker is not None:
        report = rerank(report, ranker, patient.subject, causes=mode)
    causes = report.diagnosis.root_causes
    family = report.candidates[0].family.value if report.candidates else None
    return float(bool(causes) and causes[0] in patient.truth), family


def most_frequent(chosen: list[Attempt], scenarios: dict[str, Scenario]) -> RootCause | None:
    """The commonest first answer-key cause among the training scenarios (each scenario once)."""
    names = {a.scenario for a in chosen if a.scenario}
    counts = Counter(scenarios[n].ground_truth[0] for n in names if n in scenarios)
    return min(counts, key=lambda c: (-counts[c], c.value)) if counts else None


def run_split(split, patients, attempts, scenarios, retrieval, seeds) -> dict:
    """Per arm and fraction: each patient's top-1 averaged over subsets (patient name -> value)."""
    scores: dict[str, dict[float, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    fixes = fixed_families(attempts)  # labels from every attempt on the patient, never training data
    for fold, test, pool in folds(patients, attempts, scenarios, split):
        for frac, seed, chosen in subsets(pool, seeds):
            ids = sorted({retrieval.index[i] for a in chosen for i in a.case_ids})
            ranker = fit_ranker([a.row for a in chosen], RankerSettings(seed=seed)) if chosen else None
            common = most_frequent(chosen, scenarios)
            for p in test:
                near = retrieval.similar(p, ids)
                arms = {"vote": top1(p, near, None), "ranker": top1(p, near, ranker), "empty_kb": top1(p, (), None)}
                arms["ranker_only"] = top1(p, near, ranker, "ranker")
                arms["vote_by_case"] = top1(p, retrieval.similar(p, ids, by="case"), None, changes=BY_CASE)
                for arm, (hit, family) in arms.items():
                    scores[arm][frac][p.name].append(hit)
                    if p.name in fixes and arm != "ranker_only":  # the candidate order is the same in both modes
                        scores[f"{arm}_family"][frac][p.name].append(float(family in fixes[p.name]))
                if common is not None:
                    scores["most_frequent"][frac][p.name].append(float(common in p.truth))
                scores["taxonomy"][frac][p.name].append(float(retrieval.taxonomy[p.name] in p.truth))
            print(f"{split} {fold} {frac:.0%} seed {seed}: {len(chosen)} attempts", flush=True)
    return {
        arm: {str(f): {n: float(np.mean(v)) for n, v in by.items()} for f, by in fr.items()}
        for arm, fr in scores.items()
    }


def bootstrap(values: np.ndarray, rng: np.random.Generator, n: int = 2000) -> tuple[float, float]:
    """95% percentile bootstrap interval of the mean of ``values``."""
    if len(values) == 0:
        return (math.nan, math.nan)
    means = values[rng.integers(0, len(values), size=(n, len(values)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


#: the arms that use experience (each also as ``<arm>_family``), paired with the empty KB
LEARNERS = ("vote", "vote_by_case", "ranker", "ranker_only")
#: the vote's columns paired with the vote by case
BY_CASE_OF = {"vote": "vote_by_case", "vote_family": "vote_by_case_family"}


def summarize(per: dict, seed: int = 0) -> dict:
    """Mean and CI per arm and fraction, and paired differences of vote / ranker against empty_kb."""
    out: dict = {}
    for arm, fr in per.items():
        cold = per["empty_kb_family" if arm.endswith("_family") else "empty_kb"]["0.0"]
        for f, by in fr.items():
            rng = np.random.default_rng(seed)  # the same resamples in every cell: equal columns, equal intervals
            v = np.array([by[n] for n in sorted(by)])
            row = {"n": len(v), "mean": float(v.mean()), "ci": bootstrap(v, rng)}
            if arm.removesuffix("_family") in LEARNERS:
                d = np.array([by[n] - cold[n] for n in sorted(by)])
                row |= {"minus_empty_kb": float(d.mean()), "minus_empty_kb_ci": bootstrap(d, rng)}
            by_case = per.get(BY_CASE_OF.get(arm, ""), {}).get(f)
            if by_case:  # the same patients, retrieval by past failure against by case
                d = np.array([by[n] - by_case[n] for n in sorted(by)])
                row |= {"minus_by_case": float(d.mean()), "minus_by_case_ci": bootstrap(d, rng)}
            out.setdefault(arm, {})[f] = row
    return out


def table(summary: dict, split: str) -> str:
    """The Markdown table of one split: each arm's mean [95% CI], then vote and ranker minus the empty KB."""
    head = (
        "| training attempts | " + " | ".join(ARMS) + " | vote − empty KB | ranker − empty KB | vote − vote by case |\n"
    )
    head += "| --- |" + " --- |" * (len(ARMS) + 3) + "\n"
    lines = []
    for f in map(str, FRACTIONS):
        cells = []
        for arm in ARMS:
            r = summary.get(arm, {}).get(f)
            cells.append("-" if r is None else f"{r['mean']:.2f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]")
        cells += _diffs(summary, f, ("vote", "ranker"), ("vote",))
        lines.append(f"| {float(f):.0%} | " + " | ".join(cells) + " |")
    n = summary["empty_kb"]["0.0"]["n"]
    return f"**{split}** ({n} patients)\n\n" + head + "\n".join(lines) + "\n\n" + family_table(summary)


def _diffs(summary: dict, f: str, against_empty: tuple[str, ...], against_by_case: tuple[str, ...]) -> list[str]:
    """Paired differences with their intervals: each arm minus the empty KB, then minus the vote by case."""
    cells = []
    for key, arms in (("minus_empty_kb", against_empty), ("minus_by_case", against_by_case)):
        for arm in arms:
            r = summary.get(arm, {}).get(f, {})
            d, ci = r.get(key), r.get(f"{key}_ci")
            cells.append("-" if d is None else f"{d:+.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}]")
    return cells


def family_table(summary: dict) -> str:
    """Top candidate's family confirmed to fix the patient, on patients with a confirmed fix."""
    if "empty_kb_family" not in summary:
        return ""
    n = summary["empty_kb_family"]["0.0"]["n"]
    lines = [
        f"Top candidate's family among the families confirmed to fix the patient ({n} patients with a confirmed fix):",
        "",
        "| training attempts | vote | vote by case | ranker | empty KB | vote − empty KB | ranker − empty KB "
        "| vote − vote by case |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for f in map(str, FRACTIONS):
        cells = []
        for arm in ("vote_family", "vote_by_case_family", "ranker_family", "empty_kb_family"):
            r = summary.get(arm, {}).get(f)
            cells.append("-" if r is None else f"{r['mean']:.2f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]")
        cells += _diffs(summary, f, ("vote_family", "ranker_family"), ("vote_family",))
        lines.append(f"| {float(f):.0%} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def pool_sizes(patients, attempts, scenarios) -> dict[str, dict[str, int]]:
    """Per split, each test patient's full training pool (the attempts its 100% KB holds)."""
    return {
        split: {p.name: len(pool) for _, test, pool in folds(patients, attempts, scenarios, split) for p in test}
        for split in ("holdout", "lofo")
    }


def slopes(per: dict, pools: dict[str, int], seed: int = 0, aim: float = 0.15) -> dict:
    """How fast each learner gains on the empty KB as attempts are added, and what that implies.

    Per patient, the least-squares slope of (arm − empty KB) against the number of training attempts
    in its KB (0, 25, 50, 100% of its pool), in points per 100 attempts; the mean over patients with a
    95% bootstrap interval. ``attempts_to_aim`` extrapolates the line from the 100% point to ``aim``
    (+15 points over the empty KB): at the mean slope and at the interval's upper end (the most
    hopeful reading); None where that slope is not above zero (no pool size reaches the aim).
    """
    out: dict = {}
    cold = per["empty_kb"]["0.0"]
    for arm in ("vote", "ranker"):
        names = sorted(set(cold) & set(per[arm]["1.0"]) & set(pools))
        fr = [f for f in map(str, FRACTIONS) if f in per[arm]]
        rows = []
        for n in names:
            x = np.array([float(f) * pools[n] for f in fr if n in per[arm][f]])
            y = np.array([per[arm][f][n] - cold[n] for f in fr if n in per[arm][f]])
            rows.append(np.polyfit(x, y, 1)[0] * 100 if len(x) > 1 and np.ptp(x) > 0 else 0.0)
        v = np.array(rows)
        lo, hi = bootstrap(v, np.random.default_rng(seed))
        at_full = float(np.mean([per[arm]["1.0"][n] - cold[n] for n in names]))
        pool = float(np.mean([pools[n] for n in names]))
        out[arm] = {"n": len(v), "per_100": float(v.mean()), "ci": [lo, hi], "at_full": at_full, "pool": pool,
                    "attempts_to_aim": _needed(float(v.mean()), pool, at_full, aim),
                    "attempts_to_aim_hopeful": _needed(hi, pool, at_full, aim)}  # fmt: skip
    return out


def _needed(slope: float, pool: float, at_full: float, aim: float) -> float | None:
    """KB size at which a line through (pool, at_full) with ``slope`` per 100 attempts reaches ``aim``."""
    return None if slope <= 0 else pool + max(0.0, aim - at_full) / slope * 100


def slope_table(slopes_by_split: dict) -> str:
    """The slopes as Markdown: points per 100 attempts and the attempts a straight line needs for +15."""
    lines = [
        "Slope of each learner over the empty KB (points of top-1 per 100 training attempts, least squares per "
        "patient, mean [95% CI]) and the KB size a straight line would need for +15 points (at the mean slope; "
        "at the interval's upper end):",
        "",
        "| split | arm | patients | mean pool | − empty KB at 100% | slope per 100 attempts | attempts for +15 | "
        "hopeful |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for split, by in slopes_by_split.items():
        for arm, r in by.items():
            need = "never" if r["attempts_to_aim"] is None else f"{r['attempts_to_aim']:,.0f}"
            hope = "never" if r["attempts_to_aim_hopeful"] is None else f"{r['attempts_to_aim_hopeful']:,.0f}"
            lines.append(
                f"| {split} | {arm} | {r['n']} | {r['pool']:.0f} | {r['at_full'] * 100:+.0f} | {r['per_100'] * 100:+.1f} "
                f"[{r['ci'][0] * 100:+.1f}, {r['ci'][1] * 100:+.1f}] | {need} | {hope} |"
            )
    return "\n".join(lines) + "\n"


def plot(summaries: dict, path: Path) -> None:
    """Top-1 against training share, one panel per split, intervals shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(summaries), figsize=(5.5 * len(summaries), 4), sharey=True)
    for ax, (split, s) in zip(np.atleast_1d(axes), summaries.items()):
        for arm, style in ARM_STYLES:
            fs = [f for f in map(str, FRACTIONS) if f in s.get(arm, {})]
            if arm in ("taxonomy", "empty_kb"):
                fs = [str(FRACTIONS[0]), str(FRACTIONS[-1])]  # need no memory: one flat line
                ys = [s[arm]["0.0"]["mean"]] * 2
            else:
                ys = [s[arm][f]["mean"] for f in fs]
                lo = [s[arm][f]["ci"][0] for f in fs]
                hi = [s[arm][f]["ci"][1] for f in fs]
                if arm in ("vote", "ranker"):  # bands for the two learners only, so the plot stays readable
                    ax.fill_between([float(f) * 100 for f in fs], lo, hi, alpha=0.12)
            ax.plot([float(f) * 100 for f in fs], ys, style, label=arm.replace("_", " "))
        ax.set_title(f"{split}: {s['empty_kb']['0.0']['n']} patients")
        ax.set_xlabel("% of training attempts in the KB")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("top-1 cause (95% CI)")
    np.atleast_1d(axes)[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


# ---- the fix-loop columns (hours of training: built, not run this session) -------------------------


def fix_cells(patients, attempts, scenarios, seeds, splits=("holdout", "lofo"), fractions=None, keep=None):
    """Every (cell name, test patients, attempts) of ``splits``, in a stable order; ``fractions`` (of 1)
    narrows the KB sizes and ``keep`` (patient names, e.g. the oracle-solvable ones) the patients."""
    for split in splits:
        for fold, test, pool in folds(patients, attempts, scenarios, split):
            test = [p for p in test if keep is None or p.name in keep]
            if not test:
                continue
            for frac, seed, chosen in subsets(pool, seeds):
                if fractions is None or frac in fractions:
                    yield f"{split}-{fold}-{int(frac * 100)}-{seed}", test, chosen


def _in_shard(name: str, shard: str) -> bool:
    """Whether ``name`` (a cell or a patient) falls to this process's ``--shard i/n`` (a stable hash)."""
    index, count = (int(x) for x in shard.split("/"))
    return int(hashlib.sha256(name.encode()).hexdigest(), 16) % count == index


def _fix_settings(args, scenarios) -> tuple[Any, Path, set[str] | None]:
    """The fix loops' bench settings, their oracle results file, and (``--solvable-only``) the patients
    their oracle fixed; None: every patient."""
    from remedy.kb.bench import BenchSettings

    settings = BenchSettings(rounds=args.rounds, candidates=args.candidates, seeds=args.fix_seeds)
    oracle = Path(settings.oracle_results or "bench/data/oracle.jsonl")
    if not args.solvable_only:
        return settings, oracle, None
    records = latest_results(list(scenarios.values()), oracle)
    return settings, oracle, {name for name, r in records.items() if r.verdict == "solvable"}


def run_fix_loops(args, patients, attempts, scenarios, cases) -> None:
    """The real fix loop per cell and arm, resumable (one JSON per patient), this shard's cells only."""
    from run_split import open_kb, run_scenarios

    from remedy.optimizer.versions import ProgramStore

    by_id = {c.case_id: c for c in cases}
    settings, oracle, keep = _fix_settings(args, scenarios)
    fractions = None if args.fractions is None else {int(f) / 100 for f in args.fractions.split(",")}
    splits = tuple(args.splits.split(","))
    cells = list(fix_cells(patients, attempts, scenarios, args.seeds, splits, fractions, keep))
    for cell, test, chosen in reversed(cells) if args.reverse else cells:
        if not _in_shard(cell, args.shard) or not any(fnmatch.fnmatch(cell, g) for g in args.cells.split(",")):
            continue
        if args.dry_run:
            print(f"{cell}: {len(test)} patients, {len(chosen)} attempts in the KB", flush=True)
            continue
        export = args.work / cell / "kb.jsonl"
        if not export.exists():
            export.parent.mkdir(parents=True, exist_ok=True)
            write_cases(export, [by_id[i] for a in chosen for i in a.case_ids])
        chosen_s = [scenarios[p.name] for p in (reversed(test) if args.reverse else test)]  # meet half-way
        for arm in args.arms.split(","):
            if arm == "ranker" and not chosen:
                continue  # nothing to fit: the vote column is this point
            kb = open_kb(args.work / cell / f"{arm}_kb", export)
            programs = ProgramStore(kb.store)
            if arm == "ranker" and programs.active("ranker") is None:
                ranker = fit_ranker([a.row for a in chosen])
                programs.add(backend="ranker", optimizer="logistic-l2", train_size=len(chosen), val_size=0,
                             active_val=None, new_val=0.0, promote=True, reason="learning curve: subset ranker",
                             parameters=ranker.model_dump(mode="json", exclude={"version"}))  # fmt: skip
            folder = args.work / cell / arm
            folder.mkdir(parents=True, exist_ok=True)
            run_scenarios(chosen_s, settings, folder, oracle, retrieval=kb, label=f"{cell}/{arm}")


#: the no-diagnosis fixing arms (``remedy.kb.baselines.FIX_BASELINES``), written beside a cold cell's vote
BASELINE_ARMS = ("tuned_defaults", "random_search")


def run_fix_baselines(args, patients, attempts, scenarios) -> None:
    """The fixing baselines on the patients of every cold (0%) cell: the loop's number of candidates
    (rounds x candidates), each screened and a cleared screen confirmed as the loop does, one JSON per
    patient under ``<work>/<cold cell>/<arm>/`` (resumable; ``--shard i/n`` takes every n-th patient)."""
    from dataclasses import asdict

    from remedy.cases.verify.scenarios import build
    from remedy.kb.baselines import run_fix_baseline

    settings, _, keep = _fix_settings(args, scenarios)
    splits = tuple(args.splits.split(","))
    for cell, test, _ in fix_cells(patients, attempts, scenarios, args.seeds, splits, {0.0}, keep):
        for p in test:
            if not _in_shard(p.name, args.shard):
                continue
            s = scenarios[p.name]
            for arm in BASELINE_ARMS:
                target = args.work / cell / arm / f"{p.name}.json"
                if target.exists():
                    continue
                if args.dry_run:
                    print(f"{cell}/{arm} {p.name}", flush=True)
                    continue
                fix = run_fix_baseline(arm, s, build(s), settings.rounds * settings.candidates,
                                       settings.verify_config(s), settings.baseline_seed)  # fmt: skip
                row = {"scenario": p.name, "split": s.split, "solvable": True if keep else None,
                       "fixed": fix.fixed, "works": None, "attempts": fix.attempts, "total_env_steps": fix.env_steps,
                       "statuses": fix.statuses, "winning_patch": fix.winning_patch, "error": fix.error,
                       "baseline": asdict(fix)}  # fmt: skip
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(json.dumps(row, indent=2) + "\n")
                print(f"{cell}/{arm} {p.name}: fixed={fix.fixed} env_steps={fix.env_steps:,}", flush=True)


def _fix_rows(folder: Path) -> dict[str, dict]:
    """The written fix-loop results of one cell and arm, by patient, solvable ones only."""
    rows = (json.loads(f.read_text()) for f in sorted(folder.glob("*.json")))
    return {r["scenario"]: r for r in rows if r.get("solvable") is not False}


def _spent(row: dict, at_first_fix: bool = False) -> int:
    """The env steps a patient's loop spent; ``at_first_fix``: up to its first confirmed fix where it had one
    (what a loop stopping at the first ``improved`` would have spent; the shipped loop goes on to look for an
    agent that meets its success definition)."""
    if at_first_fix and row.get("fixed") and row.get("env_steps_to_fix") is not None:
        return int(row["env_steps_to_fix"])
    return int(row.get("total_env_steps", 0))


def _per_fix(rows: list[dict], at_first_fix: bool = False) -> float:
    """Env steps spent on these patients per confirmed fix among them (inf without a fix)."""
    fixes = sum(bool(r.get("fixed")) for r in rows)
    return sum(_spent(r, at_first_fix) for r in rows) / fixes if fixes else math.inf


def _ratio_ci(
    rows: dict[str, dict], cold: dict[str, dict], names: list[str], picks: np.ndarray, at_first_fix: bool
) -> str:
    """Env steps per confirmed fix, ``rows`` over ``cold`` on ``names``, with a 95% bootstrap interval."""
    per = lambda side, pick: _per_fix([side[names[i]] for i in pick], at_first_fix)  # noqa: E731
    point = per(rows, range(len(names))) / per(cold, range(len(names)))
    ratios = np.array([per(rows, pick) / per(cold, pick) for pick in picks], dtype=float)
    finite = ratios[np.isfinite(ratios)]
    lo, hi = np.percentile(finite, [2.5, 97.5]) if len(finite) else (math.nan, math.nan)
    return f"{point:.2f} [{lo:.2f}, {hi:.2f}]" if math.isfinite(point) else "- (no fix on either side)"


def _paired_cells(cells: dict[tuple[str, str], dict[str, dict]]):
    """((cell, arm), its rows, the cold rows of its fold) for every warm cell with patients in common with its
    fold's cold cell; then, for a split with several folds (leave one family out), every fold of one KB share
    and arm pooled into one row (``<split>-all-<share>-<seed>``): each patient sits in exactly one fold."""
    pooled: dict[tuple[str, str], tuple[dict, dict, list[str]]] = {}
    for (cell, arm), rows in cells.items():
        split, fold, share, seed = cell.split("-", 3) if cell.count("-") >= 3 else (cell, "", "", "")
        cold_cell = cell.rsplit("-", 2)[0] + "-0-0"
        cold = cells.get((cold_cell, "vote"), {})
        if (cell, arm) == (cold_cell, "vote") or not set(rows) & set(cold):
            continue
        yield (cell, arm), rows, cold
        warm_all, cold_all, folds = pooled.setdefault((f"{split}-all-{share}-{seed}", arm), ({}, {}, []))
        warm_all.update(rows)
        cold_all.update(cold)
        folds.append(fold)
    for key, (rows, cold, folds) in pooled.items():
        if len(folds) > 1:
            yield key, rows, cold


def fix_report(work: Path, seed: int = 0) -> str:
    """Per cell and arm: confirmed fixes (``improved`` on fresh seeds), agents that now work, env steps
    per confirmed fix; then each arm against the cold vote (the same fold's 0% cell) on the same patients,
    paired, with 95% bootstrap intervals over patients."""
    lines = [
        "| cell | arm | patients | confirmed fix | agent works | env steps | env steps per confirmed fix |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    cells: dict[tuple[str, str], dict[str, dict]] = {}
    arms = ("vote", "ranker", *BASELINE_ARMS)
    for folder in sorted(p for p in work.glob("*/*") if p.is_dir() and p.name in arms):
        rows = cells[(folder.parent.name, folder.name)] = _fix_rows(folder)
        n, steps = len(rows), sum(r.get("total_env_steps", 0) for r in rows.values())
        fixed = sum(bool(r.get("fixed")) for r in rows.values())
        works = sum(bool(r.get("works")) for r in rows.values()) if folder.name not in BASELINE_ARMS else "-"
        per = _per_fix(list(rows.values()))
        lines.append(
            f"| {folder.parent.name} | {folder.name} | {n} | {fixed} ({fixed / max(n, 1):.0%}) | {works} | "
            f"{steps:,} | {'-' if math.isinf(per) else f'{per:,.0f}'} |"
        )
    lines += [
        "",
        "| cell | arm | patients | confirmed-fix rate − cold [95% CI] | env steps per fix ÷ cold [95% CI] "
        "| the same, both stopping at the first confirmed fix [95% CI] "
        "| env steps to the first confirmed fix ÷ cold, patients both fix [95% CI] |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (cell, arm), rows, cold in _paired_cells(cells):
        # one stream per row, so adding a row (a baseline arm) leaves the others' intervals as they were
        rng = np.random.default_rng([seed, int(hashlib.sha256(f"{cell}/{arm}".encode()).hexdigest()[:8], 16)])
        names = sorted(set(rows) & set(cold))
        diff = np.array([float(bool(rows[n].get("fixed"))) - float(bool(cold[n].get("fixed"))) for n in names])
        picks = rng.integers(0, len(names), size=(2000, len(names)))  # the same resamples for both ratios
        ratio = _ratio_ci(rows, cold, names, picks, at_first_fix=False)
        at_fix = _ratio_ci(rows, cold, names, picks, at_first_fix=True)
        d_lo, d_hi = bootstrap(diff, rng)
        both = [n for n in names if rows[n].get("fixed") and cold[n].get("fixed")]
        cheaper = _both_fixed_ratio(rows, cold, both, np.random.default_rng([seed, len(both), 1]))
        lines.append(
            f"| {cell} | {arm} | {len(names)} | {diff.mean():+.2f} [{d_lo:+.2f}, {d_hi:+.2f}] | {ratio} | {at_fix} "
            f"| {cheaper} |"
        )
    return "\n".join(lines) + "\n\n" + floor_table(cells)


def first_candidate_fix(row: dict) -> bool:
    """Fixed by the loop's first candidate: its screen then its confirmation, nothing tried before it (the
    fewest env steps that patch's verification allows)."""
    to_fix, statuses = row.get("attempts_to_fix"), row.get("statuses") or []
    return bool(row.get("fixed")) and (to_fix == 1 or (to_fix == 2 and statuses[:1] == ["inconclusive"]))


def floor_table(cells: dict[tuple[str, str], dict[str, dict]]) -> str:
    """Where cold already sits at one screen and one confirmation: on the patients both arms fix, how many each
    fixes with its first candidate, and how far the other patients' steps to the fix would have to fall for
    a 0.5x steps ratio if the arm matched cold's cost on cold's first-candidate fixes (the same patch verified
    at the same budget costs the same steps, whatever ranked it first)."""
    lines = [
        "| cell | arm | patients both fix | fixed by the first candidate, arm / cold "
        "| cold's env steps to the fix: first-candidate fixes / the others "
        "| for 0.5x, the others at most (÷ cold's) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for (cell, arm), rows, cold in _paired_cells(cells):
        both = sorted(n for n in set(rows) & set(cold) if rows[n].get("fixed") and cold[n].get("fixed"))
        if not both:
            continue
        at_floor = [n for n in both if first_candidate_fix(cold[n])]
        floor = sum(_spent(cold[n], at_first_fix=True) for n in at_floor)
        rest = sum(_spent(cold[n], at_first_fix=True) for n in both) - floor
        allowed = 0.5 * (floor + rest) - floor  # < 0 only where floor > rest, so rest > 0 when it is used
        need = f"{allowed:,.0f} ({allowed / rest:.2f})" if allowed >= 0 else f"none: {floor:,} alone is over half"
        mine = "-" if arm in BASELINE_ARMS else sum(first_candidate_fix(rows[n]) for n in both)  # no candidates
        lines.append(f"| {cell} | {arm} | {len(both)} | {mine} / {len(at_floor)} | {floor:,} / {rest:,} | {need} |")
    return "\n".join(lines) + "\n"


def _both_fixed_ratio(rows: dict[str, dict], cold: dict[str, dict], both: list[str], rng: np.random.Generator) -> str:
    """On the patients both arms fix: env steps to the first confirmed fix, ``rows`` over ``cold`` (whether
    an arm fixes the same patients more cheaply, apart from fixing more of them)."""
    if not both:
        return "- (no patient fixed by both)"
    picks = rng.integers(0, len(both), size=(2000, len(both)))
    return f"{_ratio_ci(rows, cold, both, picks, at_first_fix=True)} ({len(both)})"


def _cell_split_share(cell: str) -> tuple[str, int]:
    """A fix-loop cell's split and KB share in %: ``lofo-gamma_too_low-50-1`` -> ("lofo", 50)."""
    head, share, _ = cell.rsplit("-", 2)
    return head.split("-", 1)[0], int(share)


def partial_subsets(works: list[Path], arm: str = "vote") -> dict[tuple[str, int, int], dict]:
    """The random subsets of ``arm`` not finished yet, which the curve leaves out: (split, KB share, subset) ->
    its progress. A subset is its cells of one share and seed, one per fold (``lofo-<family>-50-0``); it is
    finished when every fold with a cold cell (``<split>-<fold>-0-0``) has the subset's cell with a result for
    every patient of that cold cell. A bench run in chunks leaves such subsets in its folder; they count once
    their last patient is written."""
    cells: dict[str, dict[str, dict]] = {}
    for work in works:
        for folder in sorted(p for p in work.glob("*/*") if p.is_dir() and p.name == arm):
            cells.setdefault(folder.parent.name, {}).update(_fix_rows(folder))
    colds = {cell.rsplit("-", 2)[0]: rows for cell, rows in cells.items() if cell.endswith("-0-0") and rows}
    groups: dict[tuple[str, int, int], list[str]] = defaultdict(list)
    for cell in cells:
        split, share = _cell_split_share(cell)
        if share:
            groups[(split, share, int(cell.rsplit("-", 1)[1]))].append(cell)
    out = {}
    for (split, share, subset), members in sorted(groups.items()):
        folds = sorted(f for f in colds if f.split("-", 1)[0] == split)
        have = {c.rsplit("-", 2)[0]: cells[c] for c in members}
        done = [f for f in folds if f in have and set(colds[f]) <= set(have[f])]
        if len(done) == len(folds):
            continue
        out[(split, share, subset)] = {
            "cells": sorted(members), "folds": len(folds), "folds_done": len(done),
            "patients": sum(len(colds[f]) for f in folds),
            "rows": {n: r for f in folds for n, r in have.get(f, {}).items() if n in colds[f]},
            "cold": {n: r for f in folds for n, r in colds[f].items()},
        }  # fmt: skip
    return out


def partial_table(partial: dict[tuple[str, int, int], dict]) -> str:
    """The unfinished subsets as Markdown: how far each got, and on its patients so far, its confirmed fixes and
    env steps per fix beside the cold vote's on the same patients (no interval: a chunk, not a point)."""
    if not partial:
        return ""
    lines = [
        "Unfinished random subsets (left out of the curve above until their last patient is written):",
        "",
        "| split | KB share | subset | folds finished | patients with a result | confirmed fixes, subset / cold "
        "| env steps per fix ÷ cold, on those patients |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (split, share, subset), p in partial.items():
        rows, cold = p["rows"], p["cold"]
        names = sorted(rows)
        warm_fix = sum(bool(rows[n].get("fixed")) for n in names)
        cold_fix = sum(bool(cold[n].get("fixed")) for n in names)
        mine, theirs = _per_fix([rows[n] for n in names]), _per_fix([cold[n] for n in names])
        shown = f"{mine / theirs:.2f}" if math.isfinite(mine) and math.isfinite(theirs) else "-"  # a side without a fix
        lines.append(
            f"| {split} | {share}% | {subset} | {p['folds_done']} of {p['folds']} | {len(names)} of {p['patients']} "
            f"| {warm_fix} / {cold_fix} | {shown} |"
        )
    return "\n".join(lines) + "\n"


def _curve_rows(
    works: list[Path], arms: tuple[str, ...], on_cell: Callable[[str, int, str], None] | None = None
) -> dict[str, dict[tuple[str, int], dict[str, list[dict]]]]:
    """The written fix-loop results of ``arms`` under every folder of ``works``: split -> (arm, KB share) ->
    patient -> its rows (one per subset); ``on_cell(split, share, cell)`` for every cell with results. The
    cells of an unfinished subset (:func:`partial_subsets`) are left out."""
    rows: dict[str, dict[tuple[str, int], dict[str, list[dict]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    unfinished = {cell for arm in arms for p in partial_subsets(works, arm).values() for cell in p["cells"]}
    for work in works:
        for folder in sorted(p for p in work.glob("*/*") if p.is_dir() and p.name in arms):
            if folder.parent.name in unfinished:
                continue
            split, share = _cell_split_share(folder.parent.name)
            results = _fix_rows(folder)
            for name, row in results.items():
                rows[split][(folder.name, share)][name].append(row)
            if results and on_cell is not None:
                on_cell(split, share, folder.parent.name)
    return rows


def fix_curve(works: list[Path], arm: str = "vote", seed: int = 0) -> dict[str, list[dict]]:
    """The fix loops as a learning curve: per split (leave-one-family-out folds pooled) and KB share, ``arm``'s
    confirmed-fix rate and env steps per confirmed fix, with 95% bootstrap intervals over patients. Only the
    patients with a result at every share of the split count, so the points compare the same patients; a
    patient's subsets (several at 25 and 50%) are averaged for the rate and pooled for the steps. The fixing
    baselines (no diagnosis, written beside the cold cells) follow as points of their own arm at share 0, on
    the same patients."""
    rows = _curve_rows(works, (arm, *BASELINE_ARMS))
    out: dict[str, list[dict]] = {}
    for split, by in sorted(rows.items()):
        shares = sorted(share for a, share in by if a == arm)
        common = set.intersection(*(set(by[(arm, share)]) for share in shares)) if shares else set()
        names = sorted(common)
        if not names:
            continue
        rng = np.random.default_rng([seed, int(hashlib.sha256(split.encode()).hexdigest()[:8], 16)])
        picks = rng.integers(0, len(names), size=(2000, len(names)))
        points = []
        for label, share in [(arm, s) for s in shares] + [(b, 0) for b in BASELINE_ARMS if (b, 0) in by]:
            per = by[(label, share)]
            if not common <= set(per):
                continue
            rate = np.array([np.mean([bool(r.get("fixed")) for r in per[n]]) for n in names])
            steps = np.array([sum(r.get("total_env_steps", 0) for r in per[n]) for n in names], dtype=float)
            fixes = np.array([sum(bool(r.get("fixed")) for r in per[n]) for n in names], dtype=float)
            with np.errstate(divide="ignore", invalid="ignore"):
                boot = steps[picks].sum(axis=1) / fixes[picks].sum(axis=1)
            finite = boot[np.isfinite(boot)]
            k = len(per[names[0]])
            by_subset = (
                [
                    {"rate": float(np.mean([bool(per[n][i].get("fixed")) for n in names])),
                     "per_fix": _per_fix([per[n][i] for n in names])}
                    for i in range(k)
                ]
                if k > 1 and all(len(per[n]) == k for n in names)
                else []
            )  # fmt: skip
            points.append({
                "arm": label, "share": share, "patients": len(names),
                "subsets": max(len(per[n]) for n in names),
                "rate": float(rate.mean()), "rate_ci": [float(x) for x in np.percentile(rate[picks].mean(axis=1), [2.5, 97.5])],
                "per_fix": float(steps.sum() / fixes.sum()) if fixes.sum() else math.inf,
                "per_fix_ci": [float(x) for x in np.percentile(finite, [2.5, 97.5])] if len(finite) else [math.nan] * 2,
                "by_subset": by_subset,
            })  # fmt: skip
        out[split] = points
    return out


def cell_sizes(seeds: int = 3) -> dict[str, int]:
    """Every fix-loop cell's number of training attempts in its KB, as ``--fix-loops`` builds them."""
    scenarios = {s.name: s for s in bundled_scenarios()}
    cases = load(SOURCES)
    chosen_attempts = attempts_of(cases)
    cells = fix_cells(patients_of(cases, scenarios), chosen_attempts, scenarios, seeds)
    return {cell: len(chosen) for cell, _, chosen in cells}


def fix_slopes(
    works: list[Path], sizes: dict[str, int], arm: str = "vote", seed: int = 0, aim: float = 0.15
) -> dict[str, dict]:
    """What the fix-loop curve's slope implies, per split, from the cells of every share with results.

    Rate: per patient, the least-squares slope of (confirmed fix at a share − at 0%) against the training
    attempts in that cell's KB, in points per 100 attempts, mean over patients with a 95% bootstrap interval,
    and the KB size a straight line from the 100% point needs for ``aim`` over cold (0 when it is there).
    Steps: env steps per confirmed fix ÷ cold at each share, on the same patients, and the KB size a straight
    line through those points reaches half of cold at (None: it does not fall)."""
    attempts: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    rows = _curve_rows(works, (arm,), lambda split, share, cell: attempts[split][share].append(sizes[cell]))
    out: dict[str, dict] = {}
    for split, by_arm in sorted(rows.items()):
        by = {share: per for (_, share), per in by_arm.items()}
        shares = sorted(by)
        if len(shares) < 2 or 0 not in by:
            continue
        names = sorted(set.intersection(*(set(by[share]) for share in shares)))
        # a split's folds hold different pools (leave one family out): its size at a share is their mean
        size = {share: float(np.mean(attempts[split][share])) for share in shares}
        rate = {
            share: np.array([np.mean([bool(r.get("fixed")) for r in by[share][n]]) for n in names]) for share in shares
        }
        x = np.array([size[share] for share in shares])
        per_patient = np.polyfit(x, np.array([rate[share] - rate[0] for share in shares]), 1)[0] * 100
        lo, hi = bootstrap(per_patient, np.random.default_rng([seed, len(names)]))
        at_full = float((rate[shares[-1]] - rate[0]).mean())
        ratio = [_per_fix([r for n in names for r in by[share][n]]) / _per_fix([r for n in names for r in by[0][n]])
                 for share in shares]  # fmt: skip
        fit = np.polyfit(x, np.array(ratio), 1)[0] * 100 if all(map(math.isfinite, ratio)) else math.nan
        out[split] = {
            "patients": len(names), "shares": shares, "attempts": [size[share] for share in shares],
            "rate_per_100": float(per_patient.mean()), "rate_ci": [lo, hi], "rate_at_full": at_full,
            "attempts_to_aim": _needed(float(per_patient.mean()), x[-1], at_full, aim) if at_full < aim else 0.0,
            "attempts_to_aim_hopeful": _needed(hi, x[-1], at_full, aim) if at_full < aim else 0.0,
            "ratio": ratio, "ratio_per_100": float(fit),
            "attempts_to_half": None if not fit < 0 else float(x[-1] + (ratio[-1] - 0.5) / -fit * 100),
        }  # fmt: skip
    return out


def fix_slope_table(slopes_by_split: dict[str, dict]) -> str:
    """The fix-loop curve's slopes as Markdown (rates in points)."""
    lines = [
        "| split | patients | training attempts in the KB | fix rate − cold at the last, points | slope, points per 100 "
        "attempts [95% CI] | attempts for +15 (mean slope; upper end) | env steps per fix ÷ cold | its change per 100 "
        "attempts | attempts for 0.5x |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def need(v: float | None) -> str:
        return "never" if v is None else "reached" if v == 0 else f"{v:,.0f}"

    for split, s in slopes_by_split.items():
        sizes = " / ".join(f"{a:,.0f}" for a in s["attempts"])
        ratios = " / ".join(f"{r:.2f}" for r in s["ratio"])
        lo, hi = (100 * c for c in s["rate_ci"])
        lines.append(
            f"| {split} | {s['patients']} | {sizes} | {100 * s['rate_at_full']:+.0f} | {100 * s['rate_per_100']:+.1f} "
            f"[{lo:+.1f}, {hi:+.1f}] | {need(s['attempts_to_aim'])}; {need(s['attempts_to_aim_hopeful'])} | {ratios} "
            f"| {s['ratio_per_100']:+.3f} | {need(s['attempts_to_half'])} |"
        )
    return "\n".join(lines) + "\n"


def fix_curve_table(curve: dict[str, list[dict]]) -> str:
    """The fix-loop learning curve as Markdown: one row per split, arm and KB share."""
    lines = [
        "| split | arm | KB share | subsets | patients | confirmed-fix rate [95% CI] | env steps per confirmed fix [95% CI] "
        "| each subset: rate (per fix) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for split, points in curve.items():
        for p in points:
            lo, hi = p["per_fix_ci"]
            per = "-" if math.isinf(p["per_fix"]) else f"{p['per_fix']:,.0f} [{lo:,.0f}, {hi:,.0f}]"
            share = f"{p['share']}%" if p["arm"] not in BASELINE_ARMS else "none (no diagnosis)"
            each = ", ".join(
                f"{b['rate']:.2f} (" + ("-" if math.isinf(b["per_fix"]) else f"{b['per_fix']:,.0f}") + ")"
                for b in p.get("by_subset", [])
            )
            lines.append(
                f"| {split} | {p['arm']} | {share} | {p['subsets']} | {p['patients']} | {p['rate']:.2f} "
                f"[{p['rate_ci'][0]:.2f}, {p['rate_ci'][1]:.2f}] | {per} | {each or '-'} |"
            )
    return "\n".join(lines) + "\n"


def fix_plot(curve: dict[str, list[dict]], path: Path) -> None:
    """Confirmed-fix rate and env steps per confirmed fix against KB share, one row of two panels per split;
    intervals as bars, each random subset's own point as a hollow circle where a share has several, the
    no-diagnosis baselines as dashed lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(curve), 2, figsize=(10, 3.6 * len(curve)), squeeze=False)
    for (rate_ax, steps_ax), (split, points) in zip(axes, curve.items(), strict=True):
        learner = [p for p in points if p["arm"] not in BASELINE_ARMS]
        xs = [p["share"] for p in learner]
        for ax, key, scale in ((rate_ax, "rate", 1.0), (steps_ax, "per_fix", 1e-3)):
            ys = np.array([p[key] * scale for p in learner])
            ci = np.array([[c * scale for c in p[f"{key}_ci"]] for p in learner])
            ax.errorbar(xs, ys, yerr=[ys - ci[:, 0], ci[:, 1] - ys], fmt="-o", capsize=3, label=learner[0]["arm"])
            each = [(p["share"], b[key] * scale) for p in learner for b in p.get("by_subset", [])]
            each = [(x, y) for x, y in each if math.isfinite(y)]
            if each:  # every random subset's own point where a share has several: their spread beside the bars
                ax.scatter(*zip(*each, strict=True), s=22, facecolors="none", edgecolors="tab:blue", zorder=3,
                           label="one random subset")  # fmt: skip
            for p, style in zip([p for p in points if p["arm"] in BASELINE_ARMS], (":", "-."), strict=False):
                ax.axhline(p[key] * scale, linestyle=style, color="grey", label=p["arm"].replace("_", " "))
            ax.set_xlabel("% of training attempts in the KB")
            ax.grid(alpha=0.3)
        cold = next((p for p in learner if p["share"] == 0), None)
        aim = {"color": "tab:red", "linewidth": 0.8}
        if cold is not None and split == "lofo":  # issue 28's aim there: no worse than cold by more than 5 points
            rate_ax.axhline(cold["rate"] - 0.05, label="aim (at least cold − 5 points)", **aim)
        elif cold is not None:  # and on holdout: +15 points of fix rate, half the env steps per fix
            rate_ax.axhline(min(cold["rate"] + 0.15, 1.0), label="aim (cold + 15 points)", **aim)
            steps_ax.axhline(cold["per_fix"] * 0.5 * 1e-3, label="aim (0.5x cold)", **aim)
        for ax in (rate_ax, steps_ax):
            ax.set_xticks([0, 25, 50, 100])
        steps_ax.set_ylim(bottom=0)
        rate_ax.set_ylim(-0.02, 1.02)
        rate_ax.set_ylabel("confirmed-fix rate (95% CI)")
        steps_ax.set_ylabel("thousand env steps per confirmed fix")
        rate_ax.set_title(f"{split}: {learner[0]['patients']} solvable patients")
        rate_ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="*", default=list(SOURCES), help="globs of case files (JSONL / Parquet)")
    ap.add_argument("--seeds", type=int, default=3, help="random subsets at 25 and 50%%")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--plot", type=Path, default=PLOT)
    ap.add_argument("--report-only", action="store_true", help="re-render the tables and plot from --out")
    ap.add_argument("--fix-loops", action="store_true", help="run the real fix loops (hours)")
    ap.add_argument("--fix-report", action="store_true", help="tabulate the fix loops written under --work")
    ap.add_argument(
        "--more-work",
        type=Path,
        nargs="*",
        default=[],
        help="with --fix-report: more --work folders whose cells join the fix-rate curve (e.g. holdout and lofo runs)",
    )
    ap.add_argument(
        "--fix-plot", type=Path, default=None, help="with --fix-report: write the fix-rate curve here (PNG)"
    )
    ap.add_argument(
        "--fix-baselines",
        action="store_true",
        help="run the fixing baselines (tuned defaults, random search) on the cold cells' patients, beside their vote",
    )
    ap.add_argument("--shard", default="0/1", help="i/n: this process takes every n-th fix-loop cell")
    ap.add_argument("--dry-run", action="store_true", help="with --fix-loops: list this shard's cells, run nothing")
    ap.add_argument(
        "--cells", default="*", help="with --fix-loops: only cells matching these globs, e.g. 'lofo-undertrained-*'"
    )
    ap.add_argument(
        "--reverse",
        action="store_true",
        help="with --fix-loops: take the cells, and each cell's patients, last to first (a second process on the same --work meets the first "
        "half-way; finished patients are skipped)",
    )
    ap.add_argument("--work", type=Path, default=Path("bench/out/learning_curve"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--candidates", type=int, default=2)
    ap.add_argument("--fix-seeds", type=int, default=2)
    ap.add_argument("--splits", default="holdout,lofo", help="with --fix-loops: which splits' cells")
    ap.add_argument("--arms", default="vote,ranker", help="with --fix-loops: which arms (vote, ranker)")
    ap.add_argument("--fractions", default=None, help="with --fix-loops: KB sizes in %% of the pool, e.g. 0,100")
    ap.add_argument(
        "--solvable-only", action="store_true", help="with --fix-loops: only patients their oracle fixed (the aim's)"
    )
    ap.add_argument(
        "--cause-credit",
        choices=("patch", "diagnosis"),
        default=OfflineSettings().cause_credit,
        help="the vote's cause credit (default: the shipped one); 'diagnosis' is the vote before the knob",
    )
    args = ap.parse_args()
    VOTE["settings"] = OfflineSettings(cause_credit=args.cause_credit)
    if args.fix_report:
        print(fix_report(args.work))
        curve = fix_curve([args.work, *args.more_work])
        print(fix_curve_table(curve))
        print(fix_slope_table(fix_slopes([args.work, *args.more_work], cell_sizes(args.seeds))))
        if unfinished := partial_table(partial_subsets([args.work, *args.more_work])):
            print(unfinished)
        if args.fix_plot is not None and curve:
            fix_plot(curve, args.fix_plot)
        return
    if args.report_only:  # re-render the table and the plot from the JSON a run wrote
        data = json.loads(args.out.read_text())
        summaries = {s: summarize(p) for s, p in data["per_patient"].items()}
        if "pool_size" not in data:  # a run from before pools were recorded: today's sources, said so
            cases = load(tuple(data.get("sources", args.cases)))
            scenarios = {s.name: s for s in bundled_scenarios()}
            data["pool_size"] = pool_sizes(patients_of(cases, scenarios), attempts_of(cases), scenarios)
            data["pool_size_note"] = f"recomputed from {len(attempts_of(cases))} attempts, not the run's own pool"
        data["slopes"] = {s: slopes(p, data["pool_size"][s]) for s, p in data["per_patient"].items()}
        args.out.write_text(json.dumps({**data, "summary": summaries}, indent=1) + "\n")
        render(summaries, args, data["slopes"], data.get("pool_size_note", ""))
        return
    scenarios = {s.name: s for s in bundled_scenarios()}
    cases = load(tuple(args.cases))
    attempts = attempts_of(cases)
    patients = patients_of(cases, scenarios)
    print(f"{len(cases)} cases, {len(attempts)} attempts, {len(patients)} patients", flush=True)
    if args.fix_loops:
        run_fix_loops(args, patients, attempts, scenarios, cases)
        return
    if args.fix_baselines:
        run_fix_baselines(args, patients, attempts, scenarios)
        return
    retrieval = Retrieval(cases, patients)
    per = {s: run_split(s, patients, attempts, scenarios, retrieval, args.seeds) for s in ("holdout", "lofo")}
    summaries = {s: summarize(p) for s, p in per.items()}
    pools = pool_sizes(patients, attempts, scenarios)
    slope = {s: slopes(p, pools[s]) for s, p in per.items()}
    data = {"cases": len(cases), "attempts": len(attempts), "patients": len(patients), "seeds": args.seeds,
            "sources": args.cases, "summary": summaries, "per_patient": per, "pool_size": pools,
            "slopes": slope}  # fmt: skip
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    render(summaries, args, slope)


def render(summaries: dict, args: argparse.Namespace, slope: dict | None = None, note: str = "") -> None:
    """Write the Markdown tables beside the JSON and the plot, and print the tables."""
    text = "\n".join(table(s, n) for n, s in summaries.items())
    if slope:
        text += "\n" + slope_table(slope) + (f"\nPool sizes: {note}.\n" if note else "")
    args.out.with_suffix(".md").write_text(text)
    plot(summaries, args.plot)
    print(text)


if __name__ == "__main__":
    main()
