"""Run directories: how a user hands Remedy a trained agent.

Layout (see README "Run directories")::

    RUN_DIR/
      run.yaml            RunConfig: env, algorithm, training, setup wrappers, success definition
      model.zip           SB3 / sb3-contrib checkpoint (``model.save``)
      vecnormalize.pkl    optional, VecNormalize statistics (also vec_normalize.pkl, or either
                          under <env_id>/ as RL Zoo keeps them; ``vecnormalize:`` in run.yaml names another)
      *monitor.csv        optional, SB3 Monitor episode logs (any depth)
      progress.csv        optional, SB3 CSV logger / RemedyRunCallback output (any depth)
      events.out.tfevents.*  optional, TensorBoard scalars (any depth)

:meth:`RunDir.load` validates the directory and ``run.yaml`` up front so a
mistake surfaces as one clear line, before anything is rolled out or trained.
A run directory is untrusted by default: its checkpoint and statistics are
loaded without unpickling anything they carry and a ``module:`` env id imports
nothing (see :mod:`.checkpoint`); ``trust=True`` (``--trust-checkpoint``) is for
a user's own files.
"""

from __future__ import annotations

import difflib
import hashlib
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import yaml
from pydantic import BaseModel, ConfigDict, Field

from ..algos import ALGOS, AlgoName, get_algo
from ..errors import CheckpointError, RunDirError
from ..model import Subject
from ..success import SuccessSpec
from ..yamlfile import load_yaml_model
from .checkpoint import MAX_DATA_BYTES, check_zip, load_checkpoint, load_vecnormalize, read_data
from .constraints import Constraint
from .envs import check_env_id, check_spaces, env_traits, make_env
from .wrappers import WRAPPERS, WrapperSpec

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm

__all__ = [
    "RUN_YAML",
    "MODEL_ZIP",
    "VECNORMALIZE_PKL",
    "VECNORMALIZE_NAMES",
    "RunConfig",
    "RunDir",
    "write_run_dir",
    "write_run_yaml",
    "sha256_file",
    "reward_setup_text",
    "visible_wrappers",
]

RUN_YAML = "run.yaml"
MODEL_ZIP = "model.zip"
VECNORMALIZE_PKL = "vecnormalize.pkl"
#: names VecNormalize statistics go by (SB3 docs and RL Zoo; Hugging Face model folders).
VECNORMALIZE_NAMES = (VECNORMALIZE_PKL, "vec_normalize.pkl")


class RunConfig(BaseModel):
    """Contents of ``run.yaml``: everything needed to rebuild the agent's training setup."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    env_id: str
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    algo: AlgoName
    hyperparams: dict[str, Any] = Field(default_factory=dict)
    train_steps: int | None = Field(None, ge=0)
    n_envs: int = Field(1, ge=1)
    wrappers: list[WrapperSpec] = Field(default_factory=list)
    reward_ref: str | None = None
    success: SuccessSpec
    constraints: list[Constraint] = Field(default_factory=list)
    max_episode_steps: int | None = Field(None, gt=0)
    seed: int | None = None
    #: trained with VecNormalize: true refuses to roll out without its statistics, false ignores any found.
    normalize: bool | None = None
    #: where the statistics are, relative to the run directory, when not under a usual name
    vecnormalize: str | None = None
    notes: str = ""

    def to_yaml(self) -> str:
        """YAML text of this config (what ``run.yaml`` holds)."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    @classmethod
    def from_yaml_file(cls, path: Path) -> RunConfig:
        """Read and validate ``run.yaml``; errors name the field."""
        return load_yaml_model(path, cls, RunDirError, "with env_id, algo and success; see README 'Run directories'")


