"""Cross-validation on the dev split of the description reports (prints figures; asserts nothing).

Every dev-tuned reader change so far scored better on dev than on held-out reports, so changes
to the description diagnosis are judged here by leave-one-out on dev, never by the dev score they
were fitted on. Two steps:

1. ``records``: each dev report diagnosed once at the shipped settings (tags read, stated
   causes, the vote's cause and family scores), cached in ``bench/out/describe_dev_records.json``;
2. ``loo``: the vote's own ranking against the cause ranker (``remedy.retrieval.cause_ranker``)
   refitted on the other dev reports for each held-out one, top-1 / top-3 side by side, plus the
   error analysis (what was read, what the vote ranked, what the thread said).

Usage: ``.venv/bin/python bench/describe_cv.py [--errors] [--c 1.0] [--refresh]``; ``bench/describe.py
--cv`` runs the same.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import describe as db  # noqa: E402  (bench/describe.py: the KB, embedder and report loading)
import numpy as np  # noqa: E402

from remedy.kb.diagnose import diagnose_description  # noqa: E402
from remedy.kb.facade import KnowledgeBase  # noqa: E402
from remedy.retrieval.cause_ranker import (  # noqa: E402
    CAUSES,
    CauseRanker,
    Evidence,
    evidence_from_report,
    fit_ranker,
)
from remedy.retrieval.describe import SymptomReader  # noqa: E402
from remedy.retrieval.embedder import default_embedder  # noqa: E402
from remedy.retrieval.offline import OfflineDiagnoser  # noqa: E402

CACHE = HERE / "out" / "describe_dev_records.json"


def records(
    reports: list[dict], refresh: bool = False, cache: Path | None = CACHE, kb=None, embedder=None
) -> list[dict]:
    """Each report diagnosed once at the shipped settings, with the ranker's evidence (cached by id in ``cache``).

    ``kb`` and ``embedder`` reuse an open KB of the bundled examples; else a fresh one is made.
    """
    have = json.loads(cache.read_text()) if cache is not None and cache.exists() and not refresh else {}
    todo = [r for r in reports if r["id"] not in have]
    if todo and kb is not None:
        have.update(_diagnose_all(todo, kb, embedder))
    elif todo:
        embedder = db.CachingEmbedder(default_embedder())
        with tempfile.TemporaryDirectory(prefix="remedy-describe-cv-") as tmp:
            base = KnowledgeBase.open(Path(tmp) / "kb", create=True, embedder=embedder)
            base.load_examples()
            have.update(_diagnose_all(todo, db.CachedKB(base), embedder))
            base.close()
    if todo and cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(have, indent=1, sort_keys=True))
    return [{**r, "evidence": Evidence.model_validate(have[r["id"]])} for r in reports]


def _diagnose_all(reports: list[dict], kb, embedder) -> dict[str, dict]:
    reader = SymptomReader(embedder)
    out = {}
    for r in reports:
        rep = diagnose_description(
            kb,
            r["symptom"],
            env_id=r.get("env"),
            algo=r.get("algo"),
            action_space=r.get("action_space"),
            reader=reader,
            diagnoser=OfflineDiagnoser(),
            rules=(),
        )
        out[r["id"]] = evidence_from_report(rep, embedder, r["symptom"]).model_dump(mode="json")
    return out


def _score(ranked: list[list[str]], recs: list[dict]) -> dict[str, float]:
    n = len(recs) or 1
    top1 = sum(bool(c) and c[0] in r["causes"] for c, r in zip(ranked, recs))
    top3 = sum(any(x in r["causes"] for x in c[:3]) for c, r in zip(ranked, recs))
    return {"n": len(recs), "top1": top1 / n, "top3": top3 / n}


def loo(recs: list[dict], c: float = 1.0) -> tuple[dict, dict, list[list[str]]]:
    """(vote scores, ranker scores, ranker rankings): leave-one-out over ``recs``."""
    vote = [r["evidence"].vote_ranking() for r in recs]
    ranked = []
    for i, r in enumerate(recs):
        train = recs[:i] + recs[i + 1 :]
        ranker = fit_ranker([t["evidence"] for t in train], [t["causes"] for t in train], c=c)
        ranked.append(ranker.rank(r["evidence"]))
    return _score(vote, recs), _score(ranked, recs), ranked


#: (neighbours, cosine floor, weight) tried for the vote plus labelled dev neighbours (:func:`knn_nested`).
KNN_GRID = [(k, f, w) for k in (3, 5, 10) for f in (0.2, 0.3) for w in (0.0, 0.1, 0.2, 0.4, 1.0)]


def _knn_rank(i: int, pool: list[int], recs: list[dict], sims: np.ndarray, k: int, floor: float, w: float):
    """Report ``i``'s causes by its vote plus ``w`` x the causes of its ``k`` nearest labelled reports in ``pool``."""
    near = sorted(((sims[i, j], j) for j in pool if j != i), reverse=True)[:k]
    votes: dict[str, float] = {}
    for s, j in near:
        for rank, cause in enumerate(recs[j]["causes"]):
            votes[cause] = votes.get(cause, 0.0) + max(0.0, s - floor) / (1 + rank)
    total = sum(votes.values()) or 1.0
    scores = recs[i]["evidence"].cause_scores
    return sorted(CAUSES, key=lambda c: (-(scores.get(c, 0.0) + w * votes.get(c, 0.0) / total), c))


