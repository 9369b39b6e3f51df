"""Adopt an agent trained elsewhere: an SB3 zip, an RL Zoo log folder or a Hugging Face SB3 model folder.

:func:`adopt` reads what the files themselves say -- algorithm, hyperparameters, steps trained,
number of envs, env id and kwargs, whether training normalized observations -- and writes a
Remedy run directory (``run.yaml``, ``model.zip``, ``vecnormalize.pkl``, ``logs/``), then validates
it with :meth:`RunDir.load`. Every file looked at is reported as used or ignored, with why.

Everything read here is untrusted (docs/security.md): nothing is unpickled (a
checkpoint's ``data`` entry is JSON and only its plain values are read; normalization pickles are
copied, never opened), RL Zoo's OrderedDict YAML is read with a SafeLoader that builds only plain
data, RL Zoo's ``normalize: "dict(norm_obs=True)"`` strings are parsed, never evaluated, and every
read is bounded.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
from pydantic import BaseModel, ConfigDict
from pydantic import ValidationError as PydanticValidationError

from ..algos import ALGOS, canonical_algo, constructor_hyperparams
from ..errors import AlgorithmError, CheckpointError, RunDirError
from ..success import ReturnThreshold, SuccessSpec
from ..yamlfile import first_error
from .checkpoint import check_zip, read_data
from .envs import check_env_id, make_env
from .foreign import (
    SUCCESS_FORMS,
    CheckpointFacts,
    checkpoint_facts,
    evaluations_summary,
    literal_kwargs,
    load_zoo_yaml,
    model_card_names,
    normalize_setting,
    parse_success_option,
    unpack_logs,
)
from .rundir import MODEL_ZIP, VECNORMALIZE_PKL, RunConfig, RunDir, write_run_yaml

__all__ = ["AdoptedFile", "AdoptResult", "adopt", "STATS_NAMES"]

#: names normalization statistics go by: SB3/RL Zoo, Hugging Face (huggingface_sb3, rl_zoo3 push_to_hub)
STATS_NAMES = ("vecnormalize.pkl", "vec_normalize.pkl")
#: how deep a folder is walked, and how many files are looked at, before the rest is left unread
_MAX_DEPTH = 4
_MAX_FILES = 2000
#: RL Zoo algorithm folder names that are not Remedy's names
#: RL Zoo's push_to_hub packs evaluations.npz and the monitor CSVs into this archive
_METRICS_ZIP = "train_eval_metrics.zip"
_ZOO_ALGOS = {"ppo_lstm": "RecurrentPPO", "ppo_mask": "MaskablePPO"}


class AdoptedFile(BaseModel):
    """One file the adoption looked at: what it is, whether it was used, and what was read or why not."""

    model_config = ConfigDict(frozen=True)
    path: str
    role: str
    used: bool
    note: str = ""
    copied_to: str | None = None


class AdoptResult(BaseModel):
    """What :func:`adopt` wrote: the run directory, its config, the source's layout and every file it looked at."""

    model_config = ConfigDict(frozen=True)
    run_dir: str
    source: str
    layout: Literal["zip", "folder", "zoo", "huggingface"]
    config: RunConfig
    files: list[AdoptedFile]
    warnings: list[str] = []


def _default_success(env_id: str) -> SuccessSpec:
    threshold = getattr(gym.spec(env_id), "reward_threshold", None) if ":" not in env_id else None
    if threshold is None:
        raise RunDirError(
            f"env '{env_id}' defines no reward_threshold, so Remedy cannot tell what success means for it; "
            f"pass --success, one of {SUCCESS_FORMS}"
        )
    return ReturnThreshold(threshold=float(threshold))


# --------------------------------------------------------------------------- finding files


