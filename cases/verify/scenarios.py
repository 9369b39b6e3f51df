"""Fault scenarios: broken agents whose fault we know, declared as YAML under ``cases/scenarios/``.

A :class:`Scenario` names the env, algorithm and training budget, the injected
fault (setup wrappers such as a survival-paying reward or scaled observations,
or hyperparameters such as a learning rate far too high), the ground-truth
root causes, the remedy families expected to fix it, the task-success
definition and shifted-env variants. :func:`build` trains the patient once and
caches its run directory by :func:`scenario_hash`; the quick subset ships
trained checkpoints under ``cases/scenarios/checkpoints/<name>/`` so a fresh
clone needs no training for the demo.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..algos import AlgoName
from ..errors import RunDirError, ScenarioError
from ..evidence.constraints import Constraint
from ..evidence.rundir import RunConfig, RunDir, write_run_yaml
from ..evidence.wrappers import WrapperSpec
from ..model import RemedyFamily, RootCause
from ..patches.spec import Patch
from ..success import SuccessSpec
from ..yamlfile import first_error, load_yaml_model
from .templates import TEMPLATE_FILE, template_fields

__all__ = [
    "SCENARIO_DIR",
    "CHECKPOINT_DIR",
    "TRAINING_VERSION",
    "ShiftedEnv",
    "Scenario",
    "BuiltScenario",
    "load_scenarios",
    "bundled_scenarios",
    "load_template_scenarios",
    "load_scenario",
    "scenario_hash",
    "default_cache_dir",
    "bundled_checkpoint",
    "build",
    "build_scenario",
    "find_built",
    "patient_success_rate",
]

#: the bundled scenario files.
SCENARIO_DIR = Path(__file__).parent.parent / "scenarios"
#: shipped run directories of the quick subset, one folder per scenario name.
CHECKPOINT_DIR = SCENARIO_DIR / "checkpoints"
#: bump when training code changes what a scenario's hash must invalidate.
TRAINING_VERSION = 1
#: file in a built run directory recording the scenario hash and build figures.
BUILD_JSON = "build.json"


class ShiftedEnv(BaseModel):
    """A shifted-env variant for generalization checks: env kwargs merged over the scenario's."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    env_kwargs: dict[str, Any] = Field(default_factory=dict)


class Scenario(BaseModel):
    """One broken agent with a known fault (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$")
    description: str
    env_id: str
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    algo: AlgoName
    hyperparams: dict[str, Any] = Field(default_factory=dict)
    train_steps: int = Field(gt=0)
    n_envs: int = Field(8, ge=1)
    seed: int = 0
    wrappers: list[WrapperSpec] = Field(default_factory=list)
    max_episode_steps: int | None = Field(None, gt=0)
    fault: str
    ground_truth: list[RootCause] = Field(min_length=1)
    expected_families: list[RemedyFamily] = Field(min_length=1)
    success: SuccessSpec
    shifted: list[ShiftedEnv] = Field(default_factory=list)
    constraints: list[Constraint] = Field(default_factory=list)
    quick: bool = False
    eval_episodes: int = Field(20, ge=1)
    finetune_budget: int | None = Field(None, ge=0)
    reward_ref: str | None = None
    #: ``dev`` (priors, weights and prompts may be tuned on it) or ``holdout`` (reported, never tuned on).
    split: Literal["dev", "holdout"] = "dev"
    #: a known fix in the patch schema; ``remedy bench build`` checks it fixes the patient (oracle solvability).
    oracle: Patch | None = None
    #: the fault family (template name) and env cell this scenario belongs to; the split holds out whole cells.
    family: str | None = None
    #: bundled example case ids that describe this very fault; retrieval drops them while this scenario is evaluated.
    examples_excluded: list[str] = Field(default_factory=list)

    @field_validator("oracle", mode="before")
    @classmethod
    def _one_part_oracle(cls, v: Any) -> Any:
        # a single part ({kind: ...}) is accepted, as in patch files
        return Patch.from_data(v) if isinstance(v, dict) else v

    @property
    def budget(self) -> int:
        """Fine-tuning steps per verification arm: ``finetune_budget`` or 20% of ``train_steps``."""
        return self.finetune_budget if self.finetune_budget is not None else max(1, self.train_steps // 5)

    def run_config(self) -> RunConfig:
        """The patient's run configuration (what ``run.yaml`` of the built agent holds).

        A blind patient: its fault wrappers are marked ``hidden`` and the notes
        do not describe the fault, so nothing a diagnoser or patch code reads
        names the answer.
        """
        return RunConfig(
            env_id=self.env_id,
            env_kwargs=self.env_kwargs,
            algo=self.algo,
            hyperparams=self.hyperparams,
            train_steps=self.train_steps,
            n_envs=self.n_envs,
            wrappers=_hidden(self.wrappers),
            reward_ref=self.reward_ref,
            success=self.success,
            constraints=self.constraints,
            max_episode_steps=self.max_episode_steps,
            seed=self.seed,
            notes=PATIENT_NOTES,
        )


#: what a bench patient's run.yaml says in ``notes`` (nothing about the fault).
PATIENT_NOTES = "bench patient"


def _hidden(wrappers: list[WrapperSpec]) -> list[WrapperSpec]:
    return [w.model_copy(update={"hidden": True}) for w in wrappers]


def _blind(run: RunDir, s: Scenario) -> RunDir:
    """Rewrite a build from before blind patients (fault wrappers not hidden, fault in the notes)."""
    c = run.config
    if all(w.hidden for w in c.wrappers) and c.notes == PATIENT_NOTES:
        return run
    write_run_yaml(run.path, c.model_copy(update={"wrappers": _hidden(c.wrappers), "notes": PATIENT_NOTES}))
    return RunDir.load(run.path)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate one scenario YAML file."""
    return load_yaml_model(Path(path), Scenario, ScenarioError, "with name, env_id, algo, train_steps, fault, ...")


