"""Derive the offline vote's kernel defaults from the bundled EXAMPLE cases (never from the bench suite).

- ``sim_floor``: the 90th percentile of the cosine similarity between summaries of example
  cases that share no root cause: below it, a neighbour is as close as an unrelated case
  usually is and should carry no weight.
- ``other_env_weight``: how much more often two examples share a cause when they are on the
  same env than on different envs, as the ratio P(shared | other env) / P(shared | same env).
- ``sim_power``: 1 (linear above the floor); nothing here argues for a sharper kernel.

Run: ``.venv/bin/python bench/vote_defaults.py`` (prints the figures; the defaults in
retrieval/offline.py are these, rounded to two digits).
"""

from __future__ import annotations

import itertools
import json
from importlib import resources

import numpy as np

from remedy.retrieval.embedder import default_embedder


def main() -> None:
    folder = resources.files("remedy.cases") / "examples"
    cases = [
        json.loads(line)
        for f in sorted(folder.iterdir())
        if f.name.endswith(".jsonl")
        for line in f.read_text().splitlines()
        if line.strip()
    ]
    x = np.asarray(default_embedder().encode([c["signature"]["summary"] for c in cases]))
    causes = [{d["cause"] for d in c["diagnosis"]["causes"]} for c in cases]
    envs = [c["subject"]["env_id"] for c in cases]
    pairs = list(itertools.combinations(range(len(cases)), 2))
    unrelated = [float(x[i] @ x[j]) for i, j in pairs if not causes[i] & causes[j]]
    shared = {
        k: [bool(causes[i] & causes[j]) for i, j in pairs if (envs[i] == envs[j]) == (k == "same")]
        for k in ("same", "other")
    }
    p_same, p_other = (float(np.mean(shared[k])) for k in ("same", "other"))
    print(f"examples: {len(cases)}, pairs: {len(pairs)}")
    print(
        f"sim_floor = q90 of unrelated-pair cosine = {np.quantile(unrelated, 0.9):.3f} "
        f"(median {np.median(unrelated):.3f}, n={len(unrelated)})"
    )
    print(
        f"other_env_weight = P(shared cause | other env) / P(shared | same env) = {p_other:.3f} / {p_same:.3f} "
        f"= {p_other / p_same:.3f}"
    )
    print("sim_power = 1 (linear)")


if __name__ == "__main__":
    main()
