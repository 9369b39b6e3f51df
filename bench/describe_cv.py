"""Cross-validation on the dev split of the description reports (prints figures; asserts nothing).

Every dev-tuned reader change so far scored better on dev than on held-out reports, so changes
to the description diagnosis are judged here by leave-one-out on dev, never by the dev score they
were fitted on. Two steps:

1. ``records``: each dev report diagnosed once at the shipped settings (tags read, stated
   causes, the vote's cause and family scores), cached in ``bench/out/describe_dev_records.json``;
2. ``loo``: the vote's own ranking against the cause ranker (``remedy.retrieval.cause_ranker``)
   refitted on the other dev reports for each held-out one, top-1 / top-3 side by side, plus the
   error analysis (what was read, what the vote ranked, what the thread said).

3. ``--family-rates``: the family base rates of the labelled reports (the table shipped as
   ``remedy.retrieval.text_priors.REPORT_FAMILY_RATES``) and their weight by nested leave-one-out
   (:func:`family_rate_nested`) over the first three batches and over all four;
4. ``--pool``: the labelled-report neighbour vote (:func:`pool_nested`) by nested leave-one-out over
   every report of the first three batches (dev, holdout, holdout2, holdout3: all seen), causes and
   families; holdout4 stays out.

Usage: ``.venv/bin/python bench/describe_cv.py [--errors] [--c 1.0] [--refresh] [--family-rates | --pool]``;
``bench/describe.py --cv`` runs steps 1-2.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
from describe_kb import CachedKB, CachingEmbedder, load_reports  # noqa: E402  (the KB, embedder and report loading)

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
        embedder = CachingEmbedder(default_embedder())
        with tempfile.TemporaryDirectory(prefix="remedy-describe-cv-") as tmp:
            base = KnowledgeBase.open(Path(tmp) / "kb", create=True, embedder=embedder)
            base.load_examples()
            have.update(_diagnose_all(todo, CachedKB(base), embedder))
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
            diagnoser=OfflineDiagnoser(w_family_base_rate=0.0),  # the vote alone; base rates are weighed here
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


def _neighbour_votes(i: int, pool: list[int], key: str, recs: list[dict], sims: np.ndarray, k: int, floor: float):
    """Normalized votes for ``recs[j][key]`` (causes or families) of report ``i``'s ``k`` nearest reports in ``pool``."""
    near = sorted(((sims[i, j], j) for j in pool if j != i), reverse=True)[:k]
    votes: dict[str, float] = {}
    for s, j in near:
        for rank, label in enumerate(recs[j][key]):
            votes[label] = votes.get(label, 0.0) + max(0.0, s - floor) / (1 + rank)
    total = sum(votes.values()) or 1.0
    return {label: v / total for label, v in votes.items()}


def _knn_rank(i: int, pool: list[int], recs: list[dict], sims: np.ndarray, k: int, floor: float, w: float):
    """Report ``i``'s causes by its vote plus ``w`` x the causes of its ``k`` nearest labelled reports in ``pool``."""
    votes = _neighbour_votes(i, pool, "causes", recs, sims, k, floor)
    scores = recs[i]["evidence"].cause_scores
    return sorted(CAUSES, key=lambda c: (-(scores.get(c, 0.0) + w * votes.get(c, 0.0)), c))


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


#: (neighbours, cosine floor, cause weight, family weight) tried by :func:`pool_nested`.
POOL_GRID = [
    (k, f, w, wf)
    for k in (3, 5, 10, 20)
    for f in (0.1, 0.2, 0.3)
    for w in (0.0, 0.25, 0.5, 1.0, 2.0)
    for wf in (0.0, 0.25, 0.5, 1.0, 2.0)
]
#: the splits :func:`pool_nested` draws on: every batch scored before holdout4
POOL_SPLITS = ("dev", "holdout", "holdout2", "holdout3")


def _pool_hits(i: int, pool: list[int], recs: list[dict], sims: np.ndarray, families: list[str], cfg: tuple):
    """(top-1, top-3, family top-3) hits of report ``i``: its vote (scaled to its best) plus the neighbour votes."""
    k, floor, w, wf = cfg
    ev, r = recs[i]["evidence"], recs[i]
    cs, fs = ev.cause_scores, ev.family_scores
    vc = _neighbour_votes(i, pool, "causes", recs, sims, k, floor)
    vf = _neighbour_votes(i, pool, "families", recs, sims, k, floor)
    tc, tf = max(cs.values(), default=0.0) or 1.0, max(fs.values(), default=0.0) or 1.0
    c = sorted(CAUSES, key=lambda x: (-(cs.get(x, 0.0) / tc + w * vc.get(x, 0.0)), x))
    f = sorted(families, key=lambda x: (-(fs.get(x, 0.0) / tf + wf * vf.get(x, 0.0)), x))
    return (c[0] in r["causes"], any(x in r["causes"] for x in c[:3]), any(x in r["families"] for x in f[:3]))