def _paths_for(pattern: str) -> list[Path] | None:
    """Filesystem matches for a path-like pattern, or None when ``pattern`` names scenarios instead."""
    p = Path(pattern).expanduser()
    if p.is_dir():
        return sorted(p.glob("*.yaml")) + sorted(p.glob("*.yml"))
    if p.is_file():
        return [p]
    if "/" in pattern or pattern.endswith((".yaml", ".yml")):
        anchor = Path(p.anchor) if p.is_absolute() else Path(".")
        rel = str(p.relative_to(p.anchor)) if p.is_absolute() else pattern
        return sorted(anchor.glob(rel))
    return None


def _hand_files() -> list[Path]:
    return sorted(SCENARIO_DIR.glob("*.yaml"))


def bundled_scenarios() -> list[Scenario]:
    """The bundled suite: the hand-written scenario files, then the fault templates' expansion."""
    hand = [load_scenario(f) for f in _hand_files()]
    reserved = frozenset((s.family, s.env_id) for s in hand if s.family)
    return _unique(hand + load_template_scenarios(reserved=reserved))


def load_template_scenarios(
    path: str | Path = TEMPLATE_FILE, reserved: frozenset[tuple[str, str]] = frozenset()
) -> list[Scenario]:
    """The scenarios a fault-template file expands into (validated :class:`Scenario` objects)."""
    scenarios = []
    for fields in template_fields(path, reserved):
        try:
            scenarios.append(Scenario.model_validate(fields))
        except ValidationError as ex:
            raise ScenarioError(f"template scenario '{fields['name']}' in {path}: {first_error(ex)}") from None
    return scenarios


def _unique(scenarios: list[Scenario]) -> list[Scenario]:
    seen: set[str] = set()
    for s in scenarios:
        if s.name in seen:
            raise ScenarioError(f"two scenarios are named '{s.name}'; names must be unique")
        seen.add(s.name)
    return scenarios


def load_scenarios(glob_or_paths: str | Path | Iterable[str | Path] | None = None) -> list[Scenario]:
    """Scenarios: the bundled suite by default (hand files + templates); a directory, file, path glob,
    or a name glob (``"cartpole_*"``) over the bundled names. Names must be unique."""
    if glob_or_paths is None:
        return bundled_scenarios()
    items = [glob_or_paths] if isinstance(glob_or_paths, (str, Path)) else list(glob_or_paths)
    out: list[Scenario] = []
    bundled: list[Scenario] | None = None
    for item in items:
        paths = _paths_for(str(item))
        if paths is not None:
            if not paths:
                raise ScenarioError(f"no scenario file matches '{item}'; give a YAML file, directory or path glob")
            out += [load_scenario(f) for f in paths]
            continue
        bundled = bundled if bundled is not None else bundled_scenarios()
        matched = [s for s in bundled if fnmatch.fnmatch(s.name, str(item))]
        if not matched:
            known = ", ".join(s.name for s in bundled)
            raise ScenarioError(f"no scenario matches '{item}'; bundled scenarios: {known}")
        out += matched
    return _unique(out)


def scenario_hash(s: Scenario) -> str:
    """Stable hash of everything that shapes the trained patient (and the training version).

    Built from the scenario's own training fields, not from ``RunConfig``'s
    schema, so a new optional field there does not invalidate shipped builds.
    """
    fields = (
        "env_id",
        "env_kwargs",
        "algo",
        "hyperparams",
        "train_steps",
        "n_envs",
        "seed",
        "wrappers",
        "max_episode_steps",
    )
    payload = {"training_version": TRAINING_VERSION, **s.model_dump(mode="json", include=set(fields))}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def default_cache_dir(kb: str | Path | None = None) -> Path:
    """``<kb>/scenarios`` when a KB path is given, else ``~/.cache/remedy/scenarios``."""
    if kb is not None:
        return Path(kb) / "scenarios"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "remedy" / "scenarios"


