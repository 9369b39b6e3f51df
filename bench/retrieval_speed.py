"""Retrieval benchmark: ingest throughput, search latency and recall on synthetic KBs.

Prints figures; it is not a test. For each size it builds a fresh index of synthetic
cases whose signature summaries come from templates over envs, algorithms, symptoms
and numbers (so their embeddings cluster the way real summaries do), then reports:

- ingest cases/s through ``VectorIndex.upsert`` (embedding + write) against the raw
  encoder's sentences/s on the same texts, as a ratio (target >= 0.8);
- p50/p95 latency of embed+search (what ``similar`` pays) and of the search alone
  (target p50 <= 10 ms at 100k);
- recall@10 of the indexed search against an exact numpy scan (target >= 0.95), and
  the exact scan's own latency.

Embedding 100k texts takes many minutes on two cores, so only ``--embed-limit`` texts
are embedded for real; the rest of the table reuses those vectors with small random
perturbations (the output says so).

    nice .venv/bin/python bench/retrieval_speed.py --sizes 10000,100000 --queries 200
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from remedy.cases.model import (
    ActionSpaceType,
    Case,
    Effect,
    EnvTraits,
    Signature,
    Source,
    Status,
    Subject,
    Verification,
)
from remedy.cases.patches.spec import Hyperparameters, Patch
from remedy.retrieval import SearchFilters, VectorIndex, case_text, default_embedder
from remedy.retrieval import index as index_mod

OUT = Path(__file__).parent / "out" / "retrieval.json"

# env id, action space, a noun for the agent
ENVS = [
    ("LunarLander-v3", "discrete", "the lander"),
    ("LunarLanderContinuous-v3", "continuous", "the lander"),
    ("CartPole-v1", "discrete", "the cart-pole"),
    ("Acrobot-v1", "discrete", "the acrobot"),
    ("MountainCar-v0", "discrete", "the car"),
    ("MountainCarContinuous-v0", "continuous", "the car"),
    ("Pendulum-v1", "continuous", "the pendulum"),
    ("BipedalWalker-v3", "continuous", "the walker"),
    ("HalfCheetah-v5", "continuous", "the cheetah"),
    ("Hopper-v5", "continuous", "the hopper"),
]
ALGOS = {"discrete": ["PPO", "A2C", "DQN", "QRDQN"], "continuous": ["PPO", "SAC", "TD3", "TQC", "A2C"]}

# symptom tag -> phrasings; {a} is the agent noun, other fields are filled with numbers.
SYMPTOMS: dict[str, list[str]] = {
    "hovering": [
        "{a} hovers above the goal and runs out the {limit}-step clock in {pct}% of episodes",
        "{a} floats in place instead of finishing; {pct}% of episodes hit the time limit",
    ],
    "timeouts": ["{pct}% of episodes are truncated at {limit} steps", "most episodes end by timeout ({pct}%)"],
    "jerky_actions": [
        "actions flip between the bounds every step (jerk {x:.2f})",
        "bang-bang control: mean action change {x:.2f} of the range",
    ],
    "saturated_actions": ["{pct}% of action components sit at their bounds", "torques saturate {pct}% of the time"],
    "never_succeeds": ["no episode reaches the goal in {n} evaluations", "success rate is zero over {n} episodes"],
    "sparse_signal": ["reward is constant on {pct}% of steps", "the reward signal is almost always {r}"],
    "unstable_learning": [
        "return collapses after {k}k steps and approx_kl peaks at {x:.2f}",
        "the learning curve oscillates wildly between {lo} and {hi}",
    ],
    "collapsed_entropy": [
        "policy entropy fell {pct}% within the first {k}k steps",
        "the policy became deterministic early (entropy {x:.2f})",
    ],
    "premature_convergence": ["return plateaued at {lo} from {k}k steps on", "learning stalled early at return {lo}"],
    "unscaled_observations": [
        "observation magnitudes reach {big}; per-dimension scales differ by 10^{x:.1f}",
        "inputs are unnormalized, values up to {big}",
    ],
    "reward_hacking_suspected": [
        "training reward is {hi} while task success is only {pct}%",
        "reward keeps rising but the task metric does not (correlation {x:.2f})",
    ],
    "early_termination": [
        "{a} falls after {len} steps on average",
        "episodes end early by failure after about {len} steps",
    ],
    "high_variance": ["returns vary from {lo} to {hi} between episodes", "return IQR is {pct}% of the median"],
    "constraint_violations": [
        "{pct}% of steps break the declared safety constraint",
        "the agent leaves the safe region in {pct}% of steps",
    ],
    "poor_generalization": [
        "return drops {pct}% on shifted variants of the env",
        "fails when physics parameters change ({pct}% worse)",
    ],
    "undertrained": [
        "only {k}k training steps and the return is still rising",
        "training stopped at {k}k steps mid-improvement",
    ],
    "numerical_instability": ["NaN appeared in the actions after {k}k steps", "observations contain inf values"],
    "low_coverage": [
        "{a} visits {pct}% of the state grid",
        "exploration covers a small part of the state space ({pct}%)",
    ],
}
TAGS = list(SYMPTOMS)
STATUSES = [Status.improved, Status.no_effect, Status.worse, Status.failed, Status.reward_hacking]


def _fill(template: str, agent: str, rng: np.random.Generator) -> str:
    return template.format(
        a=agent,
        limit=int(rng.choice([200, 500, 1000, 1600])),
        pct=int(rng.integers(5, 100)),
        x=float(rng.uniform(0.01, 3.0)),
        n=int(rng.choice([10, 20, 50])),
        r=int(rng.choice([-1, 0])),
        k=int(rng.integers(10, 2000)),
        lo=int(rng.integers(-500, 100)),
        hi=int(rng.integers(100, 3000)),
        big=int(rng.choice([100, 1000, 10_000, 100_000])),
        len=int(rng.integers(10, 400)),
    )


def synth_summary(rng: np.random.Generator) -> tuple[str, str, str, list[str]]:
    """One realistic summary: (summary, env_id, action space, symptom tags)."""
    env_id, space, agent = ENVS[int(rng.integers(len(ENVS)))]
    algo = str(rng.choice(ALGOS[space]))
    tags = list(rng.choice(TAGS, size=int(rng.integers(1, 4)), replace=False))
    phrases = [_fill(str(rng.choice(SYMPTOMS[t])), agent, rng) for t in tags]
    head = f"{algo} on {env_id} after {int(rng.integers(20, 3000))}k steps: "
    tail = f". Return IQM {int(rng.integers(-800, 3000))}, success {int(rng.integers(0, 100))}%."
    return head + "; ".join(phrases) + tail, env_id, space, [*tags, algo]


def synth_cases(n: int, seed: int, prefix: str) -> list[Case]:
    """``n`` synthetic but valid cases with varied summaries, statuses and effects."""
    rng = np.random.default_rng(seed)
    patch = Patch(parts=[Hyperparameters(changes={"learning_rate": 1e-4})])
    out = []
    for i in range(n):
        summary, env_id, space, tags = synth_summary(rng)
        status = STATUSES[int(rng.integers(len(STATUSES)))]
        diff = float(rng.normal(0, 100))
        effect = Effect(
            metric="return_iqm", treatment=diff, control=0.0, diff=diff, ci_low=diff - 50, ci_high=diff + 50
        )
        out.append(
            Case(
                case_id=f"{prefix}{i}",
                source=Source.bench,
                subject=Subject(
                    env_id=env_id,
                    algo=tags[-1],
                    traits=EnvTraits(action_space=ActionSpaceType(space), obs_dim=8, action_dim=2),
                ),
                signature=Signature(summary=summary, symptoms=tags[:-1]),
                patch=patch,
                verification=Verification(status=status, effect=effect, seeds=2),
                scenario=f"scn-{int(rng.integers(20))}" if rng.random() < 0.2 else None,
            )
        )
    return out


@dataclass
class SizeResult:
    """Figures for one KB size."""

    size: int
    embedded_real: int
    raw_sentences_per_s: float
    ingest_cases_per_s: float
    ingest_ratio: float
    fill_s: float
    optimize_s: float
    ann_index: bool
    queries: int
    embed_search_p50_ms: float
    embed_search_p95_ms: float
    search_p50_ms: float
    search_p95_ms: float
    recall_at_10: float
    filtered_search_p50_ms: float
    filtered_recall_at_10: float
    hybrid_p50_ms: float
    exact_scan_p50_ms: float
    exact_scan_p95_ms: float
    sweep: list[dict[str, float]]


def _timed(fn: Callable[[], object]) -> tuple[object, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs) * 1000.0, q))


def _perturbed(base: np.ndarray, n: int, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` unit vectors near rows of ``base`` (cosine ~0.9 to their source), cycling through it."""
    src = base[np.arange(n) % len(base)]
    x = src + rng.normal(0.0, sigma, size=src.shape).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _ingest(index: VectorIndex, cases: list[Case], batch: int) -> tuple[np.ndarray, float, float]:
    """Upsert ``cases`` in batches; before each, time the raw encoder on the same texts.

    Interleaving keeps both figures under the same machine load (the CPUs are shared).
    """
    vecs, raw_s, ingest_s = [], 0.0, 0.0
    for i in range(0, len(cases), batch):
        chunk = cases[i : i + batch]
        texts = [case_text(c) for c in chunk]
        v, dt = _timed(lambda texts=texts: index.embedder.encode(texts))
        vecs.append(v)
        raw_s += dt
        _, dt = _timed(lambda chunk=chunk: index.upsert(chunk))
        ingest_s += dt
    return np.vstack(vecs), raw_s, ingest_s


