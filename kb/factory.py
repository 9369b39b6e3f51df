"""The case factory: the fix loop over the patient zoo, resumable and sharded, its cases shipped in chunks.

Each *unit* is one patient (a bench scenario) on one *pass*: the fix loop (:func:`remedy.kb.bench.run_bench`,
cold diagnoses, attempts stored as ``bench`` cases) with pass ``p`` screening on training seeds from
``p * PASS_SEED_STRIDE`` and drawing its exploration from seed ``p``, so a later pass is another,
independent measurement of the same patients. Patients whose oracle fixes them (``bench/data/oracle.jsonl``)
go first, then unchecked ones, then the unsolvable ones; patients found not failing are skipped.

A share of the candidate slots (``explore``, default 1 in 5, seeded) goes on purpose to a random
lower-ranked candidate, so the data holds counterfactual negatives and not only the diagnoser's choices;
every case is tagged with how it was chosen (``chosen:diagnosis`` / ``chosen:exploration``, ``rank:N``,
``score:X``). With ``--check-oracle``, the oracle check that precedes a new patient's first unit is kept as
well: its screen and confirmation (the known fix against a same-budget control) join the unit's cases,
tagged ``chosen:oracle`` and counted apart (``oracle``, ``oracle_improved``), so the experience holds
confirmed fixes of families the diagnoser rarely proposes first. Every confirmation records whether the agent now works (``verification.fixed``,
:mod:`remedy.cases.verify.fixed`) beside ``improved``.

A finished unit's cases wait under ``<out>/pending/`` (not committed); every ``chunk`` units they become
``<out>/chunk-<shard>-<n>.parquet`` (the KB's Parquet export: ``remedy kb import`` reads it) and an entry in
``<out>/manifest.json`` (git commit, versions, settings, the units, counts of attempts / improved / fixed /
env steps / wall time). A re-run skips every unit already in a chunk or pending (resume); a shard ``(i, n)``
takes every n-th unit; ``commit`` commits each chunk (its Parquet and the manifest) as it lands.

Two faces share this module: ``remedy bench factory`` and ``bench/factory.py`` (the same flags).
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from remedy.cases.io import read_cases, write_cases
from remedy.cases.model import Case, Stage, Status
from remedy.cases.outcomes import final_verdicts
from remedy.cases.verify.scenarios import Scenario
from remedy.cases.verify.solvability import (
    ORACLE_FILE,
    estimated_steps,
    latest_results,
    not_failing,
    parse_shard,
    shard_of,
)
from remedy.cases.verify.verification import versions

from .bench import BenchSettings, CaseCollector, run_bench, select_scenarios
from .fixloop import one_torch_thread

__all__ = [
    "OUT",
    "MANIFEST",
    "PASS_SEED_STRIDE",
    "ORACLE_TAG",
    "with_oracle",
    "oracle_tagged",
    "OracleUnit",
    "oracle_units",
    "run_oracle_unit",
    "FactoryPlan",
    "Unit",
    "order_zoo",
    "units",
    "counts",
    "read_manifest",
    "done_units",
    "save_pending",
    "seal_chunk",
    "run_unit",
    "run_factory",
    "factory_settings",
    "plan_zoo",
    "todo_units",
    "run_plan",
    "status",
    "by_family",
]

OUT = Path("bench") / "data" / "factory"
MANIFEST = "manifest.json"
#: training seeds between passes: a pass's screens and confirmations stay inside their own block
#: the tag of an attempt the oracle check made (the known fix from the answer key, not a diagnosis's choice)
ORACLE_TAG = "chosen:oracle"
PASS_SEED_STRIDE = 1000

#: where progress lines go (``print`` for the script; the CLI passes its console)
Say = Callable[[str], None]


@dataclass(frozen=True)
class Unit:
    """One patient on one pass."""

    scenario: Scenario
    pass_no: int

    @property
    def key(self) -> str:
        return f"{self.scenario.name}@{self.pass_no}"


@dataclass(frozen=True)
class OracleUnit:
    """A solvable patient's oracle verification, run again to keep its attempts as experience (``--oracle-cases``):
    checks made before the factory kept them recorded only their verdict."""

    scenario: Scenario

    @property
    def key(self) -> str:
        return f"{self.scenario.name}@oracle"


def oracle_units(zoo: Sequence[Scenario], oracle: Path, shard: tuple[int, int] | None) -> list[OracleUnit]:
    """This shard's oracle units: every patient whose current oracle verdict is ``solvable``, in the zoo's order."""
    records = latest_results(zoo, oracle)
    return shard_of([OracleUnit(s) for s in zoo if getattr(records.get(s.name), "verdict", "") == "solvable"], shard)


def run_oracle_unit(unit: OracleUnit, oracle: Path, say: Say = print) -> tuple[list[Case], dict[str, Any]]:
    """Verify the patient's oracle again (screen, then confirmation on fresh seeds; a new record line), keeping
    its cases tagged ``chosen:oracle``; the same seeds as the first check, so the same measurement."""
    from remedy.cases.verify.solvability import check_scenarios

    t0 = time.perf_counter()
    kept: list[Case] = []
    results = check_scenarios([unit.scenario], results=oracle, force=True, on_cases=kept.extend)
    cases = oracle_tagged(kept)
    s = unit.scenario
    verdict = results[0].verdict if results else None
    say(f"oracle {s.name}: {verdict}, {len(cases)} case(s) kept ({time.perf_counter() - t0:.0f} s)")
    return cases, {
        "unit": unit.key,
        "scenario": s.name,
        "pass": "oracle",
        "env_id": s.env_id,
        "algo": s.algo,
        "family": s.family,
        "split": s.split,
        "verdict": verdict,
        "wall_time_s": round(time.perf_counter() - t0, 1),
        **counts(cases),
    }


@dataclass(frozen=True)
class FactoryPlan:
    """What one factory run covers and where it writes (the fix loop's own knobs are a :class:`BenchSettings`)."""

    scenarios: str | None = None  # name glob of the zoo (None: every bundled scenario)
    split: str = "all"  # all, dev, holdout, or lofo:<family> / lofo-train:<family>
    passes: int = 1
    shard: str | None = None  # "i/n"
    chunk: int = 4
    max_units: int | None = None
    out: Path = OUT
    oracle_results: Path = ORACLE_FILE
    commit: bool = False
    build_first: bool = False
    check_oracle: bool = False
    oracle_cases: bool = False  # only re-run solvable patients' oracle checks whose attempts were not kept
    executor: str = "local"
    ray_address: str | None = None


def factory_settings(
    *,
    rounds: int = 2,
    candidates: int = 2,
    seeds: int = 2,
    confirm_seeds: int | None = None,
    explore: float = 0.2,
    race: bool = True,
    executor: str = "local",
    oracle_results: Path | str = ORACLE_FILE,
) -> BenchSettings:
    """The fix loop's settings for a factory run: the defaults both faces share (``confirm_seeds`` None: the loop's)."""
    base = BenchSettings()
    return replace(
        base,
        rounds=rounds,
        candidates=candidates,
        seeds=seeds,
        confirm_seeds=confirm_seeds or base.confirm_seeds,
        explore=explore,
        race=race,
        executor=executor,
        oracle_results=str(oracle_results),
    )


def order_zoo(scenarios: Sequence[Scenario], oracle: Path) -> list[Scenario]:
    """Solvable patients first (oracle verdicts), then unchecked, then the rest; not-failing ones dropped.
    Unchecked patients go cheapest check first (``estimated_steps``), so a session that ends mid-way has
    recorded as many verdicts as it could; the others by name."""
    records = latest_results(scenarios, oracle)
    skip = not_failing(scenarios, oracle)

    def rank(s: Scenario) -> tuple[int, int, str]:
        r = records.get(s.name)
        group = 1 if r is None or r.verdict == "error" else (0 if r.verdict == "solvable" else 2)
        return group, estimated_steps(s) if group == 1 else 0, s.name

    return sorted((s for s in scenarios if s.name not in skip), key=rank)


def units(zoo: Sequence[Scenario], passes: int, shard: tuple[int, int] | None) -> list[Unit]:
    """Every (patient, pass) in order (pass by pass), then this shard's share: every n-th unit from the i-th."""
    every = [Unit(s, p) for p in range(passes) for s in zoo]
    return shard_of(every, shard)


def counts(cases: Sequence[Case]) -> dict[str, int]:
    """Attempts (each once, at its final verdict), how many were measured, improved and fixed, env steps spent."""
    verdicts = [v for _, v in final_verdicts(cases)]

    def ver(c: Case):
        return c.verification

    return {
        "cases": len(cases),
        "attempts": len(verdicts),
        "measured": sum(1 for c in verdicts if ver(c) is not None and ver(c).effect is not None),
        "stopped_early": sum(1 for c in verdicts if ver(c) is not None and ver(c).status is Status.stopped_early),
        "confirmations": sum(1 for c in cases if ver(c) is not None and ver(c).stage is Stage.confirm),
        "improved": sum(1 for c in verdicts if c.status == Status.improved.value),
        "fixed": sum(1 for c in verdicts if ver(c) is not None and ver(c).fixed),
        "exploration": sum(1 for c in verdicts if "chosen:exploration" in c.tags),
        "oracle": sum(1 for c in verdicts if ORACLE_TAG in c.tags),
        "oracle_improved": sum(1 for c in verdicts if ORACLE_TAG in c.tags and c.status == Status.improved.value),
        "env_steps": sum(ver(c).env_steps for c in cases if ver(c) is not None),
    }


# --------------------------------------------------------------------------- storage


@contextmanager
def locked(out: Path) -> Iterator[None]:
    """One writer of the manifest and chunks at a time (shards may run side by side)."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def read_manifest(out: Path) -> dict[str, Any]:
    """The manifest of ``out`` (an empty one when there is none yet)."""
    path = out / MANIFEST
    if not path.exists():
        return {"dataset": "remedy factory cases", "chunks": [], "totals": {}}
    return json.loads(path.read_text())


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    tmp.replace(path)  # whole or not at all


def _chunked(manifest: dict[str, Any]) -> set[str]:
    return {u["unit"] for c in manifest["chunks"] for u in c["units"]}


def done_units(out: Path) -> set[str]:
    """Units already in a chunk or pending (resume skips them)."""
    pending = {p.name.removesuffix(".json") for p in (out / "pending").glob("*.json")}
    return _chunked(read_manifest(out)) | pending


def save_pending(out: Path, unit: Unit | OracleUnit, cases: Sequence[Case], summary: dict[str, Any]) -> None:
    """A finished unit's cases and summary, until they go into a chunk (cases first: the summary marks it done)."""
    folder = out / "pending"
    folder.mkdir(parents=True, exist_ok=True)
    write_cases(folder / f"{unit.key}.jsonl", cases)
    _write_json(folder / f"{unit.key}.json", summary)


def git_commit() -> str:
    """The checked-out commit (provenance of a chunk), or '' outside a git work tree."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def seal_chunk(out: Path, shard_tag: str, settings: dict[str, Any], force: bool = False, size: int = 1) -> Path | None:
    """Turn this shard's pending units into the next chunk (when ``size`` are waiting, or ``force`` and any are);
    returns the chunk's Parquet path, or None."""
    with locked(out):
        metas = sorted((out / "pending").glob("*.json"))
        metas = [m for m in metas if json.loads(m.read_text()).get("shard") == shard_tag]
        if not metas or (len(metas) < size and not force):
            return None
        manifest = read_manifest(out)
        n = 1 + sum(1 for c in manifest["chunks"] if c.get("shard") == shard_tag)
        name = f"chunk-{shard_tag.replace('/', 'of')}-{n:04d}.parquet"
        summaries = [json.loads(m.read_text()) for m in metas]
        cases: dict[str, Case] = {}
        for m in metas:
            cases.update({c.case_id: c for c in read_cases(m.with_suffix(".jsonl"))[0]})
        write_cases(out / name, cases.values())
        entry = {
            "file": name,
            "shard": shard_tag,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "git_commit": git_commit(),
            "versions": versions(),
            "settings": settings,
            "units": summaries,
            **_sum(summaries),
        }
        entry["cases"] = len(cases)
        manifest["chunks"].append(entry)
        manifest["totals"] = _sum(manifest["chunks"])
        manifest["totals"]["chunks"] = len(manifest["chunks"])
        manifest["format"] = "Parquet, one case as JSON per row in 'case_json' (`remedy kb import FILE.parquet`)"
        _write_json(out / MANIFEST, manifest)
        for m in metas:
            m.with_suffix(".jsonl").unlink(missing_ok=True)
            m.unlink()
        return out / name


_SUMMED = (
    "attempts",
    "measured",
    "stopped_early",
    "confirmations",
    "improved",
    "fixed",
    "exploration",
    "oracle",
    "oracle_improved",
    "env_steps",
)


def _sum(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: sum(int(r.get(k, 0)) for r in rows) for k in _SUMMED}
    out["wall_time_s"] = round(sum(float(r.get("wall_time_s", 0.0)) for r in rows), 1)
    out["n_units"] = sum(int(r.get("n_units", 1)) for r in rows)  # a chunk counts its units, a unit one
    hours = out["wall_time_s"] / 3600
    out["per_hour"] = {k: round(out[k] / hours, 2) for k in ("attempts", "improved", "fixed")} if hours else {}
    return out


def commit_chunk(out: Path, chunk: Path, say: Say = print) -> None:
    """Commit the chunk and the manifest (only those paths), retrying while another commit holds the index."""
    totals = read_manifest(out)["totals"]
    entry = next(c for c in read_manifest(out)["chunks"] if c["file"] == chunk.name)
    msg = (
        f"Data: factory {chunk.name}: {entry['n_units']} units, {entry['attempts']} attempts, "
        f"{entry['improved']} improved, {entry['fixed']} fixed, {entry['env_steps']:,} env steps, "
        f"{entry['wall_time_s'] / 3600:.2f} h (totals {totals['attempts']} / {totals['improved']} / {totals['fixed']})"
    )
    paths = [str(chunk), str(out / MANIFEST), *([str(ORACLE_FILE)] if _oracle_changed() else [])]
    for _ in range(30):
        add = subprocess.run(["git", "add", *paths], capture_output=True, text=True)
        if add.returncode == 0:
            res = subprocess.run(["git", "commit", "-m", msg, "--", *paths], capture_output=True, text=True)
            if res.returncode == 0:
                say(f"committed {chunk.name}: {msg}")
                return
            add = res
        if "index.lock" not in add.stderr:
            say(f"could not commit {chunk.name}: {add.stderr.strip()[:300]}")
            return
        time.sleep(5)
    say(f"could not commit {chunk.name}: the git index stayed locked")


def _oracle_changed() -> bool:
    """True when the oracle records have lines not committed yet (appended by ``--check-oracle``)."""
    res = subprocess.run(["git", "diff", "--quiet", "--", str(ORACLE_FILE)], capture_output=True)
    return res.returncode == 1


# --------------------------------------------------------------------------- running


def _clock(start: float) -> str:
    return f"[{(time.perf_counter() - start) / 60:6.1f} min]"


def _progress(start: float, say: Say) -> Callable[[str, str, int, int], None]:
    def progress(name: str, message: str, done: int, total: int) -> None:
        if total == 0 or done == total:  # stages and finished verifications, not every job tick
            say(f"{_clock(start)} {name}: {message}")

    return progress


def run_unit(unit: Unit, settings: BenchSettings, executor: Any = None, start: float | None = None, say: Say = print):
    """The fix loop on one unit: its cases and its summary row."""
    t0 = time.perf_counter()
    store = CaseCollector()
    pass_settings = replace(
        settings, seed_base=settings.seed_base + unit.pass_no * PASS_SEED_STRIDE, explore_seed=unit.pass_no
    )
    report = run_bench(
        None,
        [unit.scenario],
        pass_settings,
        store=store,
        label="factory",
        progress=_progress(start or t0, say),
        executor=executor,
    )
    row = report.scenarios[0]
    s = unit.scenario
    summary = {
        "unit": unit.key,
        "scenario": s.name,
        "pass": unit.pass_no,
        "env_id": s.env_id,
        "algo": s.algo,
        "family": s.family,
        "split": s.split,
        "solvable": row.solvable,
        "improved_any": row.fixed,
        "works": row.works,
        "winning_patch": row.winning_patch,
        "first_causes": row.first_causes[:3],
        "error": row.error,
        "wall_time_s": round(time.perf_counter() - t0, 1),
        **counts(store.cases),
    }
    return store.cases, summary


def build_missing(zoo: Sequence[Scenario], say: Say = print) -> int:
    """Train every zoo patient that is neither shipped nor cached (one at a time, in this process); how many."""
    # deferred: building pulls SB3 and torch, which --status and --dry-run never need
    from remedy.cases.verify.scenarios import build_scenario, bundled_checkpoint, find_built

    missing = [s for s in zoo if bundled_checkpoint(s) is None and find_built(s) is None]
    for i, s in enumerate(missing, start=1):
        t0 = time.perf_counter()
        built = build_scenario(s)
        say(f"built {i}/{len(missing)} {s.name}: success {built.success_rate} ({time.perf_counter() - t0:.0f} s)")
    return len(missing)


def check_oracle(unit: Unit, oracle: Path, say: Say = print, keep: list[Case] | None = None) -> bool:
    """Record the patient's oracle verdict if it has none (``remedy bench build``'s check, appended to ``oracle``);
    False when the patient does not fail (no unit to run). ``keep`` receives the check's verified cases,
    tagged ``chosen:oracle`` (the known fix, chosen from the answer key, not by a diagnosis)."""
    from remedy.cases.verify.solvability import check_scenarios

    def kept(cases: list[Case]) -> None:
        if keep is not None:
            keep.extend(oracle_tagged(cases))

    for r in check_scenarios([unit.scenario], results=oracle, on_cases=kept):
        say(f"oracle {unit.scenario.name}: {r.verdict} ({r.wall_time_s or 0:.0f} s)")
    return unit.scenario.name not in not_failing([unit.scenario], oracle)


def oracle_tagged(cases: Sequence[Case]) -> list[Case]:
    """The oracle check's cases tagged as chosen from the answer key (``chosen:oracle``), not by a diagnosis."""
    return [c.model_copy(update={"tags": [*c.tags, ORACLE_TAG]}) for c in cases]


def with_oracle(oracle_cases: Sequence[Case], cases: Sequence[Case]) -> list[Case]:
    """The unit's cases after its oracle check's; an oracle case whose id the fix loop also produced (the same
    patch on the same seeds: the same measurement) is left out, the loop's copy carrying how it was chosen."""
    ids = {c.case_id for c in cases}
    return [*(c for c in oracle_cases if c.case_id not in ids), *cases]


def make_executor(name: str, address: str | None) -> Any:
    """A running executor to share over the units (Ray at ``address``), or None: each loop builds a local one."""
    if name == "local":
        return None
    from remedy.cases.verify.executors import get_executor

    return get_executor(name, address=address) if address else get_executor(name)


def run_factory(
    zoo: Sequence[Scenario],
    settings: BenchSettings,
    out: Path,
    *,
    passes: int = 1,
    shard: tuple[int, int] | None = None,
    chunk: int = 4,
    max_units: int | None = None,
    commit: bool = False,
    executor: Any = None,
    unit_runner: Callable[..., tuple[list[Case], dict[str, Any]]] | None = None,
    oracle: Path | None = None,
    oracle_cases: bool = False,
    say: Say = print,
) -> list[str]:
    """Run every unit of this shard not done yet; seal a chunk every ``chunk`` units (and the rest at the end).
    With ``oracle`` (a results file), a patient without a verdict is checked first (``--check-oracle``) and a
    patient that does not fail is recorded as a skipped unit. Returns the keys of the units run now."""
    runner = unit_runner or (lambda u, s, executor=None, start=None: run_unit(u, s, executor, start, say))
    shard_tag = "all" if shard is None else f"{shard[0]}/{shard[1]}"
    meta = {**asdict(settings), "passes": passes, "chunk": chunk, "pass_seed_stride": PASS_SEED_STRIDE}
    if oracle_cases:  # its own shard tag: a factory run beside it seals only its own units
        return _run_oracle_units(zoo, out, oracle or ORACLE_FILE, shard, f"oracle{shard_tag}", meta, chunk,
                                 max_units, commit, say)  # fmt: skip
    todo = [u for u in units(zoo, passes, shard) if u.key not in done_units(out)]
    if max_units is not None:
        todo = todo[:max_units]
    start, ran = time.perf_counter(), []
    say(f"factory: {len(todo)} unit(s) to run in shard {shard_tag} ({len(zoo)} patients x {passes} pass(es))")
    for i, unit in enumerate(todo, start=1):
        if unit.key in done_units(out):  # another process of the same shard got there first
            continue
        say(f"{_clock(start)} unit {i}/{len(todo)}: {unit.key}")
        checked: list[Case] = []
        t_check = time.perf_counter()
        if oracle is not None and not check_oracle(unit, oracle, say, keep=checked):
            skipped = {"unit": unit.key, "scenario": unit.scenario.name, "skipped": "not failing", "wall_time_s": 0.0}
            save_pending(out, unit, [], {**skipped, **counts([]), "shard": shard_tag})
            continue
        check_time = time.perf_counter() - t_check
        cases, summary = runner(unit, settings, executor=executor, start=start)
        if checked:  # the oracle check's attempts join the unit's, counted in its summary (and apart), its time too
            cases = with_oracle(checked, cases)
            wall = round(float(summary.get("wall_time_s", 0.0)) + check_time, 1)
            summary = {**summary, **counts(cases), "wall_time_s": wall}
        save_pending(out, unit, cases, {**summary, "shard": shard_tag})
        ran.append(unit.key)
        say(
            f"{_clock(start)} done {unit.key}: {summary['attempts']} attempts, "
            f"{summary['improved']} improved, {summary['fixed']} fixed, {summary['env_steps']:,} env steps"
            + (f"; error {summary['error']}" if summary.get("error") else "")
        )
        _seal(out, shard_tag, meta, commit, say, size=chunk)
    _seal(out, shard_tag, meta, commit, say, force=True)
    return ran


def _run_oracle_units(
    zoo: Sequence[Scenario],
    out: Path,
    oracle: Path,
    shard: tuple[int, int] | None,
    shard_tag: str,
    meta: dict[str, Any],
    chunk: int,
    max_units: int | None,
    commit: bool,
    say: Say,
) -> list[str]:
    """``--oracle-cases``: every solvable patient's oracle check again, its attempts kept (resumable, chunked)."""
    todo = [u for u in oracle_units(zoo, oracle, shard) if u.key not in done_units(out)][:max_units]
    say(f"factory: {len(todo)} oracle unit(s) to run in shard {shard_tag}")
    ran = []
    for i, unit in enumerate(todo, start=1):
        if unit.key in done_units(out):
            continue
        say(f"oracle unit {i}/{len(todo)}: {unit.key}")
        cases, summary = run_oracle_unit(unit, oracle, say)
        known = _known_case_ids(out)  # the same measurement a loop already shipped keeps its first copy
        if any(c.case_id in known for c in cases):
            cases = [c for c in cases if c.case_id not in known]
            summary = {**summary, **counts(cases)}
        save_pending(out, unit, cases, {**summary, "shard": shard_tag})
        ran.append(unit.key)
        _seal(out, shard_tag, meta, commit, say, size=chunk)
    _seal(out, shard_tag, meta, commit, say, force=True)
    return ran


def _known_case_ids(out: Path) -> set[str]:
    """Every case id already in a chunk or pending (an import refuses an id stored twice with other content)."""
    files = [*(out / c["file"] for c in read_manifest(out)["chunks"]), *(out / "pending").glob("*.jsonl")]
    return {c.case_id for f in files if f.is_file() for c in read_cases(f)[0]}


def _seal(out: Path, shard_tag: str, meta: dict[str, Any], commit: bool, say: Say, size: int = 1, force: bool = False):
    """Seal a chunk when ``size`` units of this shard wait (or any, with ``force``), then announce (and commit) it."""
    sealed = seal_chunk(out, shard_tag, meta, force=force, size=size)
    if sealed is not None:
        _announce(out, sealed, commit, say)


def _announce(out: Path, chunk: Path, commit: bool, say: Say) -> None:
    t = read_manifest(out)["totals"]
    say(
        f"sealed {chunk.name}; totals: {t['n_units']} units, {t['attempts']} attempts, {t['improved']} improved, "
        f"{t['fixed']} fixed, {t['env_steps']:,} env steps, {t['wall_time_s'] / 3600:.2f} h"
    )
    if commit:
        commit_chunk(out, chunk, say)


def status(out: Path, oracle: Path | None = None) -> dict[str, Any]:
    """The manifest's totals, per fault family (the issue's target counts fixes per family), and the units
    finished but not yet in a chunk; with ``oracle``, the bundled zoo's oracle verdicts too (:func:`zoo_verdicts`)."""
    m = read_manifest(out)
    state = {"totals": m["totals"], "by_family": by_family(m), "pending": sorted(done_units(out) - _chunked(m))}
    if oracle is not None:
        state["zoo"] = zoo_verdicts(select_scenarios(), oracle)
    return state


def zoo_verdicts(zoo: Sequence[Scenario], oracle: Path) -> dict[str, Any]:
    """How many patients the zoo holds and their current oracle verdicts (``unchecked``: no current record),
    with the solvable share of the checked ones (the issue's yield target)."""
    records = latest_results(zoo, oracle)
    out: dict[str, Any] = dict.fromkeys(("patients", "solvable", "unsolvable", "not_failing", "unchecked"), 0)
    out["patients"] = len(zoo)
    for s in zoo:
        r = records.get(s.name)
        verdict = "unchecked" if r is None or r.verdict not in out else r.verdict
        out[verdict] += 1
    checked = out["patients"] - out["unchecked"]
    out["solvable_share_of_checked"] = round(out["solvable"] / checked, 3) if checked else None
    return out


def by_family(manifest: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Units, attempts, improved and fixed per fault family over the manifest's chunks (skipped units: '-')."""
    out: dict[str, dict[str, int]] = {}
    for unit in (u for c in manifest["chunks"] for u in c["units"]):
        row = out.setdefault(unit.get("family") or "-", dict.fromkeys(("units", "attempts", "improved", "fixed"), 0))
        row["units"] += 1
        for key in ("attempts", "improved", "fixed"):
            row[key] += int(unit.get(key, 0))
    return dict(sorted(out.items()))


# --------------------------------------------------------------------------- one run, for both faces


def plan_zoo(plan: FactoryPlan) -> list[Scenario]:
    """The plan's patients, in the factory's order (solvable first, not-failing dropped)."""
    return order_zoo(select_scenarios(plan.scenarios, split=plan.split), plan.oracle_results)


def todo_units(plan: FactoryPlan) -> list[str]:
    """The keys of this shard's units still to run (a dry run)."""
    done, shard = done_units(plan.out), parse_shard(plan.shard)
    if plan.oracle_cases:
        return [u.key for u in oracle_units(plan_zoo(plan), plan.oracle_results, shard) if u.key not in done]
    return [u.key for u in units(plan_zoo(plan), plan.passes, shard) if u.key not in done]


def run_plan(plan: FactoryPlan, settings: BenchSettings, say: Say = print) -> dict[str, Any]:
    """Run the plan (building missing patients first if asked) on its executor; the status afterwards."""
    shard = parse_shard(plan.shard)  # a bad --shard fails before anything is built
    one_torch_thread()
    zoo = plan_zoo(plan)
    if plan.build_first:
        build_missing(zoo, say)
    executor = make_executor(plan.executor, plan.ray_address)
    try:
        run_factory(
            zoo,
            settings,
            plan.out,
            passes=plan.passes,
            shard=shard,
            chunk=plan.chunk,
            max_units=plan.max_units,
            commit=plan.commit,
            executor=executor,
            oracle=plan.oracle_results if plan.check_oracle or plan.oracle_cases else None,
            oracle_cases=plan.oracle_cases,
            say=say,
        )
    finally:
        if executor is not None:
            executor.shutdown()
    return status(plan.out)
