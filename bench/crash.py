"""Crash test: `kill -9` imports and fix loops at random moments; no acknowledged case may be lost.

Two kinds of trial, ``--trials`` of each, on one KB:

- import: a child process imports files of ``--cases`` new cases one after another through
  ``KnowledgeBase.import_file`` and prints ``ACK <file>`` each time an import returned; it is
  killed with SIGKILL after a random delay. Every case of an acknowledged file must be stored
  and indexed, and the store must hold all or none of each file's cases (an import is one
  transaction). (A child that loads the embedding model once and imports many files gets
  acknowledgements even on a loaded machine, where the console script's start-up alone can
  outlast the kill delay.)
- fix: a child process loads the KB once and runs fix loops back to back
  (``remedy.kb.fixloop.fix``, real training, real KB) on a shipped patient at a tiny budget
  (one seed, two rounds of one candidate, a few hundred env steps), each loop on fresh
  training seeds so each stores new cases. Around ``KnowledgeBase.add`` it prints ``ADD
  <id>``, ``STORED <id>`` (the store write returned, the index write follows) and ``ACK
  <id>`` (add returned). Each trial draws when to kill: a random time after start, or a
  random moment after the k-th (first or second) training batch, ``ADD``, ``STORED`` or ``ACK`` line (so kills
  land during training, inside the store or index write, and between adds); the whole
  process tree (training workers too) gets SIGKILL. The phase the kill landed in is read
  from the child's last line. Every acknowledged id must be stored, readable and indexed.

After each kill the KB is opened again (which reconciles the index with the store), and every
case in the store must also be in the index. Prints trials, kills, acknowledged cases and losses.

    .venv/bin/python bench/crash.py [--trials 30] [--seed 0] [--json bench/out/crash.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
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
from remedy.cases.verify.executors import get_executor
from remedy.cases.verify.verification import VerifyConfig
from remedy.kb.facade import KnowledgeBase
from remedy.kb.fixloop import fix, one_torch_thread


def say(*words):
    print(*words, flush=True)


class Acking:
    # KnowledgeBase.add is add_many([case]); its progress hook fires first once the store write returned
    def __init__(self, kb):
        self.kb = kb

    def add(self, case):
        marks = []

        def stored(done, total):
            if not marks:
                marks.append(done)
                say("STORED", case.case_id)

        say("ADD", case.case_id)
        out = self.kb.add_many([case], progress=stored).added == 1
        say("ACK", case.case_id)  # only after the store and index writes returned
        return out


def step(message, done, total):
    say("STEP", done, total, message)


one_torch_thread()
kb_dir, run_dir, trial, loops = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with KnowledgeBase.open(kb_dir) as kb:
    say("OPEN")
    executor = get_executor("local")
    for i in range(loops):
        # fresh training seeds per loop: new case ids, no control arm reused from the cache
        config = VerifyConfig(seeds=1, budget_steps=512, eval_episodes=3, n_envs=2, seed_base=1000 * trial + 10 * i)
        say("LOOP", i)
        fix(kb, run_dir, store=Acking(kb), config=config, executor=executor, rounds=2, candidates=1,
            n_episodes=3, seed=trial, progress=step, out_dir=kb_dir + "/fixes")
    executor.shutdown()
say("DONE")
"""

#: what a fix trial waits for before its kill: (line kind, max extra delay in s) — the store and index
#: writes take a fraction of a second, so their kills follow within it; training takes seconds
_FIX_TARGETS = {"ADD": 0.3, "STORED": 0.2, "ACK": 8.0, "TRAIN": 6.0}


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


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (Linux /proc): training workers run in their own sessions."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited while we looked
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the child and everything it started: stopped first, so it cannot start more meanwhile."""
    try:
        os.killpg(proc.pid, signal.SIGSTOP)
        below = _descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    for pid in below:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)  # a worker leads its own process group


def _reader(proc: subprocess.Popen) -> queue.Queue:
    """A queue fed with the child's stdout lines (None at EOF)."""
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _is_training(line: str) -> bool:
    """A progress line that starts a batch of training jobs ("...: 2 jobs"), or one job of it done, not all."""
    if not line.startswith("STEP "):
        return False
    _, done, total, _ = line.split(" ", 3)
    return line.endswith(" jobs") or 0 < int(done) < int(total)


def _draw_kill(rng: random.Random, max_delay: float, after_ack: bool = False) -> dict:
    """When this trial kills: ``timer`` seconds after start, or a random moment after the k-th target line.

    ``after_ack``: no timer, and the second training batch, ``ADD`` or ``STORED`` line (the first
    add was acknowledged), so that on a loaded machine every trial has a case to lose.
    """
    target = rng.choice(list(_FIX_TARGETS) if after_ack else ["timer", *_FIX_TARGETS])
    if target == "timer":
        return {"target": "timer", "k": 0, "delay_s": round(rng.uniform(5.0, max_delay), 2)}
    k = 2 if after_ack and target != "ACK" else rng.randint(1, 2)
    return {"target": target, "k": k, "delay_s": round(rng.uniform(0.0, _FIX_TARGETS[target]), 3)}


def _matches(target: str, line: str) -> bool:
    return _is_training(line) if target == "TRAIN" else line.startswith(target + " ")