def knn_nested(recs: list[dict], embedder) -> dict[str, float]:
    """Nested leave-one-out of "the vote plus the causes of the most similar labelled dev reports".

    For each held-out report, (k, floor, weight) is chosen by leave-one-out on the other dev
    reports only, then scored on the held-out one: the estimate includes the choosing.
    """
    vecs = embedder.encode([r["symptom"] for r in recs])
    sims = vecs @ vecs.T
    n, ranked = len(recs), []
    for i in range(n):
        pool = [j for j in range(n) if j != i]
        best = max(KNN_GRID, key=lambda cfg, pool=pool: _inner_score(pool, recs, sims, cfg))
        ranked.append(_knn_rank(i, list(range(n)), recs, sims, *best))
    return _score(ranked, recs)


def _inner_score(pool: list[int], recs: list[dict], sims: np.ndarray, cfg: tuple) -> tuple:
    """Leave-one-out of ``cfg`` within ``pool``: top-1 + top-3 hits, then top-1, then the smaller weight."""
    tops = [_knn_rank(j, pool, recs, sims, *cfg) for j in pool]
    t1 = sum(t[0] in recs[j]["causes"] for t, j in zip(tops, pool))
    t3 = sum(any(c in recs[j]["causes"] for c in t[:3]) for t, j in zip(tops, pool))
    return (t1 + t3, t1, -cfg[2])


def errors(recs: list[dict], ranked: list[list[str]]) -> None:
    """One block per report: labels, tags and stated causes read, the vote's top 3 and the ranker's."""
    for r, mine in zip(recs, ranked):
        ev: Evidence = r["evidence"]
        vote = ev.vote_ranking()
        mark = ("V" if vote[:1] and vote[0] in r["causes"] else "-") + ("R" if mine[0] in r["causes"] else "-")
        print(f"[{mark}] {r['id']}: label {r['causes']}")
        print(f"      tags {ev.tags}  stated {[s for s, _ in ev.stated]}")
        print(f"      vote   {[(c, round(ev.cause_scores.get(c, 0), 2)) for c in vote[:3]]}")
        print(f"      ranker {mine[:3]}")


def report_loo(reports: list[dict], c: float = CauseRanker.DEFAULT_C, show_errors: bool = False, refresh: bool = False):
    """Print the leave-one-out figures on the dev reports of ``reports`` (and the error analysis)."""
    recs = records([r for r in reports if r["split"] == "dev"], refresh=refresh)
    vote, mine, ranked = loo(recs, c=c)
    if show_errors:
        errors(recs, ranked)
    print(f"dev leave-one-out, n={vote['n']} (causes: {len(CAUSES)})")
    print(f"  vote (shipped)          top-1 {vote['top1']:.0%}  top-3 {vote['top3']:.0%}")
    print(f"  cause ranker (C={c:g})   top-1 {mine['top1']:.0%}  top-3 {mine['top3']:.0%}", flush=True)
    knn = knn_nested(recs, default_embedder())
    print(f"  vote + nearest labelled dev reports (nested) top-1 {knn['top1']:.0%}  top-3 {knn['top3']:.0%}")
    return vote, mine, knn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=HERE / "data" / "describe_reports.jsonl")
    ap.add_argument("--c", type=float, default=CauseRanker.DEFAULT_C, help="inverse L2 strength of the ranker")
    ap.add_argument("--errors", action="store_true", help="print the per-report error analysis")
    ap.add_argument("--refresh", action="store_true", help="recompute the cached dev diagnoses")
    args = ap.parse_args()
    report_loo(db.load_reports(args.data), c=args.c, show_errors=args.errors, refresh=args.refresh)


if __name__ == "__main__":
    main()