def _is_checkpoint(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as zf:
            return "data" in zf.namelist()
    except (zipfile.BadZipFile, OSError):
        return False


def _walk(root: Path) -> tuple[list[Path], bool]:
    """Files under ``root`` (relative, sorted), at most :data:`_MAX_DEPTH` deep and :data:`_MAX_FILES` many."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        dirnames[:] = sorted(d for d in dirnames if d != ".git" and len(rel.parts) < _MAX_DEPTH)
        found.extend(rel / f for f in sorted(filenames))
        if len(found) > _MAX_FILES:
            return sorted(found[:_MAX_FILES]), True
    return sorted(found), False


def _is_model_card(path: Path) -> bool:
    """A README that a Hub SB3 upload writes (it names the library), not any README next to a zip."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "stable-baselines3" in f.read(65536)
    except OSError:
        return False


class _Source:
    """The source folder's files, its layout, and what was decided about each file."""

    def __init__(self, root: Path, files: list[Path], checkpoint: Path | None) -> None:
        self.root = root
        self.files = files
        self.params_dir = self._params_dir()
        self.layout = self._layout()
        self.checkpoint = checkpoint or self._choose_checkpoint()
        self.report: dict[Path, AdoptedFile] = {}

    def _params_dir(self) -> Path | None:
        """Where RL Zoo's config.yml / args.yml lie: ``<env>/`` in a log folder, the top in a Hub folder."""
        dirs = sorted({f.parent for f in self.files if f.name in ("config.yml", "args.yml") and len(f.parts) <= 2})
        return dirs[0] if dirs else None

    def _layout(self) -> Literal["folder", "zoo", "huggingface"]:
        names = {f.name for f in self.files if len(f.parts) == 1}
        if self.params_dir is not None and self.params_dir != Path("."):
            return "zoo"
        if "README.md" in names or "config.json" in names or self.params_dir is not None:
            return "huggingface"
        return "folder"

    def _choose_checkpoint(self) -> Path:
        zips = [f for f in self.files if len(f.parts) == 1 and f.suffix == ".zip" and _is_checkpoint(self.root / f)]
        zips = [f for f in zips if not re.fullmatch(r"rl_model_\d+_steps\.zip", f.name)]
        if not zips:
            raise RunDirError(f"{self.root} holds no SB3 checkpoint (a .zip saved with model.save()); point at the zip")
        env_name = self.params_dir.name if self.params_dir not in (None, Path(".")) else None
        final = [f for f in zips if env_name and f.stem == env_name]
        rest = [f for f in zips if f.name != "best_model.zip"]
        if final:
            return final[0]
        if len(rest) == 1:
            return rest[0]
        if not rest:
            return zips[0]  # only best_model.zip: training stopped before the final save
        names = ", ".join(f.name for f in rest)
        raise RunDirError(f"{self.root} holds several checkpoints ({names}); pass the one to adopt as PATH")

    def mark(self, rel: Path, role: str, used: bool, note: str = "", copied_to: str | None = None) -> None:
        """Record what was decided about ``rel``."""
        self.report[rel] = AdoptedFile(path=str(self.root / rel), role=role, used=used, note=note, copied_to=copied_to)


def _source_of(path: Path) -> _Source | None:
    """The folder ``path`` is, or the Zoo/Hub folder around the zip ``path``; None for a zip on its own."""
    if path.is_dir():
        files, truncated = _walk(path)
        src = _Source(path, files, None)
        if truncated:
            src.mark(Path("..."), "other", False, f"more than {_MAX_FILES} files; the rest were not looked at")
        return src
    if path.suffix != ".zip":
        raise RunDirError(f"{path} is neither a folder nor a .zip; point at an SB3 checkpoint or a run folder")
    parent = path.parent
    around = {p.name for p in parent.iterdir()} if parent.is_dir() else set()
    zoo_like = any((parent / d / n).is_file() for d in around for n in ("config.yml", "args.yml"))
    hub_like = bool(around & {"config.json", "config.yml", "args.yml"}) or _is_model_card(parent / "README.md")
    if zoo_like or hub_like:
        files, _ = _walk(parent)
        return _Source(parent, files, path.relative_to(parent))
    return None


# --------------------------------------------------------------------------- deciding the config


class _Facts:
    """What the files say, gathered before the config is built (later sources never override earlier ones)."""

    def __init__(self) -> None:
        self.algo: tuple[str, str] | None = None  # (name, where it was read)
        self.env_id: tuple[str, str] | None = None
        self.env_kwargs: dict[str, Any] | None = None
        self.normalize: tuple[bool, str] | None = None
        self.n_envs: int | None = None
        self.train_steps: int | None = None
        self.seed: int | None = None
        self.hyperparams: dict[str, Any] = {}
        self.notes: list[str] = []
        self.warnings: list[str] = []

    def set_algo(self, name: Any, where: str) -> None:
        if self.algo is None and isinstance(name, str) and name:
            key = _ZOO_ALGOS.get(name.lower(), name)
            try:
                self.algo = (canonical_algo(key), where)
            except AlgorithmError:
                self.warnings.append(f"{where} names algorithm '{name}', which Remedy does not know")

    def set_env(self, env_id: Any, where: str) -> None:
        if self.env_id is None and isinstance(env_id, str) and env_id.strip():
            self.env_id = (env_id.strip(), where)


def _take_checkpoint(ck: CheckpointFacts, facts: _Facts) -> None:
    """The checkpoint's own values come first: they are what SB3 actually trained with."""
    facts.train_steps, facts.n_envs, facts.seed = ck.train_steps, ck.n_envs, ck.seed
    facts.hyperparams = dict(ck.hyperparams)
    facts.notes.extend(ck.notes)


def _read_zoo_config(src: _Source, rel: Path, facts: _Facts) -> str:
    cfg = load_zoo_yaml(src.root / rel)
    facts.normalize = normalize_setting(cfg.get("normalize", False))
    if isinstance(cfg.get("env_kwargs"), dict) and facts.env_kwargs is None:
        facts.env_kwargs = cfg["env_kwargs"]
    if facts.n_envs is None and isinstance(cfg.get("n_envs"), int):
        facts.n_envs = cfg["n_envs"]
    if facts.train_steps is None and isinstance(cfg.get("n_timesteps"), (int, float)):
        facts.train_steps = int(cfg["n_timesteps"])
    if "policy" not in facts.hyperparams and isinstance(cfg.get("policy"), str):
        facts.hyperparams["policy"] = cfg["policy"]
    if "policy_kwargs" not in facts.hyperparams and isinstance(cfg.get("policy_kwargs"), str):
        parsed = literal_kwargs(cfg["policy_kwargs"])
        if parsed and parsed[0]:
            facts.hyperparams["policy_kwargs"] = parsed[0]
            if parsed[1]:
                facts.notes.append(f"policy_kwargs {', '.join(parsed[1])} not read (not literals)")
    for key in ("frame_stack", "env_wrapper", "vec_env_wrapper"):
        if cfg.get(key):
            facts.warnings.append(
                f"RL Zoo trained with {key}: {cfg[key]}; Remedy rolls out without it, "
                "so a changed observation is refused when the agent is loaded"
            )
            facts.notes.append(f"trained with {key}: {cfg[key]}")
    return facts.normalize[1] + (f", n_envs={cfg['n_envs']}" if "n_envs" in cfg else "")


def _read_zoo_args(src: _Source, rel: Path, facts: _Facts) -> str:
    args = load_zoo_yaml(src.root / rel)
    facts.set_algo(args.get("algo"), str(rel))
    facts.set_env(args.get("env"), str(rel))
    if isinstance(args.get("env_kwargs"), dict) and facts.env_kwargs is None:
        facts.env_kwargs = args["env_kwargs"]
    if facts.seed is None and isinstance(args.get("seed"), int) and args["seed"] >= 0:
        facts.seed = args["seed"]
    return f"algo={args.get('algo')}, env={args.get('env')}"


def _read_model_card(src: _Source, rel: Path, facts: _Facts) -> str:
    """Algorithm and env id from a Hub model card."""
    algo, env = model_card_names((src.root / rel).read_text(encoding="utf-8", errors="replace"))
    facts.set_algo(algo, str(rel))
    facts.set_env(env, str(rel))
    return f"algorithm {algo or '?'}, env {env or '?'}"


def _zoo_path_hints(src: _Source, facts: _Facts) -> None:
    """``logs/<algo>/<env>_<n>/``: the folder names say the algorithm and the env."""
    if src.layout != "zoo":
        return
    facts.set_algo(src.root.resolve().parent.name, "the RL Zoo folder name")
    if src.params_dir is not None:
        facts.set_env(src.params_dir.name, "the RL Zoo folder name")


def _choose_algo(facts: _Facts, saved: set[str], algo: str | None, model: Path) -> str:
    """``--algo``, else what the files name, else what only one algorithm saves; checked against the checkpoint."""
    chosen, where = (canonical_algo(algo), "--algo") if algo else (facts.algo or (None, ""))
    if chosen is None:
        if len(saved) == 1:
            return next(iter(saved))
        could = f" (it could be {' or '.join(sorted(saved))})" if saved else ""
        raise RunDirError(f"cannot tell which algorithm saved {model}{could}; pass --algo, one of {', '.join(ALGOS)}")
    if saved and chosen not in saved:
        raise CheckpointError(
            f"{model} was saved by {' or '.join(sorted(saved))}, but {where} says {chosen}; "
            f"pass --algo {sorted(saved)[0]} (or point at the right checkpoint)"
        )
    return chosen


def _choose_env(facts: _Facts, env: str | None, model: Path) -> str:
    """``--env``, else the id the files name (one that would import a module is refused); must be registered."""
    if env:
        check_env_id(env)
        return env
    if facts.env_id is None:
        raise RunDirError(f"an SB3 checkpoint does not record its env id ({model}); pass --env, e.g. --env CartPole-v1")
    env_id, where = facts.env_id
    if ":" in env_id:  # "module:Env-v0" imports a module; a file must not choose one
        raise RunDirError(f"{where} names env '{env_id}', which imports a module; pass --env {env_id} if you trust it")
    check_env_id(env_id)
    return env_id


def _check_space_kinds(ck: CheckpointFacts, env_id: str, env_kwargs: dict[str, Any], model: Path) -> None:
    """Refuse an env whose space types differ from the checkpoint's (Box vs Discrete), before anything is written.

    Only the types can be compared without unpickling the saved spaces; shapes are checked when the
    agent is loaded for a rollout.
    """
    if ck.observation_space is None and ck.action_space is None:
        return
    env = make_env(env_id, env_kwargs)
    try:
        actual = {"observation": type(env.observation_space).__name__, "action": type(env.action_space).__name__}
    finally:
        env.close()
    for what, saved in (("observation", ck.observation_space), ("action", ck.action_space)):
        if saved is not None and saved != actual[what]:
            raise CheckpointError(
                f"{model} was trained with a {saved} {what} space, but {env_id} has a {actual[what]} one; "
                "pass the env it was trained on with --env"
            )


# --------------------------------------------------------------------------- the whole adoption


def _classify(src: _Source, facts: _Facts) -> tuple[Path | None, list[Path]]:
    """Mark every file used or ignored; returns (normalization stats to copy, logs to copy)."""
    # the Zoo's <env>/vecnormalize.pkl first, then one at the top (the Hub's vec_normalize.pkl)
    stats = [f for f in src.files if f.name in STATS_NAMES and (f.parent == src.params_dir or len(f.parts) == 1)]
    chosen = min(stats, key=lambda f: (f.parent != src.params_dir, str(f))) if stats else None
    logs: list[Path] = []
    readers = {"config.yml": _read_zoo_config, "args.yml": _read_zoo_args, "env_kwargs.yml": _read_env_kwargs}
    for rel in src.files:
        if rel == src.checkpoint:
            continue
        name = rel.name
        if rel.parent == src.params_dir and name in readers:
            try:
                src.mark(rel, "RL Zoo " + name, True, readers[name](src, rel, facts))
            except (RunDirError, OSError) as ex:
                src.mark(rel, "RL Zoo " + name, False, f"unreadable: {ex}")
        elif rel == chosen:
            src.mark(rel, "normalization", True, "VecNormalize statistics (copied, not unpickled)", VECNORMALIZE_PKL)
        elif name in STATS_NAMES or name.endswith(".pkl"):
            why = (
                f"another normalization file ({chosen} is used)"
                if name in STATS_NAMES
                else "a pickle Remedy does not read"
            )
            src.mark(rel, "pickle", False, why)
        elif _is_log(name) or (name == _METRICS_ZIP and len(rel.parts) == 1):
            logs.append(rel)
        elif name == "README.md" and len(rel.parts) == 1:
            src.mark(rel, "model card", True, _read_model_card(src, rel, facts))
        else:
            src.mark(rel, "other", False, _ignored_why(src, rel))
    return chosen, logs


def _is_log(name: str) -> bool:
    """Training logs Remedy reads (Monitor, progress.csv, TensorBoard) and EvalCallback's evaluations.npz."""
    return (
        name.endswith("monitor.csv")
        or name in ("progress.csv", "evaluations.npz")
        or name.startswith("events.out.tfevents.")
    )


def _read_env_kwargs(src: _Source, rel: Path, facts: _Facts) -> str:
    kwargs = load_zoo_yaml(src.root / rel)
    if facts.env_kwargs is None:
        facts.env_kwargs = kwargs
    return f"env kwargs {kwargs}"


def _ignored_why(src: _Source, rel: Path) -> str:
    name = rel.name
    if name.endswith(".zip"):
        if name == "best_model.zip":
            return "best-evaluation checkpoint; pass its path to adopt it instead"
        return "another checkpoint; pass its path to adopt it instead"
    known = {
        "config.json": "a copy of the checkpoint's data entry (read from the zip itself)",
        "results.json": "the Hub's evaluation summary (Remedy evaluates for itself)",
        "command.txt": "the training command line (informational)",
    }
    if len(rel.parts) > 1 and rel.parts[0] == src.checkpoint.stem and rel.parent != src.params_dir:
        return "unpacked copy of the checkpoint"  # the Hub folder holds <name>.zip and <name>/ unzipped
    return known.get(name, "not a file Remedy reads")


def _copy_logs(src: _Source, logs: list[Path], dest: Path) -> None:
    """Copy the logs under ``dest/logs`` (a Hub metrics archive unpacked) and mark each as used."""
    for rel in logs:
        if rel.name == _METRICS_ZIP:
            target = Path("logs") / rel.stem
            try:
                names = unpack_logs(src.root / rel, dest / target, _is_log)
                src.mark(rel, "training logs", True, f"unpacked {', '.join(names) or 'nothing'}", f"{target}/")
            except RunDirError as ex:
                src.mark(rel, "training logs", False, f"not unpacked: {ex}")
            continue
        target = Path("logs") / rel
        (dest / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src.root / rel, dest / target)
        role, note = "training log", "copied"
        if rel.name == "evaluations.npz":
            role, note = "evaluations", "copied; " + evaluations_summary(src.root / rel)
        src.mark(rel, role, True, note, str(target))


def _prepare_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RunDirError(f"{out} already exists and is not empty; choose a new --out (nothing was written)")
    out.parent.mkdir(parents=True, exist_ok=True)


def _build_config(facts: _Facts, *, env_id: str, algo: str, success: SuccessSpec, normalize: bool) -> RunConfig:
    notes = list(facts.notes)
    data: dict[str, Any] = dict(
        env_id=env_id,
        env_kwargs=facts.env_kwargs or {},
        algo=algo,
        hyperparams=constructor_hyperparams(algo, facts.hyperparams),
        train_steps=facts.train_steps,
        n_envs=max(1, facts.n_envs or 1),
        success=success,
        seed=facts.seed,
    )
    if normalize:
        if "normalize" in RunConfig.model_fields:
            data["normalize"] = True
        else:
            notes.append("trained with VecNormalize (normalize: true)")
    data["notes"] = "adopted by `remedy adopt`" + ("; " + "; ".join(notes) if notes else "")
    try:
        return RunConfig.model_validate(data)
    except PydanticValidationError as ex:
        raise RunDirError(f"the values read do not make a valid run.yaml: {first_error(ex)}") from None


def adopt(
    path: str | Path,
    out: str | Path,
    *,
    success: str | SuccessSpec | None = None,
    env_id: str | None = None,
    algo: str | None = None,
) -> AdoptResult:
    """Write a run directory at ``out`` for the agent at ``path`` (an SB3 zip, an RL Zoo log folder or a Hub folder).

    ``success`` (``--success`` text or a spec), ``env_id`` and ``algo`` override what the files say.
    Nothing is written unless everything checks out; the result lists every file used or ignored.
    """
    path, out = Path(path), Path(out)
    if not path.exists():
        raise RunDirError(f"{path} does not exist; point at an SB3 .zip, an RL Zoo log folder or a Hub model folder")
    spec = parse_success_option(success) if isinstance(success, str) else success
    src = _source_of(path)
    facts = _Facts()
    model = src.root / src.checkpoint if src is not None else path
    check_zip(model)  # every entry inflated within its cap before anything is read or copied
    ck = checkpoint_facts(read_data(model))
    _take_checkpoint(ck, facts)
    logs: list[Path] = []
    if src is not None:
        stats_rel, logs = _classify(src, facts)
        _zoo_path_hints(src, facts)
        stats = src.root / stats_rel if stats_rel is not None else None
    else:
        stats = next((path.parent / n for n in STATS_NAMES if (path.parent / n).is_file()), None)
    config = _build_config(
        facts,
        env_id=(chosen_env := _choose_env(facts, env_id, model)),
        algo=_choose_algo(facts, ck.algos, algo, model),
        success=spec or _default_success(chosen_env),
        # RL Zoo's `normalize` says so; otherwise statistics shipped with the agent say so
        normalize=facts.normalize[0] if facts.normalize is not None else stats is not None,
    )
    _check_space_kinds(ck, config.env_id, config.env_kwargs, model)
    if facts.normalize is not None and facts.normalize[0] and stats is None:
        raise RunDirError(
            f"{facts.normalize[1]} in the RL Zoo config says the agent trained with VecNormalize, but no statistics "
            f"file ({' or '.join(STATS_NAMES)}) lies in {model.parent} or its <env> folder; copy the one saved at the "
            "end of training there (nothing was written)"
        )
    _prepare_out(out)
    _write(out, model, stats, config, src, logs)
    return AdoptResult(
        run_dir=str(out),
        source=str(path),
        layout=src.layout if src is not None else "zip",
        config=config,
        files=_files_report(src, model, ck.describe(), stats),
        warnings=facts.warnings,
    )


def _write(
    out: Path, model: Path, stats: Path | None, config: RunConfig, src: _Source | None, logs: list[Path]
) -> None:
    """Write into a scratch folder beside ``out``, validate, then move it into place: all or nothing."""
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.adopting-", dir=out.parent))
    try:
        write_run_yaml(scratch, config)
        shutil.copy2(model, scratch / MODEL_ZIP)
        if stats is not None:
            shutil.copy2(stats, scratch / VECNORMALIZE_PKL)
        if src is not None:
            _copy_logs(src, logs, scratch)
        if out.exists():
            out.rmdir()  # checked empty above
        scratch.rename(out)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    try:
        RunDir.load(out)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise


def _files_report(src: _Source | None, model: Path, data_note: str, stats: Path | None) -> list[AdoptedFile]:
    head = AdoptedFile(path=str(model), role="checkpoint", used=True, note=data_note, copied_to=MODEL_ZIP)
    if src is None:
        rest = []
        if stats is not None:
            rest.append(
                AdoptedFile(
                    path=str(stats),
                    role="normalization",
                    used=True,
                    note="VecNormalize statistics beside the zip (copied, not unpickled)",
                    copied_to=VECNORMALIZE_PKL,
                )
            )
        return [head, *rest]
    ordered = sorted(src.report.values(), key=lambda f: (not f.used, f.path))
    return [head, *ordered]