def _exact_top(matrix: np.ndarray, q: np.ndarray, k: int, mask: np.ndarray | None = None) -> np.ndarray:
    sims = matrix @ q
    if mask is not None:
        sims = np.where(mask, sims, -np.inf)
    top = np.argpartition(-sims, k)[:k]
    return top[np.argsort(-sims[top])]


def run_size(size: int, args: argparse.Namespace, workdir: Path) -> SizeResult:
    """Build one synthetic KB of ``size`` cases and measure it."""
    emb = default_embedder()
    prefix = f"b{size}-"
    cases = synth_cases(size, seed=args.seed, prefix=prefix)
    real = min(size, args.embed_limit)
    index = VectorIndex(workdir / f"idx{size}", emb)
    emb.encode([case_text(c) for c in cases[:64]])  # warm-up: the first call pays for lazy set-up
    raw_vecs, raw_s, ingest_s = _ingest(index, cases[:real], args.batch)
    vecs = np.asarray(raw_vecs, dtype=np.float32)
    if size > real:
        extra = _perturbed(vecs, size - real, args.sigma, np.random.default_rng(args.seed + 1))
        _, fill_s = _timed(lambda: index.upsert(cases[real:], vectors=extra))
        vecs = np.vstack([vecs, extra])
    else:
        fill_s = 0.0
    _, opt_s = _timed(index.optimize)
    print(f"  [{size:,}] built: {index.count():,} rows, ANN index: {index.has_ann_index()}", flush=True)
    return _measure(size, real, raw_s, ingest_s, fill_s, opt_s, index, vecs, cases, args)


