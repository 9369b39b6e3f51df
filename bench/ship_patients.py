"""Ship the built patients with the repository, so every machine verifies the same patients.

Training a patient is bit-identical run to run on one machine but not across machines: the same
scenario hash gave a `cartpole_noisy_reward` patient that won 10% of its episodes on one machine and
90% on another. So every scenario's patient is shipped under ``cases/scenarios/checkpoints/<name>/``
(about 8 MB for 55), which :func:`remedy.cases.verify.scenarios.build` finds before any cache.

After changing a scenario (its hash changes, the shipped patient goes stale and is no longer used):

    .venv/bin/remedy bench build --no-oracle --scenarios NAME   # trains it into the cache
    .venv/bin/python bench/ship_patients.py                      # copies stale or missing ones over
"""

from __future__ import annotations

import argparse
import shutil

from remedy.cases.verify.scenarios import CHECKPOINT_DIR, bundled_checkpoint, find_built, load_scenarios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default=None, help="name glob (default: every bundled scenario)")
    ap.add_argument("--cache", default=None, help="build cache to copy from (default ~/.cache/remedy/scenarios)")
    args = ap.parse_args()
    shipped = missing = current = 0
    for s in load_scenarios(args.scenarios):
        if bundled_checkpoint(s) is not None:
            current += 1
            continue
        built = find_built(s, args.cache)
        if built is None:
            print(f"{s.name}: not built; run `remedy bench build --no-oracle --scenarios {s.name}` first")
            missing += 1
            continue
        target = CHECKPOINT_DIR / s.name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(built.run.path, target)
        print(f"{s.name}: shipped ({built.success_rate} success at build)")
        shipped += 1
    print(f"{shipped} shipped, {current} already current, {missing} not built")
    raise SystemExit(1 if missing else 0)


if __name__ == "__main__":
    main()
