"""Crash test: `kill -9` imports and fix loops at random moments; no acknowledged case may be lost.

Two kinds of trial, ``--trials`` of each, on one KB:

- import: a child process imports files of ``--cases`` new cases one after another through
  ``KnowledgeBase.import_file`` and prints ``ACK <file>`` each time an import returned; it is
  killed with SIGKILL after a random delay. Every case of an acknowledged file must be stored
  and indexed, and the store must hold all or none of each file's cases (an import is one
  transaction). (A child that loads the embedding model once and imports many files gets
  acknowledgements even on a loaded machine, where the console script's start-up alone can
  outlast the kill delay.)
- fix: a child process runs the fix loop (``remedy.kb.fixloop.fix``) on a shipped patient at a
  tiny budget and prints ``ACK <id>`` each time ``KnowledgeBase.add`` returned; it is killed
  after a random delay. Every acknowledged id must be stored and indexed.

After each kill the KB is opened again (which reconciles the index with the store), and every
case in the store must also be in the index. Prints trials, kills, acknowledged cases and losses.

    .venv/bin/python bench/crash.py [--trials 30] [--seed 0] [--json bench/out/crash.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

REMEDY = str(Path(sys.executable).parent / "remedy")
PATIENT = Path(str(resources.files("remedy.cases") / "scenarios" / "checkpoints" / "cartpole_undertrained"))

_IMPORT_CHILD = """
import sys
from remedy.kb.facade import KnowledgeBase

with KnowledgeBase.open(sys.argv[1]) as kb:
    for path in sys.argv[2:]:
        kb.import_file(path)
        print("ACK", path, flush=True)  # only after the import (store, then index) returned
print("DONE", flush=True)
"""

_FIX_CHILD = """
import sys
from remedy.kb.facade import KnowledgeBase
from remedy.cases.verify.verification import VerifyConfig
from remedy.kb.fixloop import fix, one_torch_thread

class Acking:
    def __init__(self, kb):
        self.kb = kb
    def add(self, case):
        out = self.kb.add(case)
        print("ACK", case.case_id, flush=True)  # only after the store (and index) write returned
        return out

one_torch_thread()
kb_dir, run_dir, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
with KnowledgeBase.open(kb_dir) as kb:
    fix(kb, run_dir, config=VerifyConfig(seeds=1, budget_steps=2000), rounds=2, candidates=1, store=Acking(kb),
        n_episodes=5, seed=seed,
        out_dir=kb_dir + "/fixes")
