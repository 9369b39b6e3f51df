"""How often the pre-training trajectory check can decide on fault patients (prints figures; asserts nothing).

For each fault-scenario patient that is already built (shipped checkpoints, or
a build cache given with ``--cache``), the patient is COPIED into a scratch
directory and made blind (fault wrappers hidden), its evidence episodes are
rolled out under each candidate reward patch, and two verdicts are printed:

- old: the shaped return must rank successful episodes above failed ones;
  undecidable (and passed) when no episode succeeds or all do;
- new: episodes ordered by Pareto dominance over success, task return,
  progress, the success definition's margin and violations
  (``remedy.cases.verify.arms.trajectory_verdict``).

Candidate reward patches: those the cold offline diagnoser proposes for the
blind patient, plus two fixed probes (``reward - 0.1`` per step, a time cost
that keeps the order, and ``-reward``, which reverses it).

Usage: ``python bench/preference.py [--cache ~/.cache/remedy/scenarios] [--episodes 10] [--json bench/out/preference.json]``
The cache is only read: patients are copied before anything is written.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import torch

PROBES = {
    "probe: time cost (reward - 0.1)": "    return float(reward) - 0.1\n",
    "probe: reversed (-reward)": "    return -float(reward)\n",
}


def _code_patch(body: str):
    from remedy.cases.patches import Patch

    return Patch.from_data(
        {
            "kind": "reward_shaping",
            "code": ("def shaped_reward(obs, action, reward, next_obs, terminated, truncated, info):\n" + body),
        }
    )


def _patients(cache: Path | None, scratch: Path):
    """(scenario, blind RunDir copy) for every scenario whose build exists; nothing is trained."""
    from remedy.cases.evidence.rundir import RunDir, write_run_yaml
    from remedy.cases.verify.scenarios import CHECKPOINT_DIR, load_scenarios, scenario_hash

    for s in load_scenarios():
        found = [CHECKPOINT_DIR / s.name]
        if cache is not None:
            found.append(cache / f"{s.name}-{scenario_hash(s)}")
        src = next((p for p in found if (p / "model.zip").is_file()), None)
        if src is None:
            continue
        dst = scratch / s.name
        shutil.copytree(src, dst)
        try:
            cfg = RunDir.load(dst).config
        except Exception as ex:  # a build written by another Remedy version: report and go on
            print(f"skipping {s.name}: {ex}")
            continue
        write_run_yaml(dst, cfg.model_copy(update={"wrappers": s.run_config().wrappers, "notes": "bench patient"}))
        yield s, RunDir.load(dst)


def _candidates(run) -> list[tuple[str, object]]:
    from remedy.kb.diagnose import diagnose_run

    report = diagnose_run(None, run, diagnoser="offline", n_episodes=5, seed=0)
    out = [
        (f"diagnoser: {c.patch.summary()}"[:70], c.patch)
        for c in report.candidates
        if any(p.kind == "reward_shaping" for p in c.patch.parts)
    ]
    return out + [(name, _code_patch(body)) for name, body in PROBES.items()]


def _verdicts(run, patch, episodes: int, seed: int) -> tuple[str, str, float | None]:
    from remedy.cases.verify.arms import preference_verdict, replay_under_reward, task_measures, trajectory_verdict

    recs = replay_under_reward(run, patch, episodes, seed)
    old = preference_verdict([r.train_ret for r in recs if r.success], [r.train_ret for r in recs if not r.success])
    new = trajectory_verdict([task_measures(r) for r in recs], [r.train_ret for r in recs])
    return old.status, new.status, new.prob


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=None, help="a `remedy bench build` cache to read patients from")
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--seed", type=int, default=10_000)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="remedy-pref-") as tmp:
        for s, run in _patients(args.cache.expanduser() if args.cache else None, Path(tmp)):
            for name, patch in _candidates(run):
                old, new, agree = _verdicts(run, patch, args.episodes, args.seed)
                rows.append({"scenario": s.name, "patch": name, "old": old, "new": new, "agreement": agree})
                a = "-" if agree is None else f"{agree:.2f}"
                print(f"{s.name:28s} {name:72s} old={old:11s} new={new:11s} agreement={a}", flush=True)
    old_counts, new_counts = Counter(r["old"] for r in rows), Counter(r["new"] for r in rows)
    print(f"\n{len(rows)} reward patches on {len({r['scenario'] for r in rows})} patients")
    print("old check:", dict(old_counts))
    print("new check:", dict(new_counts))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows, "old": old_counts, "new": new_counts}, indent=2) + "\n")


if __name__ == "__main__":
    main()
