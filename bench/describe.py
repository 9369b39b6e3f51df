"""How well `remedy diagnose --describe` reads real public failure reports (prints figures; asserts nothing).

Data: ``bench/data/describe_reports.jsonl`` (41 public RL failure reports, symptom text only, each
with the root causes and remedy families its thread settled on, and a fixed dev/holdout split; see
``bench/data/README.md``). The KB is a fresh one holding the bundled example cases only.

Scores, per split:
- top-1: the first root cause is one of the report's causes; top-3: one of the first three is;
- family top-3: one of the first three candidate patches' families is one of the report's families.

Methods:
- ``describe``: ``diagnose_description`` (text -> tags, offline vote of priors and cases retrieved by
  the text) with the env / algorithm / action space the report names;
- ``describe (tags only)`` and ``describe (cases only)``: the same with retrieval off, or with no tags;
- ``query baseline``: what ``remedy query "TEXT"`` gives a new user: the nearest case's root cause
  (top-3: the first causes of the three nearest cases), and the three nearest cases' patch families;
- ``most frequent``: the most frequent causes and families on dev.

The reader's threshold and margin and the offline diagnoser's ``text_sim_floor`` are chosen on the
dev split only (grid search on top-1 + top-3 + family top-3); holdout figures use the chosen values.

Usage: ``.venv/bin/python bench/describe.py [--data PATH] [--out bench/out/describe.json]``
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

for _k, _v in (
    ("HF_HUB_OFFLINE", "1"),
    ("TRANSFORMERS_OFFLINE", "1"),
    ("TOKENIZERS_PARALLELISM", "false"),
    ("LITELLM_LOCAL_MODEL_COST_MAP", "True"),
):
    os.environ.setdefault(_k, _v)

import numpy as np  # noqa: E402

from remedy.cases.model import Signature  # noqa: E402
from remedy.kb.diagnose import diagnose_description  # noqa: E402
from remedy.kb.facade import KnowledgeBase  # noqa: E402
from remedy.retrieval.describe import (  # noqa: E402
    DEFAULT_MARGIN,
    DEFAULT_MAX_TAGS,
    DEFAULT_THRESHOLD,
    SymptomReader,
)
from remedy.retrieval.embedder import default_embedder  # noqa: E402
from remedy.retrieval.index import signature_text  # noqa: E402
from remedy.retrieval.offline import OfflineDiagnoser  # noqa: E402

HERE = Path(__file__).resolve().parent
THRESHOLDS = (0.45, 0.50, 0.55, 0.60)
MARGINS = (0.05, 0.15)
TEXT_FLOORS = (0.3, 0.45)
_DIAGNOSES: dict[tuple, tuple[list[str], list[str]]] = {}


class CachingEmbedder:
    """The bundled embedder with a per-text memo: the grid re-reads the same clauses many times."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.dim = inner, inner.name, inner.dim
        self._memo: dict[str, np.ndarray] = {}

    def encode(self, texts):
        missing = [t for t in dict.fromkeys(texts) if t not in self._memo]
        if missing:
            for t, v in zip(missing, self.inner.encode(missing)):
                self._memo[t] = v
        return np.stack([self._memo[t] for t in texts]) if texts else self.inner.encode([])


class CachedKB:
    """A KB whose ``similar`` answers are memoized (same query, same filters, same hits)."""

    def __init__(self, kb: KnowledgeBase) -> None:
        self.kb = kb
        self._memo: dict[tuple, list] = {}

    def similar(self, query, **kw):
        text = signature_text(query) if isinstance(query, Signature) else str(query)
        key = (text, tuple(sorted((k, str(v)) for k, v in kw.items())))
        if key not in self._memo:
            self._memo[key] = self.kb.similar(query, **kw)
        return self._memo[key]


def load_reports(path: Path) -> list[dict]:
    """The reports, one dict per JSONL line."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def score(rows: list[tuple[list[str], list[str], dict]]) -> dict[str, float]:
    """top-1 / top-3 cause and family-in-top-3 rates over (ranked causes, ranked families, report)."""
    n = len(rows) or 1
    top1 = sum(bool(c[:1]) and c[0] in r["causes"] for c, _, r in rows)
    top3 = sum(any(x in r["causes"] for x in c[:3]) for c, _, r in rows)
    fam3 = sum(any(x in r["families"] for x in f[:3]) for _, f, r in rows)
    return {"n": len(rows), "top1": top1 / n, "top3": top3 / n, "family_top3": fam3 / n}


def run_describe(kb, reports, reader, floor: float, k: int = 10, no_tags: bool = False) -> list:
    """(causes, families, report) for each report, diagnosed from its symptom text."""
    diag = OfflineDiagnoser(text_sim_floor=floor)
    rows = []
    for r in reports:
        tags = () if no_tags else tuple(x.tag for x in reader.read(r["symptom"]))
        key = (r["id"], tags, floor, k)  # grid points that read the same tags give the same diagnosis
        if key not in _DIAGNOSES:
            rep = diagnose_description(
                kb,
                r["symptom"],
                env_id=r.get("env"),
                algo=r.get("algo"),
                action_space=r.get("action_space"),
                tags=list(tags),
                diagnoser=diag,
                k=k,
            )
            _DIAGNOSES[key] = (
                [c.cause.value for c in rep.diagnosis.causes if c.cause.value != "unknown"],
                _unique([c.family.value for c in rep.candidates]),
            )
        rows.append((*_DIAGNOSES[key], r))
    return rows


def run_query(kb, reports) -> list:
    """The `remedy query TEXT` baseline: what the nearest three cases say."""
    rows = []
    for r in reports:
        hits = kb.similar(r["symptom"], k=3, mode="hybrid")
        causes = _unique(
            [h.case.diagnosis.causes[0].cause.value for h in hits if h.case.diagnosis and h.case.diagnosis.causes]
        )
        fams = _unique([h.case.patch.parts[0].kind for h in hits])
        rows.append((causes, fams, r))
    return rows


def run_frequent(dev, reports) -> list:
    """The most-frequent baseline: dev's commonest first causes and families, for every report."""
    causes = [c for c, _ in Counter(r["causes"][0] for r in dev).most_common()]
    fams = [f for f, _ in Counter(f for r in dev for f in r["families"]).most_common()]
    return [(causes[:3], fams[:3], r) for r in reports]


