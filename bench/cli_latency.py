"""Wall-clock latency of quick CLI commands: `remedy --help`, `remedy kb stats`, a first `remedy query`.

Each command runs in a fresh process (as a user would type it), ``--runs`` times, against a KB
made once with `remedy kb init` in a temporary directory (``--size N`` tops it up with synthetic
cases from ``bench/retrieval_speed.py``). Two arms side by side, interleaved run by run so both see the
same load: ``before`` encodes with sentence-transformers (``REMEDY_EMBEDDER=torch``, what shipped
until the light path), ``after`` with the numpy MiniLM (the default). ``python -c pass`` is the
floor no command can beat. Prints the median and min per command and arm and the load average
before and after, since the machine is shared and timings vary with load.

    .venv/bin/python bench/cli_latency.py [--runs 5] [--size 10000] [--json bench/out/cli_latency.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REMEDY = [str(Path(sys.executable).parent / "remedy")]  # the console script, as a user runs it
COMMANDS = {
    "--help": ["--help"],
    "kb stats": ["kb", "stats"],
    "case show": ["case", "show", "ex-cartpole-lr-too-high"],
    "kb export": ["kb", "export", "{tmp}/out.jsonl"],
    "query (first)": ["query", "pole falls over quickly", "--k", "5"],
}


#: arm -> REMEDY_EMBEDDER
ARMS = {"before": "torch", "after": "numpy"}


def _env(kb: Path, embedder: str = "numpy") -> dict[str, str]:
    env = dict(os.environ, REMEDY_KB=str(kb), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", REMEDY_EMBEDDER=embedder)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def _time(argv: list[str], env: dict[str, str], program: list[str] = REMEDY) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(program + argv, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    return elapsed


def main() -> None:
    """Measure and print the latencies."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--size", type=int, default=0, help="top the KB up to this many cases (synthetic)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        kb = Path(tmp) / "kb"
        subprocess.run([*REMEDY, "kb", "init"], env=_env(kb), check=True, capture_output=True)
        _top_up(kb, args.size)
        first_id = _first_case_id(_env(kb))
        load_before = os.getloadavg()
        floor = [_time(["-c", "pass"], _env(kb), [sys.executable]) for _ in range(args.runs)]
        results: dict[str, dict] = {"python -c pass": {"floor": _stats(floor)}}
        print(f"{'command':15s} " + "   ".join(f"{arm:>22s}" for arm in ARMS), flush=True)
        print(f"{'python -c pass':15s} median {statistics.median(floor):.2f} s (the floor)", flush=True)
        for name, argv in COMMANDS.items():
            argv = [a.format(tmp=tmp) for a in argv]
            argv = [first_id if a == "ex-cartpole-lr-too-high" else a for a in argv]
            times: dict[str, list[float]] = {arm: [] for arm in ARMS}
            for _ in range(args.runs):  # interleaved, so both arms share the machine's load
                for arm, embedder in ARMS.items():
                    times[arm].append(_time(argv, _env(kb, embedder)))
            results[name] = {arm: _stats(ts) for arm, ts in times.items()}
            cells = [f"median {results[name][a]['median_s']:5.2f} s min {results[name][a]['min_s']:5.2f}" for a in ARMS]
            print(f"{name:15s} " + "   ".join(cells), flush=True)
        load_after = os.getloadavg()
    print(
        f"KB: {args.size or 75} cases; load average (1/5/15 min) before {load_before[0]:.2f}/{load_before[1]:.2f}/"
        f"{load_before[2]:.2f}, after {load_after[0]:.2f}/{load_after[1]:.2f}/{load_after[2]:.2f}; {args.runs} runs each"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {"results": results, "load_before": load_before, "load_after": load_after, "runs": args.runs}, indent=2
            )
        )


def _stats(times: list[float]) -> dict[str, float]:
    return {"median_s": round(statistics.median(times), 3), "min_s": round(min(times), 3)}


def _top_up(kb: Path, size: int) -> None:
    """Add synthetic cases (bench/retrieval_speed.py's generator) until the KB holds ``size``."""
    if size <= 75:
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from retrieval_speed import synth_cases

    from remedy.kb import KnowledgeBase

    with KnowledgeBase.open(kb) as db:
        db.add_many(synth_cases(size - 75, seed=size, prefix="lat-"))


def _first_case_id(env: dict[str, str]) -> str:
    proc = subprocess.run(
        [*REMEDY, "query", "pole falls", "--k", "1", "--json"], env=env, check=True, capture_output=True, text=True
    )
    return json.loads(proc.stdout)[0]["case_id"]


if __name__ == "__main__":
    main()