def _read_build(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((path / BUILD_JSON).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _valid_build(path: Path, s: Scenario) -> dict[str, Any] | None:
    info = _read_build(path)
    if info is None or info.get("hash") != scenario_hash(s) or not (path / "model.zip").is_file():
        return None
    return info


def bundled_checkpoint(s: Scenario) -> RunDir | None:
    """The shipped run directory of ``s`` when one exists and matches its current hash."""
    path = CHECKPOINT_DIR / s.name
    if _valid_build(path, s) is None:
        return None
    try:
        return RunDir.load(path)
    except RunDirError:
        return None


@dataclass(frozen=True)
class BuiltScenario:
    """A built patient: its run directory and how it was obtained."""

    scenario: Scenario
    run: RunDir
    cached: bool
    source: str  # "bundled", "cache" or "trained"
    wall_time_s: float
    success_rate: float | None


def patient_success_rate(run: RunDir, n_episodes: int, seed: int = 10_000) -> float:
    """Fraction of deterministic episodes on the ORIGINAL task that meet the run's success definition."""
    from ..evidence.rollouts import rollout

    vn = None
    if run.vecnormalize_path is not None:
        from stable_baselines3.common.vec_env import DummyVecEnv

        vn = run.load_vecnormalize(DummyVecEnv([run.make_env]))
    records = rollout(
        run.load_model(),
        lambda: run.make_env(for_evaluation=True),
        n_episodes=n_episodes,
        seed=seed,
        success=run.config.success,
        keep_trajectories=0,
        vecnormalize=vn,
    )
    return sum(bool(r.success) for r in records) / max(1, len(records))


def _write_build(path: Path, s: Scenario, wall: float, success: float | None) -> None:
    """The build record: what the patient was built from, and the fine-tuning budget it declares (the run
    carries it, so verifying the run needs no scenario: ``verification.declared_budget``)."""
    info = {
        "scenario": s.name,
        "hash": scenario_hash(s),
        "train_steps": s.train_steps,
        "finetune_budget": s.finetune_budget,
        "seed": s.seed,
        "wall_time_s": round(wall, 2),
        "success_rate": success,
        "training_version": TRAINING_VERSION,
    }
    (path / BUILD_JSON).write_text(json.dumps(info, indent=2) + "\n")


def _declare_budget(path: Path, s: Scenario, info: dict[str, Any]) -> dict[str, Any]:
    """A found build's record with ``s``'s fine-tuning budget (written back when it lacks it or differs: a build
    from before records carried it, or a budget changed since; the hash leaves the budget out)."""
    if info and info.get("finetune_budget", ...) != s.finetune_budget:
        info = {**info, "finetune_budget": s.finetune_budget}
        tmp = path / f"{BUILD_JSON}.tmp{os.getpid()}"
        try:
            tmp.write_text(json.dumps(info, indent=2) + "\n")
            tmp.replace(path / BUILD_JSON)  # atomic: a concurrent reader never sees half a record (and retrains)
        except OSError:  # a read-only install: this call still has the budget, the record stays as it was
            tmp.unlink(missing_ok=True)
    return info


def build_scenario(
    s: Scenario,
    cache_dir: str | Path | None = None,
    *,
    force: bool = False,
    progress: Callable[[int, int], None] | None = None,
    evaluate: bool = True,
) -> BuiltScenario:
    """Train ``s``'s patient unless a shipped or cached build with the same hash exists (``force`` retrains)."""
    if not force:
        found = _found(s, cache_dir)
        if found is not None:
            return found
    from .training import train  # heavy imports only when training

    target = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = target / f"{s.name}-{scenario_hash(s)}"
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    start = time.perf_counter()
    try:
        train(s.run_config(), tmp, seed=s.seed, progress=progress)
        wall = time.perf_counter() - start
        success = patient_success_rate(RunDir.load(tmp), s.eval_episodes) if evaluate else None
        _write_build(tmp, s, wall, success)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)  # atomic on one filesystem: a half-built patient is never found by the cache
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed build leaves no .tmp<PID> folder in the cache
    return BuiltScenario(s, RunDir.load(target), cached=False, source="trained", wall_time_s=wall, success_rate=success)


def _found(s: Scenario, cache_dir: str | Path | None) -> BuiltScenario | None:
    run = bundled_checkpoint(s)
    source = "bundled"
    if run is None:
        base = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        path = base / f"{s.name}-{scenario_hash(s)}"
        if _valid_build(path, s) is None:
            return None
        run, source = RunDir.load(path), "cache"
    run = _blind(run, s)
    info = _declare_budget(run.path, s, _read_build(run.path) or {})
    return BuiltScenario(
        s,
        run,
        cached=True,
        source=source,
        wall_time_s=float(info.get("wall_time_s", 0.0)),
        success_rate=info.get("success_rate"),
    )


def find_built(s: Scenario, cache_dir: str | Path | None = None) -> BuiltScenario | None:
    """The shipped or cached build of ``s`` when one exists with its current hash; never trains."""
    return _found(s, cache_dir)


def build(
    s: Scenario,
    cache_dir: str | Path | None = None,
    force: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> RunDir:
    """The patient's run directory: shipped, cached by :func:`scenario_hash`, or trained now."""
    return build_scenario(s, cache_dir, force=force, progress=progress).run
