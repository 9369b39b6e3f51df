"""Wall-clock latency of quick CLI commands: `remedy --help`, `remedy kb stats`, a first `remedy query`.

Each command runs in a fresh process (as a user would type it), ``--runs`` times, against a KB
made once with `remedy kb init` in a temporary directory. Prints the median and min per command
and the load average before and after, since the machine is shared and timings vary with load.

    .venv/bin/python bench/cli_latency.py [--runs 5] [--json bench/out/cli_latency.json]
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


def _env(kb: Path) -> dict[str, str]:
    env = dict(os.environ, REMEDY_KB=str(kb), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def _time(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(REMEDY + argv, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    return elapsed


def main() -> None:
    """Measure and print the latencies."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        kb = Path(tmp) / "kb"
        env = _env(kb)
        subprocess.run([*REMEDY, "kb", "init"], env=env, check=True, capture_output=True)
        first_id = _first_case_id(env)
        load_before = os.getloadavg()
        results = {}
        for name, argv in COMMANDS.items():
            argv = [a.format(tmp=tmp) for a in argv]
            argv = [first_id if a == "ex-cartpole-lr-too-high" else a for a in argv]
            times = [_time(argv, env) for _ in range(args.runs)]
            results[name] = {"median_s": round(statistics.median(times), 3), "min_s": round(min(times), 3)}
            print(
                f"{name:15s} median {results[name]['median_s']:.2f} s   min {results[name]['min_s']:.2f} s", flush=True
            )
        load_after = os.getloadavg()
    print(
        f"load average (1/5/15 min) before {load_before[0]:.2f}/{load_before[1]:.2f}/{load_before[2]:.2f}, "
        f"after {load_after[0]:.2f}/{load_after[1]:.2f}/{load_after[2]:.2f}; {args.runs} runs each"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {"results": results, "load_before": load_before, "load_after": load_after, "runs": args.runs}, indent=2
            )
        )


def _first_case_id(env: dict[str, str]) -> str:
    proc = subprocess.run(
        [*REMEDY, "query", "pole falls", "--k", "1", "--json"], env=env, check=True, capture_output=True, text=True
    )
    return json.loads(proc.stdout)[0]["case_id"]


if __name__ == "__main__":
    main()