def _ids(hits: list) -> set[int]:
    return {int(h.case_id.split("-")[1]) for h in hits}


def _latencies(fn: Callable[[int], object], n: int) -> tuple[list[object], list[float]]:
    """Call ``fn(i)`` for i in range(n) back to back; return results and wall times."""
    outs, times = [], []
    for i in range(n):
        out, dt = _timed(lambda i=i: fn(i))
        outs.append(out)
        times.append(dt)
    return outs, times


def _measure(size, real, raw_s, ingest_s, fill_s, opt_s, index, vecs, cases, args) -> SizeResult:
    emb = index.embedder
    n = args.queries
    qtexts = [s for s, *_ in (synth_summary(np.random.default_rng(args.seed + 100 + i)) for i in range(n))]
    rng = np.random.default_rng(args.seed + 2)
    envs = [ENVS[int(rng.integers(len(ENVS)))][0] for _ in range(n)]
    env_of = np.array([c.subject.env_id for c in cases])
    # Each figure gets its own loop: torch's threads keep spinning for a while after an
    # encode, and interleaving would charge that to the search on a 2-core machine.
    _, es = _latencies(lambda i: index.search(emb.encode([qtexts[i]])[0], k=10), n)
    qvecs = emb.encode(qtexts)
    hits, s_only = _latencies(lambda i: index.search(qvecs[i], k=10), n)
    tops, exact = _latencies(lambda i: _exact_top(vecs, qvecs[i], 10), n)
    fhits, filt = _latencies(lambda i: index.search(qvecs[i], k=10, filters=SearchFilters(env_id=envs[i])), n)
    _, hyb = _latencies(lambda i: index.search(qvecs[i], k=10, text=qtexts[i], mode="hybrid"), n)
    tops = [set(t.tolist()) for t in tops]
    recalls = [len(_ids(h) & t) / 10 for h, t in zip(hits, tops)]
    ftops = [set(_exact_top(vecs, qvecs[i], 10, env_of == envs[i]).tolist()) for i in range(n)]
    frecalls = [len(_ids(h) & t) / 10 for h, t in zip(fhits, ftops)]
    return SizeResult(
        size=size,
        embedded_real=real,
        raw_sentences_per_s=real / raw_s,
        ingest_cases_per_s=real / ingest_s,
        ingest_ratio=raw_s / ingest_s,
        fill_s=fill_s,
        optimize_s=opt_s,
        ann_index=index.has_ann_index(),
        queries=n,
        embed_search_p50_ms=_pct(es, 50),
        embed_search_p95_ms=_pct(es, 95),
        search_p50_ms=_pct(s_only, 50),
        search_p95_ms=_pct(s_only, 95),
        recall_at_10=float(np.mean(recalls)),
        filtered_search_p50_ms=_pct(filt, 50),
        filtered_recall_at_10=float(np.mean(frecalls)),
        hybrid_p50_ms=_pct(hyb, 50),
        exact_scan_p50_ms=_pct(exact, 50),
        exact_scan_p95_ms=_pct(exact, 95),
        sweep=_sweep(index, qvecs, tops) if args.sweep and index.has_ann_index() else [],
    )


