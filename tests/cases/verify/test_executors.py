"""Executors: results in job order, and a raising, crashing or hanging job fails only itself.

Job functions are standard-library callables so they import in any child
process (a Ray worker, a spawned interpreter) whatever pytest's import mode.
"""

import pytest

from remedy.cases.errors import RemedyError
from remedy.cases.patches.worker import Limits
from remedy.cases.verify.executors import Job, JobResult, LocalExecutor, RayExecutor, get_executor, resolve

QUICK = Limits(cpu_s=20, memory_mb=1024, wall_s=20)


def _mixed_jobs():
    return [
        Job("add", "operator:add", args=(2, 3), limits=QUICK),
        Job("raises", "operator:truediv", args=(1, 0), limits=QUICK),
        Job("hangs", "time:sleep", args=(60,), limits=Limits(cpu_s=5, memory_mb=1024, wall_s=2)),
        Job("crashes", "os:_exit", args=(3,), limits=QUICK),
        Job("sum", "math.fsum", args=([0.5, 0.25],), limits=QUICK),
    ]


def test_resolve_import_paths():
    import math

    assert resolve("math:fsum") is math.fsum
    assert resolve("math.fsum") is math.fsum
    assert resolve(math.fsum) is math.fsum
    with pytest.raises(RemedyError):
        resolve("fsum")


def test_local_executor_isolates_failures_and_keeps_order():
    seen = []
    results = LocalExecutor(max_workers=2).run(_mixed_jobs(), progress=lambda r, d, t: seen.append((r.id, d, t)))
    assert [r.id for r in results] == ["add", "raises", "hangs", "crashes", "sum"]
    assert all(isinstance(r, JobResult) for r in results)
    ok = {r.id: r for r in results}
    assert ok["add"].ok and ok["add"].value == 5
    assert ok["sum"].ok and ok["sum"].value == 0.75
    assert not ok["raises"].ok and "ZeroDivisionError" in ok["raises"].error
    assert not ok["hangs"].ok and ok["hangs"].error
    assert not ok["crashes"].ok and ok["crashes"].error
    assert sorted(d for _, d, _ in seen) == [1, 2, 3, 4, 5] and {t for *_, t in seen} == {5}


def test_local_executor_with_no_jobs():
    assert LocalExecutor().run([]) == []


def test_unknown_executor_names_the_choices():
    with pytest.raises(RemedyError, match="local, ray"):
        get_executor("dask")
    assert isinstance(get_executor("local", max_workers=1), LocalExecutor)


def test_ray_executor_runs_jobs_with_limits():
    pytest.importorskip("ray")
    ex = get_executor("ray", num_cpus=2)
    assert isinstance(ex, RayExecutor)
    try:
        jobs = [
            Job("add", "operator:add", args=(2, 3), limits=QUICK),
            Job("raises", "math:sqrt", args=(-1.0,), limits=QUICK),
            Job("hangs", "time:sleep", args=(60,), limits=Limits(cpu_s=5, memory_mb=1024, wall_s=2)),
        ]
        results = ex.run(jobs)
    finally:
        ex.shutdown()
    assert [r.id for r in results] == ["add", "raises", "hangs"]
    assert results[0].ok and results[0].value == 5
    assert not results[1].ok and "ValueError" in results[1].error
    assert not results[2].ok
