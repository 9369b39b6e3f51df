"""Executors: run verification jobs (candidate x seed x arm) locally or on Ray, behind one seam.

A :class:`Job` names a function (a callable or an import path ``"pkg.mod:func"``)
and its arguments; an :class:`Executor` runs a batch of jobs and returns one
:class:`JobResult` per job, in job order. Every job runs through
:func:`remedy.cases.patches.worker.run_limited` (CPU, memory and wall-clock limits, a
scratch directory, no network where the OS allows), so a crash, a timeout or
an exception fails that job only and never the batch or the caller.

Executors are looked up by name (:func:`get_executor`): ``local`` (threads that
each drive one limited child process) and ``ray`` (each job a Ray task that
itself calls ``run_limited``, so limits still apply on a cluster).
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import VerificationError
from ..patches.worker import Limits, run_limited

__all__ = [
    "Job",
    "JobResult",
    "Progress",
    "Executor",
    "LocalExecutor",
    "RayExecutor",
    "EXECUTORS",
    "get_executor",
    "resolve",
    "execute_job",
]


@dataclass(frozen=True)
class Job:
    """One unit of work: ``fn(*args, **kwargs)`` under ``limits`` (``None``: the worker's defaults).

    Everything must be picklable: ``fn`` is best an import path or a module-level function.
    """

    id: str
    fn: str | Callable[..., Any]
    kwargs: Mapping[str, Any] = field(default_factory=dict, hash=False)
    limits: Limits | None = None
    args: tuple = ()


@dataclass(frozen=True)
class JobResult:
    """What came back from one job: its value when ``ok``, else a one-line ``error``."""

    id: str
    ok: bool
    value: Any = None
    error: str = ""
    wall_time_s: float = 0.0


#: Called once per finished job, in completion order: ``progress(result, done, total)``.
Progress = Callable[[JobResult, int, int], None]


class Executor(Protocol):
    """Runs jobs; results come back in job order and one job's failure never fails another."""

    def run(self, jobs: Sequence[Job], progress: Progress | None = None) -> list[JobResult]:
        """Run every job and return one result per job, in the order given."""
        ...

    def shutdown(self) -> None:
        """Release what the executor started (worker pools, a local Ray); safe to call twice."""
        ...


def resolve(fn: str | Callable[..., Any]) -> Callable[..., Any]:
    """A callable from an import path (``"pkg.mod:attr"`` or ``"pkg.mod.attr"``), or ``fn`` itself."""
    if callable(fn):
        return fn
    module, sep, attr = fn.partition(":")
    if not sep:
        module, _, attr = fn.rpartition(".")
    if not module or not attr:
        raise VerificationError(f"job function {fn!r} is not an import path; write it as 'package.module:function'")
    obj: Any = importlib.import_module(module)
    for name in attr.split("."):
        obj = getattr(obj, name)
    return obj


def _describe(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")


def execute_job(job: Job) -> JobResult:
    """Run one job through ``run_limited`` in this process's child; never raises for job failures."""
    start = time.monotonic()
    try:
        fn = resolve(job.fn)
        if job.limits is None:
            value = run_limited(fn, *job.args, **dict(job.kwargs))
        else:
            value = run_limited(fn, *job.args, limits=job.limits, **dict(job.kwargs))
    except Exception as err:
        return JobResult(job.id, False, error=_describe(err), wall_time_s=time.monotonic() - start)
    return JobResult(job.id, True, value=value, wall_time_s=time.monotonic() - start)


def _report(progress: Progress | None, result: JobResult, done: int, total: int) -> None:
    if progress is not None:
        progress(result, done, total)


class LocalExecutor:
    """A pool of threads on this machine, each driving one resource-limited child process per job."""

    def __init__(self, max_workers: int | None = None) -> None:
        self.max_workers = max(1, max_workers or os.cpu_count() or 1)

    def run(self, jobs: Sequence[Job], progress: Progress | None = None) -> list[JobResult]:
        """Run ``jobs`` at most ``max_workers`` at a time; results in job order."""
        results: list[JobResult | None] = [None] * len(jobs)
        if not jobs:
            return []
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(jobs))) as pool:
            futures = {pool.submit(execute_job, job): i for i, job in enumerate(jobs)}
            for done, fut in enumerate(as_completed(futures), start=1):
                i = futures[fut]
                results[i] = result = fut.result()
                _report(progress, result, done, len(jobs))
        return [r for r in results if r is not None]

    def shutdown(self) -> None:
        """Nothing to release: each ``run`` opens and closes its own thread pool."""


class RayExecutor:
    """Jobs as Ray tasks (a local Ray, or the cluster at ``address``); each task calls ``run_limited``."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        self.address = address
        self.num_cpus = num_cpus
        self._started = False

    def _ray(self):
        try:
            import ray
        except ImportError as err:
            raise VerificationError("the ray executor needs Ray: pip install 'remedy[ray]'") from err
        if not ray.is_initialized():
            opts: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
            if self.address:
                opts["address"] = self.address
            else:
                opts["num_cpus"] = self.num_cpus or os.cpu_count() or 1
            try:
                ray.init(**opts)
            except Exception as err:
                where = self.address or "a local Ray"
                raise VerificationError(
                    f"could not start or reach {where}: {_describe(err)}; check --ray-address"
                ) from err
            self._started = True
        return ray

    def run(self, jobs: Sequence[Job], progress: Progress | None = None) -> list[JobResult]:
        """Submit every job as a task (one CPU each, no retries); results in job order."""
        if not jobs:
            return []
        ray = self._ray()
        task = ray.remote(num_cpus=1, max_retries=0)(execute_job)
        refs = {task.remote(job): i for i, job in enumerate(jobs)}
        results: list[JobResult | None] = [None] * len(jobs)
        pending, done = list(refs), 0
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            i = refs[ready[0]]
            try:
                result = ray.get(ready[0])
            except Exception as err:
                result = JobResult(jobs[i].id, False, error=_describe(err))
            results[i] = result
            done += 1
            _report(progress, result, done, len(jobs))
        return [r for r in results if r is not None]

    def shutdown(self) -> None:
        """Stop the local Ray this executor started (a no-op for a cluster it only joined)."""
        if self._started:
            import ray

            ray.shutdown()
            self._started = False


#: name -> executor class; a CLI flag picks one.
EXECUTORS: dict[str, type] = {"local": LocalExecutor, "ray": RayExecutor}


def get_executor(name: str, **kwargs: Any) -> Executor:
    """The executor registered as ``name`` (``local`` or ``ray``), built with ``kwargs``."""
    try:
        cls = EXECUTORS[name]
    except KeyError:
        raise VerificationError(f"unknown executor {name!r}; choose one of: {', '.join(sorted(EXECUTORS))}") from None
    return cls(**kwargs)