def _sweep(index: VectorIndex, qvecs: list[np.ndarray], tops: list[set[int]]) -> list[dict[str, float]]:
    """Search latency and recall@10 over a small grid of HNSW ``ef`` and ``refine_factor``."""
    out = []
    ef0, rf0 = index.ef, index.refine_factor
    for ef in (80, 160, 320, 480):
        for rf in (None, 2):
            index.ef, index.refine_factor = ef, rf
            times, recalls = [], []
            for q, top in zip(qvecs, tops):
                hits, dt = _timed(lambda q=q: index.search(q, k=10))
                times.append(dt)
                recalls.append(len(_ids(hits) & top) / 10)
            out.append({"ef": ef, "refine": rf or 0, "p50_ms": _pct(times, 50), "recall": float(np.mean(recalls))})
    index.ef, index.refine_factor = ef0, rf0
    return out


def _print_table(results: list[SizeResult], args: argparse.Namespace) -> None:
    rows = [
        ("cases embedded for real", lambda r: f"{r.embedded_real:,}"),
        ("raw encoder sentences/s", lambda r: f"{r.raw_sentences_per_s:.0f}"),
        ("ingest cases/s (upsert)", lambda r: f"{r.ingest_cases_per_s:.0f}"),
        ("ingest / raw (>= 0.8)", lambda r: f"{r.ingest_ratio:.2f}"),
        ("fill (reused vectors)+ANN build s", lambda r: f"{r.fill_s:.1f}"),
        ("optimize afterwards, s", lambda r: f"{r.optimize_s:.1f}"),
        ("ANN index", lambda r: "HNSW-SQ" if r.ann_index else "none (flat)"),
        ("embed+search p50 / p95 ms", lambda r: f"{r.embed_search_p50_ms:.1f} / {r.embed_search_p95_ms:.1f}"),
        ("search p50 / p95 ms (<= 10)", lambda r: f"{r.search_p50_ms:.1f} / {r.search_p95_ms:.1f}"),
        ("recall@10 vs exact (>= 0.95)", lambda r: f"{r.recall_at_10:.3f}"),
        ("filtered (env) search p50 ms", lambda r: f"{r.filtered_search_p50_ms:.1f}"),
        ("filtered recall@10", lambda r: f"{r.filtered_recall_at_10:.3f}"),
        ("hybrid search p50 ms", lambda r: f"{r.hybrid_p50_ms:.1f}"),
        ("numpy exact scan p50 / p95 ms", lambda r: f"{r.exact_scan_p50_ms:.1f} / {r.exact_scan_p95_ms:.1f}"),
    ]
    head = f"{'':32}" + "".join(f"{r.size:>16,}" for r in results)
    print("\n" + head)
    for label, fmt in rows:
        print(f"{label:32}" + "".join(f"{fmt(r):>16}" for r in results))
    for r in results:
        for row in r.sweep:
            print(
                f"  sweep {r.size:>9,}: ef={row['ef']:<4} refine={row['refine']}  p50 {row['p50_ms']:.1f} ms  recall@10 {row['recall']:.3f}"
            )
    print(
        f"\n{args.queries} queries, k=10, ef={index_mod.DEFAULT_EF}, refine_factor={index_mod.DEFAULT_REFINE}, ANN from {index_mod.ANN_MIN_ROWS:,} rows. "
        f"Rows beyond the first {args.embed_limit:,} reuse real embeddings perturbed with sigma={args.sigma} "
        "(cosine ~0.9 to their source); ingest figures cover only the real ones. "
        f"Machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (shared CPUs inflate latencies)."
    )


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run every size, print the table and write the JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10000,100000", help="comma-separated KB sizes")
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--embed-limit", type=int, default=3_000, help="embed at most this many texts for real per size")
    p.add_argument("--batch", type=int, default=256, help="cases per upsert call during ingest")
    p.add_argument("--sigma", type=float, default=0.025, help="per-dimension noise for reused vectors")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sweep", action="store_true", help="also sweep HNSW ef x refine_factor")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    workdir = Path(tempfile.mkdtemp(prefix="remedy-bench-"))
    try:
        results = []
        for size in sizes:
            print(f"building {size:,} cases ...", flush=True)
            results.append(run_size(size, args, workdir))
            _print_table(results[-1:], args)  # partial figures survive an interrupted run
            shutil.rmtree(workdir / f"idx{size}", ignore_errors=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if len(results) > 1:
        _print_table(results, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    config.update(load_avg_1m_end=os.getloadavg()[0], cpus=os.cpu_count())
    config.update(ef=index_mod.DEFAULT_EF, refine_factor=index_mod.DEFAULT_REFINE, ann_min_rows=index_mod.ANN_MIN_ROWS)
    args.out.write_text(json.dumps({"config": config, "results": [asdict(r) for r in results]}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