def pool_nested(recs: list[dict], embedder) -> dict[str, object]:
    """The vote plus the causes and families of the most similar labelled reports, by nested leave-one-out.

    For each held-out report, (k, floor, cause weight, family weight) is chosen on the others by
    their own leave-one-out (sum of the three hit counts, ties to the smaller cause weight), then
    scored on the held-out one. Returns the nested rates, the vote alone and the best in-sample
    setting (which shows how much of a gain is fitting).
    """
    vecs = embedder.encode([r["symptom"] for r in recs])
    sims = vecs @ vecs.T
    families = sorted({f for r in recs for f in r["families"]} | {f for r in recs for f in r["evidence"].family_scores})
    n, every = len(recs), list(range(len(recs)))

    def total(pool: list[int], cfg: tuple) -> np.ndarray:
        return np.array([_pool_hits(j, pool, recs, sims, families, cfg) for j in pool]).sum(0)

    alone = total(every, (5, 0.2, 0.0, 0.0))
    insample = {cfg: total(every, cfg) for cfg in POOL_GRID}
    best_in = max(insample, key=lambda cfg: (insample[cfg].sum(), -cfg[2]))
    hits = []
    for i in range(n):
        pool = [j for j in every if j != i]
        cfg = max(POOL_GRID, key=lambda c, pool=pool: (total(pool, c).sum(), -c[2]))
        hits.append(_pool_hits(i, every, recs, sims, families, cfg))
    rate = lambda h: dict(zip(("top1", "top3", "family_top3"), (float(x) / n for x in h)))  # noqa: E731
    return {
        "n": n,
        "vote": rate(alone),
        "nested": rate(np.array(hits).sum(0)),
        "in_sample_best": rate(insample[best_in]),
        "best": best_in,
    }


#: weights of the family base rates tried by :func:`family_rate_nested`
RATE_WEIGHTS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)


def family_rates(reports: list[dict]) -> dict[str, float]:
    """Each remedy family's share among the reports' families, a report's i-th family weighted 1/i."""
    votes: dict[str, float] = {}
    for r in reports:
        for rank, fam in enumerate(r["families"]):
            votes[fam] = votes.get(fam, 0.0) + 1.0 / (1 + rank)
    total = sum(votes.values()) or 1.0
    return {f: v / total for f, v in sorted(votes.items(), key=lambda kv: (-kv[1], kv[0]))}


def _rate_hit(r: dict, rates: dict[str, float], w: float, families: list[str]) -> bool:
    """Whether one of the first three families (the vote, scaled to its best, plus ``w`` x the rates) is the report's."""
    fs = r["evidence"].family_scores
    top = max(fs.values(), default=0.0) or 1.0
    ranked = sorted(families, key=lambda f: (-(fs.get(f, 0.0) / top + w * rates.get(f, 0.0)), f))
    return any(f in r["families"] for f in ranked[:3])


def family_rate_nested(recs: list[dict]) -> dict[str, object]:
    """Family top-3 with the labelled reports' family base rates added, by nested leave-one-out.

    For each held-out report the rates come from the other reports, and the weight is chosen by
    leave-one-out among them (ties to the smaller weight). Causes are untouched. Returns the vote
    alone, the nested rate, and the in-sample rate of every weight.
    """
    families = sorted({f for r in recs for f in r["families"]} | {f for r in recs for f in r["evidence"].family_scores})
    n = len(recs)
    rates_without = [family_rates(recs[:i] + recs[i + 1 :]) for i in range(n)]

    every = list(range(n))
    insample = {w: sum(_rate_hit(recs[i], rates_without[i], w, families) for i in every) / n for w in RATE_WEIGHTS}
    nested = 0
    for i in every:
        pool = [j for j in every if j != i]
        # each inner report's rates from the rest of the fold, computed once for every weight tried
        inner = [(recs[j], family_rates([recs[k] for k in pool if k != j])) for j in pool]
        w = max(
            RATE_WEIGHTS, key=lambda x, inner=inner: (sum(_rate_hit(r, rates, x, families) for r, rates in inner), -x)
        )
        nested += _rate_hit(recs[i], rates_without[i], w, families)
    return {"n": n, "vote": insample[0.0], "nested": nested / n, "by_weight": insample}


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
    ap.add_argument(
        "--family-rates", action="store_true", help="the family base rates and their weight by nested leave-one-out"
    )
    ap.add_argument(
        "--pool",
        action="store_true",
        help="nested leave-one-out of the labelled-report neighbour vote over the first three batches (about 9 min)",
    )
    args = ap.parse_args()
    if args.family_rates:
        reports = load_reports(args.data)
        print("family base rates, batches 1-4 (REPORT_FAMILY_RATES):")
        for fam, rate in family_rates([r for r in reports if r["split"] != "holdout5"]).items():
            print(f"  {fam:<18} {rate:.3f}")
        for name, splits in (("first three batches", POOL_SPLITS), ("all four batches", (*POOL_SPLITS, "holdout4"))):
            out = family_rate_nested(records([r for r in reports if r["split"] in splits], refresh=args.refresh))
            weights = ", ".join(f"{w:g}: {x:.0%}" for w, x in out["by_weight"].items())
            print(f"{name} (n={out['n']}): family top-3, vote alone {out['vote']:.0%}, with base rates (weight chosen")
            print(f"  inside each fold) {out['nested']:.0%}; each weight, rates from the other reports: {weights}")
        return
    if args.pool:
        reports = [r for r in load_reports(args.data) if r["split"] in POOL_SPLITS]
        out = pool_nested(records(reports, refresh=args.refresh), default_embedder())
        print(f"labelled-report neighbour vote, nested leave-one-out over {out['n']} reports (first three batches)")
        for name in ("vote", "nested", "in_sample_best"):
            x = out[name]
            print(f"  {name:<15} top-1 {x['top1']:.0%}  top-3 {x['top3']:.0%}  family top-3 {x['family_top3']:.0%}")
        print(f"  in-sample best setting (k, floor, cause weight, family weight): {out['best']}")
        return
    report_loo(load_reports(args.data), c=args.c, show_errors=args.errors, refresh=args.refresh)


if __name__ == "__main__":
    main()
