"""Oracle solvability: does each bench patient fail, and does its known fix (the oracle) fix it?

For every scenario :func:`check_scenario` builds the patient (shipped, cached or
trained), measures its success rate on the original task, and verifies the
scenario's ``oracle`` patch against a same-budget control with
:func:`~remedy.cases.verify.verification.verify_patch` (the scenario's own
fine-tune budget). The verdict is one of:

- ``solvable``: the patient fails and the oracle is ``improved``: its screen cleared and a
  confirmation on fresh seeds agreed (:func:`~remedy.cases.verify.verification.verify_and_confirm`,
  the rule every fix follows; a screen alone never says ``improved``);
- ``unsolvable``: the patient fails but its oracle does not fix it within the
  budget (left out of fix-rate denominators and listed in bench reports);
- ``not_failing``: the patient already succeeds (success rate at or above
  :data:`FAIL_BELOW`), so it is no fault scenario at this budget;
- ``no_oracle`` / ``error``: nothing to check, or the check crashed (with the reason).

Results are appended, one JSON object a line, to a results file (tracked in
git: ``bench/data/oracle.jsonl`` by default) keyed by :func:`oracle_key` (the
scenario's training hash, its oracle, budget and the check settings), so a
re-run skips what is done (resume) and shards (``shard=(i, n)``) split the work
between processes that append to the same file.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..errors import ScenarioError, VerificationError
from ..model import Case
from .scenarios import Scenario, build_scenario, scenario_hash
from .verification import CONFIRM_SEEDS, EARLIER_SCREEN_CONFIDENCE, SCREEN_CONFIDENCE

__all__ = [
    "FAIL_BELOW",
    "ORACLE_FILE",
    "OracleSettings",
    "OracleResult",
    "oracle_key",
    "parse_shard",
    "shard_of",
    "by_cost",
    "estimated_steps",
    "read_results",
    "latest_results",
    "pending",
    "not_failing",
    "check_scenario",
    "check_scenarios",
]

#: a patient "fails" when its success rate on the original task is below this.
FAIL_BELOW = 0.5
#: the tracked results file (relative to the repository root / working directory).
ORACLE_FILE = Path("bench") / "data" / "oracle.jsonl"
#: bump when the check itself changes what a stored result means. 2: ``solvable`` needs a confirmation on
#: fresh seeds (version 1 read a screen's status, which since screens and confirmations were told apart is
#: never ``improved``, so every failing patient came out ``unsolvable``). 3: every training seed is evaluated on
#: its own block of episodes (``EVAL_BLOCK_STRIDE`` in :mod:`.verification`)
ORACLE_VERSION = 3


@dataclass(frozen=True)
class OracleSettings:
    """How the oracle is verified: seeds per arm of the screen and of its confirmation, evaluation episodes
    (None: the scenario's), workers. The defaults are the fix loop's, so solvable means the check every fix
    must pass would pass."""

    seeds: int = 3
    confirm_seeds: int = CONFIRM_SEEDS
    eval_episodes: int | None = None
    workers: int = 1
    #: the screen's pass level (:data:`~remedy.cases.verify.verification.SCREEN_CONFIDENCE`); records made
    #: before it existed screened at 0.95 and keep their keys at that level
    screen_confidence: float = SCREEN_CONFIDENCE


@dataclass(frozen=True)
class OracleResult:
    """One scenario's solvability record (one line of the results file)."""

    scenario: str
    key: str
    split: str
    family: str | None
    verdict: str  # solvable | unsolvable | not_failing | no_oracle | error
    patient_success: float | None
    oracle: str | None
    oracle_status: str | None = None
    oracle_effect: dict[str, float] | None = None
    oracle_per_seed: dict[str, list[float]] | None = None
    budget_steps: int = 0
    env_steps: int = 0
    wall_time_s: float = 0.0
    reason: str = ""
    checked_at: str = ""


def oracle_key(s: Scenario, settings: OracleSettings) -> str:
    """What a stored result depends on: the patient's hash, the oracle, the budget and the check settings."""
    payload = {
        "v": ORACLE_VERSION,
        "patient": scenario_hash(s),
        "budget": s.budget,
        "oracle": None if s.oracle is None else s.oracle.model_dump(mode="json"),
        "seeds": settings.seeds,
        **({} if settings.confirm_seeds == settings.seeds else {"confirm_seeds": settings.confirm_seeds}),
        "episodes": settings.eval_episodes or s.eval_episodes,
        **(
            {}
            if settings.screen_confidence == EARLIER_SCREEN_CONFIDENCE
            else {"screen_confidence": settings.screen_confidence}
        ),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """``"i/n"`` (1-based, i <= n) as ``(i, n)``; None for no sharding."""
    if not text:
        return None
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ScenarioError(f"--shard '{text}' is not i/n; write e.g. --shard 1/2") from None
    if not 1 <= i <= n:
        raise ScenarioError(f"--shard {text}: i must be between 1 and n; write e.g. --shard 1/{max(n, 1)}")
    return i, n


def estimated_steps(s: Scenario, seeds: int = 2) -> int:
    """Rough env steps a check costs (patient training plus both arms of every seed); orders the work."""
    extra = sum(getattr(p, "extra_steps", 0) for p in s.oracle.parts) if s.oracle is not None else 0
    return s.train_steps + seeds * 2 * (s.budget + extra)


def by_cost(scenarios: Sequence[Scenario], seeds: int = 2) -> list[Scenario]:
    """Cheapest checks first (ties by name), so an interrupted run has finished as many scenarios as it could."""
    return sorted(scenarios, key=lambda s: (estimated_steps(s, seeds), s.name))


_T = TypeVar("_T")


def shard_of(scenarios: Sequence[_T], shard: tuple[int, int] | None) -> list[_T]:
    """The scenarios (or any items) of shard ``(i, n)``: every n-th by position, starting at the i-th (all when None)."""
    if shard is None:
        return list(scenarios)
    i, n = shard
    return [s for pos, s in enumerate(scenarios) if pos % n == i - 1]


def read_results(path: str | Path = ORACLE_FILE) -> list[OracleResult]:
    """Every record in a results file, in file order (missing file: none; a torn last line is skipped)."""
    p = Path(path)
    if not p.is_file():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            out.append(OracleResult(**json.loads(line)))
        except (ValueError, TypeError):
            continue  # a line cut by a killed writer; the scenario is simply checked again
    return out


def latest_results(
    scenarios: Sequence[Scenario], path: str | Path = ORACLE_FILE, settings: OracleSettings = OracleSettings()
) -> dict[str, OracleResult]:
    """The current record per scenario name (matching key; the last one wins), for scenarios that have one."""
    keys = {s.name: oracle_key(s, settings) for s in scenarios}
    return {r.scenario: r for r in read_results(path) if keys.get(r.scenario) == r.key}


def pending(
    scenarios: Sequence[Scenario], path: str | Path = ORACLE_FILE, settings: OracleSettings = OracleSettings()
) -> list[Scenario]:
    """Scenarios without a current record (what a resumed run still has to do); ``error`` records are retried."""
    done = {n for n, r in latest_results(scenarios, path, settings).items() if r.verdict != "error"}
    return [s for s in scenarios if s.name not in done]


def _record(s: Scenario, settings: OracleSettings, verdict: str, success: float | None, **extra: Any) -> OracleResult:
    return OracleResult(
        scenario=s.name,
        key=oracle_key(s, settings),
        split=s.split,
        family=s.family,
        verdict=verdict,
        patient_success=success,
        oracle=None if s.oracle is None else s.oracle.summary(),
        checked_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **{"budget_steps": s.budget, **extra},
    )


def not_failing(scenarios: Sequence[Scenario], path: str | Path = ORACLE_FILE) -> set[str]:
    """Names of the scenarios whose current patient a record found not failing. Whether a patient fails does
    not depend on the check's settings, so a record under the screen level before the current one counts."""
    earlier = latest_results(scenarios, path, OracleSettings(screen_confidence=EARLIER_SCREEN_CONFIDENCE))
    records = {**earlier, **latest_results(scenarios, path)}
    return {name for name, r in records.items() if r.verdict == "not_failing"}


def check_scenario(
    s: Scenario,
    settings: OracleSettings = OracleSettings(),
    *,
    cache_dir: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
    on_cases: Callable[[list[Case]], None] | None = None,
) -> OracleResult:
    """Build ``s``'s patient, measure it, and verify its oracle (see the module docstring for verdicts).

    ``on_cases`` receives the oracle's verified cases (its screen, and its confirmation when the screen
    cleared): real attempts of a known patch against a same-budget control, which the case factory keeps
    as experience instead of throwing them away."""
    from .executors import get_executor
    from .verification import VerifyConfig, verify_and_confirm

    t0 = time.perf_counter()
    built = build_scenario(s, cache_dir)
    success = built.success_rate
    if success is None:
        from .scenarios import patient_success_rate

        success = patient_success_rate(built.run, s.eval_episodes)
    if success >= FAIL_BELOW:
        return _record(s, settings, "not_failing", success, wall_time_s=round(time.perf_counter() - t0, 1))
    if s.oracle is None:
        return _record(s, settings, "no_oracle", success)
    if progress:
        progress(f"verifying the oracle: {s.oracle.summary()}")
    config = VerifyConfig(
        seeds=settings.seeds,
        confirm_seeds=settings.confirm_seeds,
        screen_confidence=settings.screen_confidence,
        budget_steps=s.budget,
        eval_episodes=settings.eval_episodes or s.eval_episodes,
        n_envs=s.n_envs,
    )
    executor = get_executor("local", max_workers=settings.workers)
    try:
        screen, confirmation = verify_and_confirm(built.run, s.oracle, config, executor=executor, scenario=s)
    finally:
        executor.shutdown()
    cases = [c for c in (screen, confirmation) if c is not None]
    if any(c.verification is None for c in cases):  # verify_patch always records one
        raise VerificationError(f"the oracle's case {screen.case_id} has no verification")
    if on_cases is not None:
        on_cases(cases)
    v = cases[-1].verification  # the confirmation when the screen cleared, else the screen
    assert v is not None
    eff = (
        None
        if v.effect is None
        else {k: getattr(v.effect, k) for k in ("treatment", "control", "diff", "ci_low", "ci_high")}
        | {"metric": v.effect.metric}
    )
    return _record(
        s,
        settings,
        oracle_verdict(v.status.value),
        success,
        oracle_status=v.status.value,
        oracle_effect=eff,
        oracle_per_seed=dict(v.per_seed) or None,
        env_steps=sum(c.verification.env_steps for c in cases if c.verification is not None),
        reason="; ".join(f"{c.verification.stage.value}: {c.verification.reason}" for c in cases if c.verification),
        wall_time_s=round(time.perf_counter() - t0, 1),
        budget_steps=v.budget_steps,
    )


def oracle_verdict(final_status: str) -> str:
    """The verdict from the oracle's last verification (its confirmation when the screen cleared, else its
    screen): ``solvable`` only when it is ``improved`` (a screen never is), ``error`` when it failed."""
    if final_status == "improved":
        return "solvable"
    return "error" if final_status == "failed" else "unsolvable"


def _append(path: Path, result: OracleResult) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:  # one write per line: concurrent shards append whole lines
        fh.write(json.dumps(asdict(result), default=str) + "\n")


def check_scenarios(
    scenarios: Sequence[Scenario],
    settings: OracleSettings = OracleSettings(),
    *,
    results: str | Path = ORACLE_FILE,
    shard: tuple[int, int] | None = None,
    cache_dir: str | Path | None = None,
    force: bool = False,
    progress: Callable[[str, str], None] | None = None,
    on_cases: Callable[[list[Case]], None] | None = None,
) -> list[OracleResult]:
    """Check this shard's scenarios that have no current record (all of them with ``force``); append each result.

    A crash in one scenario is recorded as verdict ``error`` with the reason and the run goes on.
    """
    path = Path(results)
    mine = shard_of(scenarios, shard)
    todo = mine if force else pending(mine, path, settings)
    out = []
    for s in todo:
        say = (lambda msg, name=s.name: progress(name, msg)) if progress else None
        try:
            result = check_scenario(s, settings, cache_dir=cache_dir, progress=say, on_cases=on_cases)
        except Exception as err:
            result = _record(s, settings, "error", None, reason=f"{type(err).__name__}: {err}")
        _append(path, result)
        out.append(result)
        if say:
            say(f"{result.verdict} ({result.wall_time_s:.0f} s)")
    return out
