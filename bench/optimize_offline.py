"""Offline tuning on the bench's verified dev cases: scores before/after and what a trial costs.

    .venv/bin/python bench/optimize_offline.py [--cases reports/kb/dev-cases.jsonl] [--trials 100] [--seed 0]

Loads the export into a fresh KB (real embedder, real LanceDB), builds the examples, splits them
by scenario, retrieves once per example (leave-group-out), tunes on train, and prints the
validation scores of the defaults, the tuned settings and a deliberately worse candidate
(k=1, w_prior=0), with the time spent per stage.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from remedy.kb.diagnose import KBRetriever
from remedy.kb.facade import KnowledgeBase
from remedy.optimizer.dataset import build_examples, dev_answer_keys, split_examples
from remedy.optimizer.job import _group_ids, _mirrors
from remedy.optimizer.offline import evaluate, prepare, tune_offline
from remedy.retrieval.offline import OfflineSettings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=Path, default=Path("reports/kb/dev-cases.jsonl"))
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--val-fraction", type=float, default=0.3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        kb = KnowledgeBase.open(Path(tmp) / "kb")
        kb.import_file(args.cases)
        cases = list(kb.cases())
        examples = build_examples(cases, answer_keys=dev_answer_keys({c.scenario for c in cases if c.scenario}))
        train, val = split_examples(examples, val_fraction=args.val_fraction, seed=args.seed)
        t1 = time.perf_counter()
        prepared = prepare(examples, KBRetriever(kb), _group_ids(cases), mirrors=_mirrors(examples))
        t2 = time.perf_counter()
    keys = {e.key for e in train}
    train_p = [p for p in prepared if p.example.key in keys]
    val_p = [p for p in prepared if p.example.key not in keys]
    tuning = tune_offline(train_p, trials=args.trials, seed=args.seed)
    t3 = time.perf_counter()
    worse = OfflineSettings(k=1, w_prior=0.0)
    print(f"cases {len(cases)}, examples {len(examples)} ({sum(e.solved for e in examples)} with a confirmed fix), "
          f"groups {len({e.group for e in examples})}; train {len(train)}, validation {len(val)}")  # fmt: skip
    print(f"load + embed {t1 - t0:.1f} s, retrieval once per example {t2 - t1:.1f} s, "
          f"{tuning.trials} trials {t3 - t2:.1f} s ({(t3 - t2) / tuning.trials * 1000:.0f} ms per trial)")  # fmt: skip
    print(f"train: defaults {tuning.start_score:.3f}, tuned {tuning.train_score:.3f} (best trial {tuning.best_trial})")
    for name, s in (("defaults", OfflineSettings()), ("tuned", tuning.settings), ("worse k=1 w_prior=0", worse)):
        print(f"validation {name}: {evaluate(s, val_p):.3f}   train {evaluate(s, train_p):.3f}")
    changed = {k: v for k, v in tuning.settings.model_dump().items() if v != OfflineSettings().model_dump()[k]}
    print("changed knobs:", {k: round(v, 3) if isinstance(v, float) else v for k, v in changed.items()})


if __name__ == "__main__":
    main()
