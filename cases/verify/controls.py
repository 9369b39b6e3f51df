"""Shared, cached control arms: one unpatched fine-tune per (checkpoint, config, budget, seed, evaluation).

The control of a verification (same checkpoint, same budget, same training seed, no patch)
is the same computation for every candidate of a fix-loop round, for every later round at
that budget and for every ``remedy verify`` of the same run. Training is deterministic given
the seed (one torch thread per worker), so re-running it buys nothing: the first
verification that needs a control trains it, keeps the trained run directory and the
evaluation results here, and later ones reuse them.

A control is keyed by everything that decides its result: the checkpoint's SHA-256, the
run's configuration (run.yaml), the budget in env steps, the training seed, ``n_envs`` and
the learning-rate override, the evaluation spec (episodes, first episode seed, shifted
variants) and the training code's version (Remedy's version and a hash of the modules that
train and evaluate arms). Change any of them and the key changes; nothing is ever looked up
by a partial match.

Only the reward-hacking test depends on the candidate (the control's return under the
treatment's shaped reward): for a reward patch, a cached control is re-EVALUATED from its
kept checkpoint (episodes only, no training).

Layout: ``<root>/<key>/result.json`` (the :class:`ArmResult` without shaped returns, plus the
key's fields) and ``<root>/<key>/run/`` (the trained control). ``result.json`` is written last
and atomically, so a crash mid-training leaves no entry, only a directory the next run reuses
as scratch.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, replace
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from .arms import ArmResult, ArmSpec, Scores

__all__ = ["ControlCache", "control_key", "start_identity", "code_version", "CODE_MODULES"]

#: modules whose source decides a control's result; their hash is part of every key
CODE_MODULES = ("training.py", "arms.py")


@cache
def code_version() -> str:
    """Remedy's version and a hash of the modules that train and evaluate arms."""
    try:
        remedy = version("remedy")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree without metadata
        remedy = "unknown"
    h = hashlib.sha256(remedy.encode())
    here = Path(__file__).parent
    for name in CODE_MODULES:
        h.update((here / name).read_bytes())
    return f"{remedy}+{h.hexdigest()[:12]}"


def start_identity(run_dir: str | Path) -> str:
    """A content hash of the run directory an arm goes on from (its model and normalization statistics):
    a control that continues another run is the same computation only when it continues the same bytes."""
    h = hashlib.sha256()
    for name in ("model.zip", "vecnormalize.pkl"):
        path = Path(run_dir) / name
        if path.is_file():
            h.update(name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def control_key(spec: ArmSpec, checkpoint_sha256: str, run_config_text: str) -> str:
    """The cache key of the control ``spec`` describes (its patch must be None)."""
    if spec.patch_json is not None:
        raise ValueError("only unpatched (control) arms are shared")
    fields = {
        "checkpoint": checkpoint_sha256,
        "config": hashlib.sha256(run_config_text.encode()).hexdigest(),
        "budget_steps": spec.budget_steps,
        "seed": spec.seed,
        "n_envs": spec.n_envs,
        "learning_rate": spec.learning_rate,
        "eval_episodes": spec.eval_episodes,
        "eval_seed": spec.eval_seed,
        "shifted": [list(s) for s in spec.shifted],
        "code": code_version(),
    }
    if spec.start_dir:  # a control that goes on from an earlier run (a race's stage 1): keyed by that run's files
        fields["after"] = start_identity(spec.start_dir)
        fields["done_steps"] = spec.done_steps
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return "ctl-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _scores(d: dict[str, Any] | None) -> Scores | None:
    if d is None:
        return None
    return Scores(
        returns=tuple(d["returns"]),
        successes=tuple(d["successes"]),
        violations=tuple(d["violations"]),
        nan=bool(d.get("nan", False)),
    )


def _result(d: dict[str, Any]) -> ArmResult:
    return ArmResult(
        arm=d["arm"],
        seed=int(d["seed"]),
        env_steps=int(d["env_steps"]),
        train_wall_s=float(d["train_wall_s"]),
        diverged=bool(d.get("diverged", False)),
        reason=d.get("reason", ""),
        nominal=_scores(d.get("nominal")),
        shifted={k: s for k, v in (d.get("shifted") or {}).items() if (s := _scores(v)) is not None},
        shaped_returns=None,
        shaped_return_train=d.get("shaped_return_train"),
    )


class ControlCache:
    """Trained control arms and their evaluations, on disk under ``root`` (see the module docstring)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()  # controls train in workers, each in its own scratch directory

    def run_dir(self, key: str) -> Path:
        """Where the control of ``key`` is (or will be) trained and kept."""
        return self.root / key / "run"

    def scratch(self, key: str) -> Path:
        """A fresh folder to train the control of ``key`` in (moved into place by :meth:`put`)."""
        self.root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=self.root, prefix=f".train-{key}-"))

    def get(self, key: str) -> ArmResult | None:
        """The cached control of ``key``, or None (never cached, unreadable, or its checkpoint gone)."""
        path = self.root / key / "result.json"
        try:
            data = json.loads(path.read_text())
            result = _result(data["result"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not (self.run_dir(key) / "run.yaml").exists():
            return None  # the kept checkpoint is needed to re-evaluate under a reward patch
        return result

    def put(self, key: str, result: ArmResult, trained_dir: Path) -> None:
        """Keep ``result``, a successful control trained in ``trained_dir`` (a :meth:`scratch`), under ``key``.

        The run directory is moved into place first and ``result.json`` written last, atomically;
        when another process cached the same key meanwhile, its entry is kept and ours dropped.
        """
        if result.diverged or result.nominal is None or not result.nominal.finite:
            shutil.rmtree(trained_dir, ignore_errors=True)
            return  # only clean controls are shared; a failed one is retried next time
        folder = self.root / key
        folder.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(trained_dir, self.run_dir(key))
        except OSError:  # already there (another verification won the race): keep the first
            shutil.rmtree(trained_dir, ignore_errors=True)
            if (folder / "result.json").exists():
                return
        body = {"key": key, "code": code_version(), "result": asdict(replace(result, shaped_returns=None))}
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".result-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(body, f)
        os.replace(tmp, folder / "result.json")

    def keys(self) -> list[str]:
        """Keys of every complete entry."""
        if not self.root.is_dir():
            return []
        return sorted(p.parent.name for p in self.root.glob("ctl-*/result.json"))
