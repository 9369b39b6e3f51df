"""Crash safety, bounded: two trials of ``bench/serve_crash.py`` (SIGKILL `remedy serve` during imports).

Each trial starts the real service on a free loopback port, streams import
batches, kills it with SIGKILL at a random (seeded) moment after the first
acknowledgement, and reopens the KB as a restart does. The full run
(``bench/serve_crash.py --trials 30``) reports the same counts over more trials.
"""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_sigkill_during_imports_loses_no_acknowledged_import_and_leaves_no_partial_batch(tmp_path, bench_script):
    crash = bench_script("serve_crash")
    args = crash.parse_args(["--max-batches", "150", "--max-delay", "1.5", "--seed", "7"])
    rows, totals = crash.run(2, args, tmp_path)
    assert len(rows) == 2
    assert totals["acked"] > 0, rows  # the service acknowledged imports before it was killed
    assert totals["lost_acked"] == 0, rows
    assert totals["partial"] == 0, rows
    assert totals["index_mismatch"] == 0, rows