def _unique(items):
    return list(dict.fromkeys(items))


def tune(kb, embedder, dev) -> tuple[dict, list]:
    """Grid search on dev; returns the best settings and every grid point's dev score."""
    grid = []
    for thr, margin, floor in itertools.product(THRESHOLDS, MARGINS, TEXT_FLOORS):
        reader = SymptomReader(embedder, threshold=thr, margin=margin, max_tags=DEFAULT_MAX_TAGS)
        s = score(run_describe(kb, dev, reader, floor))
        grid.append({"threshold": thr, "margin": margin, "text_sim_floor": floor, **s})
        print(
            f"dev grid {len(grid):>2}: threshold {thr} margin {margin} floor {floor}: top-1 {s['top1']:.0%} "
            f"top-3 {s['top3']:.0%} family top-3 {s['family_top3']:.0%}",
            flush=True,
        )
    best = max(grid, key=lambda g: (round(g["top1"] + g["top3"] + g["family_top3"], 6), g["top1"]))
    return best, grid


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=HERE / "data" / "describe_reports.jsonl")
    ap.add_argument("--out", type=Path, default=HERE / "out" / "describe.json")
    args = ap.parse_args()

    reports = load_reports(args.data)
    dev = [r for r in reports if r["split"] == "dev"]
    hold = [r for r in reports if r["split"] == "holdout"]
    embedder = CachingEmbedder(default_embedder())
    with tempfile.TemporaryDirectory(prefix="remedy-describe-bench-") as tmp:
        base = KnowledgeBase.open(Path(tmp) / "kb", create=True, embedder=embedder)
        base.load_examples()
        kb = CachedKB(base)
        best, grid = tune(kb, embedder, dev)
        chosen = SymptomReader(embedder, threshold=best["threshold"], margin=best["margin"])
        default = SymptomReader(embedder, threshold=DEFAULT_THRESHOLD, margin=DEFAULT_MARGIN)
        table: dict[str, dict[str, dict]] = {}
        for split, rs in (("dev", dev), ("holdout", hold)):
            table.setdefault("describe (dev-tuned)", {})[split] = score(
                run_describe(kb, rs, chosen, best["text_sim_floor"])
            )
            table.setdefault("describe (shipped defaults)", {})[split] = score(
                run_describe(kb, rs, default, OfflineDiagnoser().text_sim_floor)
            )
            table.setdefault("describe, tags only (no retrieval)", {})[split] = score(
                run_describe(kb, rs, chosen, best["text_sim_floor"], k=0)
            )
            table.setdefault("describe, cases only (no tags)", {})[split] = score(
                run_describe(kb, rs, chosen, best["text_sim_floor"], no_tags=True)
            )
            table.setdefault("query baseline (nearest cases)", {})[split] = score(run_query(kb, rs))
            table.setdefault("most frequent on dev", {})[split] = score(run_frequent(dev, rs))
        base.close()
    _print(best, table, len(dev), len(hold))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "chosen_on_dev": best,
                "defaults": {
                    "threshold": DEFAULT_THRESHOLD,
                    "margin": DEFAULT_MARGIN,
                    "text_sim_floor": OfflineDiagnoser().text_sim_floor,
                },
                "table": table,
                "grid": grid,
            },
            indent=2,
        )
    )
    print(f"wrote {args.out}")


def _print(best: dict, table: dict, n_dev: int, n_hold: int) -> None:
    print(
        f"chosen on dev ({n_dev} reports): threshold {best['threshold']}, margin {best['margin']}, "
        f"text_sim_floor {best['text_sim_floor']}"
    )
    head = f"{'method':<38} {'split':<8} {'n':>3} {'top-1':>6} {'top-3':>6} {'family top-3':>13}"
    print(head)
    print("-" * len(head))
    for method, splits in table.items():
        for split in ("holdout", "dev"):
            s = splits[split]
            print(f"{method:<38} {split:<8} {s['n']:>3} {s['top1']:>6.0%} {s['top3']:>6.0%} {s['family_top3']:>13.0%}")


if __name__ == "__main__":
    main()
