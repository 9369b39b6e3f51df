"""Crash safety of the fix loop, bounded: one trial of ``bench/crash.py --kinds fix``.

A child process runs the real fix loop (real training at a tiny budget, a real KB) and is
killed with SIGKILL, with every worker it started, right after it acknowledged its first
case. The next open must find that case in the store and in the index. The kill waits for
the acknowledgement line, not for a time, so the trial does not depend on the machine's load.
The full run (``bench/crash.py --kinds fix --trials 30``) kills at random moments.
"""

from __future__ import annotations

import pytest

from remedy.kb.facade import KnowledgeBase


@pytest.mark.slow
def test_sigkill_after_the_first_acknowledged_fix_case_loses_nothing(tmp_path, bench_script):
    crash = bench_script("crash")
    kb_dir = tmp_path / "kb"
    row = crash.fix_trial(kb_dir, trial=0, plan={"target": "ACK", "k": 1, "delay_s": 0.0}, loops=2)
    assert not row["finished"], row  # killed, not exited (a crashed child would have exited)
    assert row["acked"] >= 1, row
    assert row["lost_from_store"] == [] and row["lost_from_index"] == [] and row["unreadable"] == [], row
    assert row["stored_not_indexed"] == [], row
    with KnowledgeBase.open(kb_dir) as kb:
        cases = [kb.get(i) for i in row["acked_ids"]]
        assert all(c.verification is not None and c.verification.env_steps > 0 for c in cases)  # trained attempts
        assert set(row["acked_ids"]) <= kb.index.ids()