def _check_wrapper_kinds(path: Path, config: RunConfig) -> None:
    # the registry may grow at run time, so kinds are checked on load rather than in the model
    for i, spec in enumerate(config.wrappers):
        if spec.kind not in WRAPPERS:
            close = difflib.get_close_matches(spec.kind, list(WRAPPERS), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; known kinds: {', '.join(WRAPPERS)}"
            raise RunDirError(f"{path}: field 'wrappers.{i}.kind': unknown wrapper kind '{spec.kind}'{hint}")


def reward_setup_text(config: RunConfig) -> str | None:
    """The run's reward reference, else a description of its reward-changing setup wrappers, else None.

    Hidden (fault) wrappers of a bench patient are left out: they are the answer key.
    """
    if config.reward_ref:
        return config.reward_ref
    parts = [
        w.describe() for w in visible_wrappers(config) if w.kind in WRAPPERS and WRAPPERS[w.kind].affects == "reward"
    ]
    return "env reward with " + " + ".join(parts) if parts else None


def visible_wrappers(config: RunConfig) -> list[WrapperSpec]:
    """The user-declared setup wrappers (what a diagnoser may read); hidden fault wrappers excluded."""
    return [w for w in config.wrappers if not w.hidden]


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _inside(path: Path, root: Path) -> bool:
    """True when ``path`` (symlinks resolved) stays under ``root``: run.yaml cannot point outside its directory."""
    try:
        return path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):
        return False


def _find(root: Path, pattern: str) -> list[Path]:
    return sorted(p for p in root.rglob(pattern) if p.is_file())


# What a checkpoint's "data" entry says about the class that saved it: attributes only some
# algorithms keep (present -> one of these; absent -> none of these), and the module of the
# policy class. TD3 and DDPG save the same things, so they cannot be told apart.
_SAVED_BY = (
    ("cg_max_steps", {"TRPO"}),
    ("n_delta", {"ARS"}),
    ("n_quantiles", {"QRDQN"}),
    ("top_quantiles_to_drop_per_net", {"TQC"}),
    ("clip_range", {"PPO", "RecurrentPPO", "MaskablePPO"}),
    ("exploration_fraction", {"DQN", "QRDQN"}),
    ("policy_delay", {"TD3", "DDPG", "CrossQ"}),
    ("target_entropy", {"SAC", "TQC", "CrossQ"}),
    ("gae_lambda", {"PPO", "A2C", "TRPO", "RecurrentPPO", "MaskablePPO"}),
)
_POLICY_MODULES = {
    "stable_baselines3.common.policies": {"PPO", "A2C", "TRPO"},
    "stable_baselines3.dqn.policies": {"DQN"},
    "stable_baselines3.sac.policies": {"SAC"},
    "stable_baselines3.td3.policies": {"TD3", "DDPG"},
    "sb3_contrib.qrdqn.policies": {"QRDQN"},
    "sb3_contrib.tqc.policies": {"TQC"},
    "sb3_contrib.ars.policies": {"ARS"},
    "sb3_contrib.crossq.policies": {"CrossQ"},
    "sb3_contrib.common.recurrent.policies": {"RecurrentPPO"},
    "sb3_contrib.common.maskable.policies": {"MaskablePPO"},
}


def checkpoint_algos(data: dict) -> set[str]:
    """The algorithms that could have saved a checkpoint whose ``data`` entry is ``data``.

    Empty when nothing fits (a custom algorithm or an SB3 version that saves other attributes):
    then nothing can be said, and callers must not refuse the checkpoint on that basis.
    """
    found = set(ALGOS)
    for key, algos in _SAVED_BY:
        found = found & algos if key in data else found - algos
    policy = data.get("policy_class")
    module = policy.get("__module__") if isinstance(policy, dict) else None
    if module in _POLICY_MODULES:
        found &= _POLICY_MODULES[module]
    return found


