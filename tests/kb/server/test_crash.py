"""Crash safety, bounded: two trials of ``bench/serve_crash.py`` (SIGKILL `remedy serve` during imports).

Each trial starts the real service on a free loopback port, streams import
batches, kills it with SIGKILL at a random (seeded) moment after the first
acknowledgement, and reopens the KB as a restart does. The full run
(``bench/serve_crash.py --trials 30``) reports the same counts over more trials.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[3] / "bench" / "serve_crash.py"


def _serve_crash():
    """The bench script as a module (it puts bench/ on sys.path for its own helpers)."""
    spec = importlib.util.spec_from_file_location("remedy_bench_serve_crash", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_sigkill_during_imports_loses_no_acknowledged_import_and_leaves_no_partial_batch(tmp_path):
    crash = _serve_crash()
    args = crash.parse_args(["--max-batches", "150", "--max-delay", "1.5", "--seed", "7"])
    rows, totals = crash.run(2, args, tmp_path)
    assert len(rows) == 2
    assert totals["acked"] > 0, rows  # the service acknowledged imports before it was killed
    assert totals["lost_acked"] == 0, rows
    assert totals["partial"] == 0, rows
    assert totals["index_mismatch"] == 0, rows