def _run_until_kill(proc: subprocess.Popen, plan: dict, timeout: float) -> tuple[bool, list[str]]:
    """Follow the child's output, kill it as ``plan`` says (or at ``timeout``); (exited on its own, lines)."""
    lines, out, seen = _reader(proc), [], 0
    start = time.monotonic()
    deadline = start + (plan["delay_s"] if plan["target"] == "timer" else timeout)
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:  # the child exited before the kill
            proc.wait()
            return True, out
        out.append(line)
        if plan["target"] != "timer" and _matches(plan["target"], line):
            seen += 1
            if seen == plan["k"]:
                deadline = min(time.monotonic() + plan["delay_s"], start + timeout)
    _kill_tree(proc)
    proc.wait()
    while (line := lines.get()) is not None:  # what the child printed before it died
        out.append(line)
    return False, out


#: where a kill landed, by the child's last line before it (a STEP line is looked at further)
_PHASES = {
    "": "opening the KB",
    "OPEN": "fix loop (diagnosis, evaluation)",
    "LOOP": "fix loop (diagnosis, evaluation)",
    "STEP": "fix loop (diagnosis, evaluation)",
    "ADD": "store write",
    "STORED": "index write",
    "ACK": "after an add",
    "DONE": "done",
}


def _phase(lines: list[str]) -> str:
    """Where the kill landed, from the child's last line."""
    last = next((ln for ln in reversed(lines) if ln.split(" ", 1)[0] in _PHASES), "")
    if _is_training(last):
        return "training"
    return _PHASES[last.split(" ", 1)[0]]


def _ids(lines: list[str], kind: str) -> set[str]:
    return {ln.split()[1] for ln in lines if ln.startswith(kind + " ")}


def fix_trial(kb_dir: Path, trial: int, plan: dict, loops: int = 8, timeout: float = 600.0) -> dict:
    """One fix trial: start the child, kill it as ``plan`` says (:func:`_draw_kill`), reopen and check the KB.

    ``trial`` also picks the child's training seeds; ``timeout`` (s) bounds a wait for a target line.
    """
    from remedy.kb.facade import KnowledgeBase

    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", _FIX_CHILD, str(kb_dir), str(PATIENT), str(trial), str(loops)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=_env(),
            start_new_session=True,
        )
        finished, lines = _run_until_kill(proc, plan, timeout)
        err.seek(0)
        stderr_tail = err.read()[-500:] if finished and proc.returncode else ""
    acked, added = _ids(lines, "ACK"), _ids(lines, "ADD")
    res = _check(kb_dir, acked, None)
    with KnowledgeBase.open(kb_dir, reconcile=False) as kb:
        readable = {c.case_id for c in kb.store.get_many(sorted(acked))}
        stored = kb.store.ids()
    return {
        "kind": "fix",
        "trial": trial,
        **plan,
        "phase": _phase(lines),
        "last_line": lines[-1][:160] if lines else "",
        "finished": finished,
        "acked": len(acked),
        "acked_ids": sorted(acked),
        "stored_unacked": len((added - acked) & stored),  # store write done, killed before the ACK
        "unreadable": sorted(acked - readable),
        **res,
        **({"stderr": stderr_tail} if stderr_tail else {}),
    }


def fix_trials(
    kb_dir: Path, trials: int, rng: random.Random, max_delay: float, loops: int = 8, after_ack: bool = False
) -> list[dict]:
    """Kill processes running fix loops back to back at random moments (see the module docstring)."""
    out = []
    for t in range(trials):
        plan = _draw_kill(rng, max_delay, after_ack)
        out.append(fix_trial(kb_dir, t, plan, loops, timeout=max(max_delay, 600.0)))
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
        if kind == "fix":
            summary[kind] |= {
                "trials_with_acks": sum(r["acked"] > 0 for r in rs),
                "unreadable": sum(len(r["unreadable"]) for r in rs),
                "stored_unacked": sum(r["stored_unacked"] for r in rs),
                "kills_by_phase": dict(sorted(Counter(r["phase"] for r in rs if not r["finished"]).items())),
            }
    return summary


def main() -> None:
    """Run the trials and print the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--cases", type=int, default=150, help="cases per import file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--import-max-delay", type=float, default=20.0)
    parser.add_argument("--fix-max-delay", type=float, default=90.0, help="longest timer kill of a fix trial (s)")
    parser.add_argument("--fix-loops", type=int, default=8, help="fix loops a fix trial's child runs at most")
    parser.add_argument(
        "--fix-after-ack", action="store_true", help="fix kills only after the child's first acknowledged case"
    )
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
            rows += fix_trials(kb_dir, args.trials, rng, args.fix_max_delay, args.fix_loops, args.fix_after_ack)
    summary = summarize(rows)
    print(json.dumps(summary, indent=2))
    if "fix" in summary:
        fx = summary["fix"]
        with_acks, trials, acked = fx["trials_with_acks"], fx["trials"], fx["acked"]
        print(f"fix: {with_acks} of {trials} trials acknowledged at least one case, {acked} in all")
        if 2 * with_acks <= trials:
            print("WARNING: most fix trials acknowledged nothing: raise --fix-max-delay or lower the load")
    print(f"load average {os.getloadavg()[0]:.1f}; wall {time.time() - start:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"summary": summary, "trials": rows}, indent=2))


if __name__ == "__main__":
    main()