class RunDir:
    """A validated run directory: its config, checkpoint and log files."""

    def __init__(self, path: Path, config: RunConfig, *, trust: bool = False):
        self.path = Path(path)
        self.config = config
        #: the user vouched for these files (--trust-checkpoint): SB3 may unpickle them
        self.trusted = trust

    # -- loading --------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path, *, trust: bool = False) -> RunDir:
        """Validate ``path`` as a run directory (run.yaml valid, model.zip a readable SB3 zip).

        ``trust`` lets the checkpoint and statistics be unpickled as SB3 does and a ``module:``
        env id be imported: only for a user's own files (``--trust-checkpoint``), never the service.
        """
        path = Path(path)
        if not path.is_dir():
            what = "does not exist" if not path.exists() else "is not a directory"
            raise RunDirError(f"{path} {what}; a run directory holds run.yaml and model.zip")
        if not (path / RUN_YAML).is_file():
            raise RunDirError(f"{path} has no {RUN_YAML}; it is not a run directory (see README 'Run directories')")
        config = RunConfig.from_yaml_file(path / RUN_YAML)
        check_env_id(config.env_id, trust=trust)  # unknown ids fail here, before any rollout
        _check_wrapper_kinds(path / RUN_YAML, config)
        run = cls(path, config, trust=trust)
        run._check_checkpoint()
        run._check_normalization()
        return run

    def _check_checkpoint(self) -> None:
        mp = self.model_path
        if not mp.is_file():
            raise CheckpointError(f"{mp} is missing; save the agent with model.save('{mp}')")
        if not zipfile.is_zipfile(mp):
            raise CheckpointError(
                f"{mp} is not a zip file (corrupt or not an SB3 checkpoint); save it again with model.save()"
            )
        check_zip(mp)  # entries read as streams: a zip bomb is refused at the cap, a bad CRC as corrupt
        try:
            with zipfile.ZipFile(mp) as zf:
                names = set(zf.namelist())
        except (zipfile.BadZipFile, OSError) as ex:
            raise CheckpointError(f"{mp} is corrupt ({ex}); save it again with model.save()") from ex
        if "data" not in names:
            raise CheckpointError(f"{mp} is not a complete SB3 checkpoint (missing or damaged entries); save it again")
        self._check_algo(mp)

    def _check_algo(self, mp: Path) -> None:
        """Refuse a checkpoint saved by another algorithm than run.yaml declares (PPO declared as A2C)."""
        try:
            data = read_data(mp, max_bytes=MAX_DATA_BYTES)
        except CheckpointError:
            return  # an unreadable data entry is the loader's to explain
        found = checkpoint_algos(data)
        declared = self.config.algo
        if found and declared not in found:
            saved = " or ".join(sorted(found))
            raise CheckpointError(
                f"{mp} was saved by {saved}, but {self.path / RUN_YAML} declares algo: {declared}; "
                f"set algo to {sorted(found)[0]} (or point at the right checkpoint)"
            )

    # -- files ------------------------------------------------------------
    @property
    def model_path(self) -> Path:
        """The checkpoint file."""
        return self.path / MODEL_ZIP

    def vecnormalize_candidates(self) -> list[Path]:
        """Where statistics are looked for, in order: ``vecnormalize:`` from run.yaml, then the usual names
        in the run directory and in ``<env_id>/`` (RL Zoo's layout)."""
        found = [self.path / self.config.vecnormalize] if self.config.vecnormalize else []
        env_id = self.config.env_id
        folders = [self.path] + [self.path / name for name in dict.fromkeys((env_id, env_id.split(":")[-1]))]
        found += [folder / name for folder in folders for name in VECNORMALIZE_NAMES]
        return [p for p in found if _inside(p, self.path)]

    @property
    def vecnormalize_path(self) -> Path | None:
        """VecNormalize statistics to roll out with: the first candidate found; None when run.yaml says
        ``normalize: false`` (rolled out raw on purpose) or when none is there."""
        if self.config.normalize is False:
            return None
        return next((p for p in self.vecnormalize_candidates() if p.is_file()), None)

    def _check_normalization(self) -> None:
        """Refuse a run that says it trained with VecNormalize when no statistics can be found."""
        if self.config.normalize and self.vecnormalize_path is None:
            looked = ", ".join(str(p.relative_to(self.path)) for p in self.vecnormalize_candidates())
            raise RunDirError(
                f"{self.path / RUN_YAML} says normalize: true, but no VecNormalize statistics are in {self.path} "
                f"(looked for {looked}); copy them there, name them with 'vecnormalize: PATH', or set "
                "normalize: false to roll out without normalization"
            )

    @property
    def monitor_files(self) -> list[Path]:
        """SB3 Monitor CSVs anywhere under the directory."""
        return _find(self.path, "*monitor.csv")

    @property
    def progress_files(self) -> list[Path]:
        """``progress.csv`` files (SB3 CSV logger / RemedyRunCallback)."""
        return _find(self.path, "progress.csv")

    @property
    def tensorboard_files(self) -> list[Path]:
        """TensorBoard event files."""
        return _find(self.path, "events.out.tfevents.*")

    @property
    def has_logs(self) -> bool:
        """True when any training log is present."""
        return bool(self.monitor_files or self.progress_files or self.tensorboard_files)

    def checkpoint_sha256(self) -> str:
        """SHA-256 of model.zip."""
        return sha256_file(self.model_path)

    # -- building ----------------------------------------------------------
    def make_env(self, *, for_evaluation: bool = False, seed: int | None = None) -> gym.Env:
        """The run's env with its setup wrappers (reward-only ones dropped when ``for_evaluation``)."""
        c = self.config
        return make_env(
            c.env_id,
            c.env_kwargs,
            wrappers=c.wrappers,
            for_evaluation=for_evaluation,
            max_episode_steps=c.max_episode_steps,
            seed=seed,
        )

    def load_model(self, env: Any = None, device: str = "cpu", **overrides: Any):
        """Load the checkpoint with its algorithm class; spaces are checked against the run's env.

        ``env`` (a gym env or VecEnv) is attached for fine-tuning; ``overrides`` are
        passed to ``Algo.load`` (e.g. ``learning_rate=1e-4``). Untrusted runs are loaded
        without unpickling anything from the zip (:func:`.checkpoint.load_checkpoint`).
        """
        algo_cls = get_algo(self.config.algo)
        probe = env if env is not None else self.make_env()
        try:
            if not self.trusted:
                return self._load(algo_cls, env, device, spaces_env=probe, **overrides)
            model = self._load(algo_cls, None, device)
            check_spaces(model, probe)
        finally:
            if env is None:
                probe.close()
        if env is None and not overrides:
            return model
        return self._load(algo_cls, env, device, **overrides)

    def _load(self, algo_cls: type[BaseAlgorithm], env: Any, device: str, spaces_env: Any = None, **overrides: Any):
        try:
            if spaces_env is not None:
                hp = self.config.hyperparams
                return load_checkpoint(
                    self.model_path,
                    algo_cls,
                    spaces_env=spaces_env,
                    env=env,
                    device=device,
                    hyperparams=hp,
                    **overrides,
                )
            check_zip(self.model_path)
            return algo_cls.load(str(self.model_path), env=env, device=device, **overrides)
        except CheckpointError:
            raise
        except (
            ValueError,
            KeyError,
            RuntimeError,
            zipfile.BadZipFile,
            EOFError,
            OSError,
            AttributeError,
            TypeError,
        ) as ex:
            first = str(ex).splitlines()[0] if str(ex) else type(ex).__name__
            raise CheckpointError(
                f"cannot load {self.model_path} as {self.config.algo}: {first}; check 'algo' in run.yaml"
            ) from ex

    def load_vecnormalize(self, venv: Any, *, evaluation: bool = True):
        """Wrap ``venv`` in the saved VecNormalize statistics, or return it as is when there are none.

        ``evaluation`` freezes them as SB3 evaluates (``training=False``, ``norm_reward=False``);
        fine-tuning passes False to keep the saved flags. Untrusted statistics are unpickled with
        an allow-list (:func:`.checkpoint.load_vecnormalize`).
        """
        path = self.vecnormalize_path
        if path is None:
            return venv
        return load_vecnormalize(path, venv, trust=self.trusted, evaluation=evaluation)

    def subject(self) -> Subject:
        """The case's subject part for this run (checkpoint hash and env traits included)."""
        c = self.config
        return Subject(
            env_id=c.env_id,
            env_kwargs=c.env_kwargs,
            algo=c.algo,
            hyperparams=c.hyperparams,
            train_steps=c.train_steps,
            checkpoint_sha256=self.checkpoint_sha256(),
            reward_ref=reward_setup_text(c),
            success=c.success.describe(),
            traits=env_traits(c.env_id, c.env_kwargs),
        )

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r}, env={self.config.env_id!r}, algo={self.config.algo!r})"


def write_run_yaml(path: str | Path, config: RunConfig) -> Path:
    """Write ``run.yaml`` into ``path`` (created if needed)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    target = path / RUN_YAML
    target.write_text(config.to_yaml())
    return target


def write_run_dir(path: str | Path, model: Any, config: RunConfig, vecnormalize: Any = None) -> RunDir:
    """Save ``model`` (and VecNormalize statistics) with ``run.yaml`` as a run directory."""
    path = Path(path)
    write_run_yaml(path, config)
    model.save(str(path / MODEL_ZIP))
    if vecnormalize is not None:
        vecnormalize.save(str(path / VECNORMALIZE_PKL))
    return RunDir(path, config)