print("DONE", flush=True)
"""


def _env() -> dict[str, str]:
    return dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")


def _kill_after(proc: subprocess.Popen, delay: float) -> tuple[bool, str]:
    """Wait ``delay`` s, then SIGKILL the process group; (exited on its own first, stdout)."""
    try:
        out, _ = proc.communicate(timeout=delay)
        return proc.returncode == 0, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return False, out


def _import_file(tmp: Path, trial: int, n: int) -> tuple[Path, list[str]]:
    from remedy.cases.io import read_cases, write_cases
    from remedy.kb.facade import example_files

    base = [c for f in example_files() for c in read_cases(f)[0]]
    cases = []
    for i in range(n):
        src = base[i % len(base)]
        sig = src.signature.model_copy(update={"summary": f"{src.signature.summary} (trial {trial}, copy {i})"})
        cases.append(src.model_copy(update={"case_id": f"t{trial}-{i}", "signature": sig}))
    path = tmp / f"import-{trial}.jsonl"
    write_cases(path, cases)
    return path, [c.case_id for c in cases]


def _check(kb_dir: Path, acked: set[str], groups: list[list[str]] | None) -> dict:
    from remedy.kb.facade import KnowledgeBase

    with KnowledgeBase.open(kb_dir) as kb:  # reconciles the index with the store, as any next open does
        stored, indexed = kb.store.ids(), kb.index.ids()
    partial = any(0 < len(stored & set(g)) < len(g) for g in groups or [])
    return {
        "lost_from_store": sorted(acked - stored),
        "lost_from_index": sorted(acked - indexed),
        "stored_not_indexed": sorted(stored - indexed),
        "partial_import": partial,
    }


def import_trials(
    kb_dir: Path, tmp: Path, trials: int, n_cases: int, rng: random.Random, max_delay: float
) -> list[dict]:
    """Kill a process importing files one after another at random moments."""
    out = []
    for t in range(trials):
        files = {}
        for j in range(6):
            path, ids = _import_file(tmp, t * 100 + j, n_cases)
            files[str(path)] = ids
        delay = rng.uniform(1.0, max_delay)
        proc = subprocess.Popen(
            [sys.executable, "-c", _IMPORT_CHILD, str(kb_dir), *files],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=_env(),
            start_new_session=True,
        )
        finished, stdout = _kill_after(proc, delay)
        acked_files = [ln.split(maxsplit=1)[1] for ln in stdout.splitlines() if ln.startswith("ACK ")]
        acked = {i for f in acked_files for i in files[f]}
        res = _check(kb_dir, acked, list(files.values()))
        out.append(
            {
                "kind": "import",
                "trial": t,
                "delay_s": round(delay, 2),
                "finished": finished,
                "acked": len(acked),
                "acked_files": len(acked_files),
                **res,
            }
        )
        print(json.dumps(out[-1]), flush=True)
    return out


def fix_trials(kb_dir: Path, trials: int, rng: random.Random, max_delay: float) -> list[dict]:
    """Kill the fix loop at random moments."""
    out = []
    for t in range(trials):
        delay = rng.uniform(1.0, max_delay)
        proc = subprocess.Popen(
            [sys.executable, "-c", _FIX_CHILD, str(kb_dir), str(PATIENT), str(t)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=_env(),
            start_new_session=True,
        )
        finished, stdout = _kill_after(proc, delay)
        acked = {ln.split()[1] for ln in stdout.splitlines() if ln.startswith("ACK ")}
        res = _check(kb_dir, acked, None)
        out.append(
            {"kind": "fix", "trial": t, "delay_s": round(delay, 2), "finished": finished, "acked": len(acked), **res}
        )
        print(json.dumps(out[-1]), flush=True)
    return out


def summarize(rows: list[dict]) -> dict:
    """Trials, kills, acknowledged cases and losses per kind."""
    summary = {}
    for kind in sorted({r["kind"] for r in rows}):
        rs = [r for r in rows if r["kind"] == kind]
        summary[kind] = {
            "trials": len(rs),
            "killed": sum(not r["finished"] for r in rs),
            "acked": sum(r["acked"] for r in rs),
            "lost_from_store": sum(len(r["lost_from_store"]) for r in rs),
            "lost_from_index": sum(len(r["lost_from_index"]) for r in rs),
            "stored_not_indexed": sum(len(r["stored_not_indexed"]) for r in rs),
            "partial_imports": sum(r["partial_import"] for r in rs),
        }
    return summary


def main() -> None:
    """Run the trials and print the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--cases", type=int, default=150, help="cases per import file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--import-max-delay", type=float, default=20.0)
    parser.add_argument("--fix-max-delay", type=float, default=60.0)
    parser.add_argument("--kinds", default="import,fix", help="which trials: import, fix, or both")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        kb_dir = Path(tmp) / "kb"
        from remedy.kb.facade import KnowledgeBase

        with KnowledgeBase.open(kb_dir) as kb:
            kb.load_examples()
        rows = []
        if "import" in args.kinds:
            rows += import_trials(kb_dir, Path(tmp), args.trials, args.cases, rng, args.import_max_delay)
        if "fix" in args.kinds:
            rows += fix_trials(kb_dir, args.trials, rng, args.fix_max_delay)
    summary = summarize(rows)
    print(json.dumps(summary, indent=2))
    print(f"load average {os.getloadavg()[0]:.1f}; wall {time.time() - start:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"summary": summary, "trials": rows}, indent=2))


if __name__ == "__main__":
    main()
