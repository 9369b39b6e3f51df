"""bench/run_split.open_kb: two bench processes opening one cell's KB at once (``--reverse``)."""

from __future__ import annotations

import threading

from remedy.kb.facade import KnowledgeBase


def test_two_openers_at_once_refill_once_and_both_see_the_whole_index(bench_script, tmp_path, corpus_file, capsys):
    run_split = bench_script("run_split")
    path = tmp_path / "vote_kb"
    seen: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    def opener() -> None:
        try:
            kb = run_split.open_kb(path, corpus_file)
            seen.append((kb.count(), kb.index.count()))  # what a first diagnosis would read from
        except BaseException as ex:  # surfaced below: a thread's exception would otherwise vanish
            errors.append(ex)

    threads = [threading.Thread(target=opener) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert seen == [(5, 5), (5, 5)]  # neither reads a half-written store or index
    assert capsys.readouterr().out.count("refilled") == 1
    with KnowledgeBase.open(path) as kb:
        assert kb.count() == kb.index.count() == 5


def test_a_patient_another_process_is_running_is_skipped_not_run_twice(bench_script, tmp_path):
    run_split = bench_script("run_split")
    lock = tmp_path / "vote" / ".cartpole_undertrained.lock"
    # the --reverse process reaching the same patient
    with run_split.claimed(lock) as first, run_split.claimed(lock) as second:
        assert (first, second) == (True, False)
    with run_split.claimed(lock) as after:  # released when the holder ends (or is killed): a resume takes it
        assert after
