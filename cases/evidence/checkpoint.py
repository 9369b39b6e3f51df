"""Loading a checkpoint and its normalization statistics without running code that came with them.

A checkpoint is code: SB3 stores every value of its ``data`` entry that is not
plain JSON as a base64 cloudpickle (``":serialized:"``), and ``Algo.load``
unpickles them (SB3 issues #1831, #2281); ``VecNormalize.load`` is a plain
``pickle.load``. The installed SB3 (2.9.x) has no safe mode, so this module:

- reads the zip as streams first and refuses any entry that inflates past a cap
  (a 38 KB upload whose ``data`` inflates to 2 GiB is refused after reading the
  cap, never allocated whole);
- loads through SB3 with ``custom_objects`` that replace EVERY ``:serialized:``
  entry with a value rebuilt from trusted sources: the spaces of the run's own
  env (checked against the shapes the checkpoint records), the policy class from
  the algorithm's own policy aliases, schedules as constants read off their
  recorded text (never evaluated), policy kwargs whose classes are named from an
  allow-list, and other constructor values from ``run.yaml`` hyperparams or the
  algorithm's defaults. SB3 reads the ``.pth`` entries with
  ``torch.load(weights_only=True)``, which unpickles tensors only;
- unpickles ``vecnormalize.pkl`` with an allow-list unpickler that admits only
  what SB3's VecNormalize state holds (the wrapper, RunningMeanStd, numpy arrays
  and dtypes, numpy random state, Gymnasium spaces, OrderedDict).

``trust=True`` (``--trust-checkpoint``, a user's own files; never the service)
lets SB3 unpickle as it normally does.
"""

from __future__ import annotations

import inspect
import json
import math
import pickle
import re
import zipfile
from collections import OrderedDict
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from ..errors import CheckpointError

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm

__all__ = [
    "MAX_DATA_BYTES",
    "MAX_ENTRY_BYTES",
    "MAX_PICKLE_BYTES",
    "TRUST_HINT",
    "check_zip",
    "read_data",
    "serialized_keys",
    "safe_custom_objects",
    "load_checkpoint",
    "load_vecnormalize",
    "restricted_unpickle",
]

#: cap on the inflated ``data`` entry (the JSON of an SB3 checkpoint is a few KB).
MAX_DATA_BYTES = 64 << 20
#: cap on any other inflated entry (policy and optimizer weights).
MAX_ENTRY_BYTES = 512 << 20
#: cap on the number of entries (SB3 writes about six).
MAX_ENTRIES = 256
#: cap on a ``vecnormalize.pkl`` file (statistics of even image observations are a few MB).
MAX_PICKLE_BYTES = 64 << 20
TRUST_HINT = "if this is your own file, pass --trust-checkpoint to load it as SB3 does (it may run code)"

_CHUNK = 1 << 20


# -- the zip as streams ------------------------------------------------------------------------------
def check_zip(path: Path, *, max_data_bytes: int = MAX_DATA_BYTES, max_entry_bytes: int = MAX_ENTRY_BYTES) -> None:
    """Refuse ``path`` unless it is a zip whose entries inflate within the caps and pass their CRC.

    Each entry is read as a stream and counted, so a bomb costs at most the cap in
    time and one chunk in memory, whatever its header claims.
    """
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            if len(infos) > MAX_ENTRIES:
                raise CheckpointError(
                    f"{path} holds {len(infos)} entries (more than {MAX_ENTRIES}); not an SB3 checkpoint"
                )
            for info in infos:
                cap = max_data_bytes if info.filename == "data" else max_entry_bytes
                _check_entry(zf, info, cap, path)
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, RuntimeError) as ex:
        raise CheckpointError(f"{path} is corrupt ({_first_line(ex)}); save it again with model.save()") from ex


def _check_entry(zf: zipfile.ZipFile, info: zipfile.ZipInfo, cap: int, path: Path) -> None:
    too_big = CheckpointError(
        f"{path}: entry '{info.filename}' inflates past {cap >> 20} MiB; refused (a zip bomb or not an SB3 checkpoint)"
    )
    if info.file_size > cap:
        raise too_big
    n = 0
    with zf.open(info) as f:  # the stream checks the CRC at its end
        while chunk := f.read(_CHUNK):
            n += len(chunk)
            if n > cap:
                raise too_big


def read_data(path: Path, *, max_bytes: int = MAX_DATA_BYTES) -> dict[str, Any]:
    """The checkpoint's ``data`` entry parsed as JSON, read at most ``max_bytes`` inflated."""
    try:
        with zipfile.ZipFile(path) as zf, zf.open("data") as f:
            raw = f.read(max_bytes + 1)
    except KeyError as ex:
        raise CheckpointError(f"{path} has no 'data' entry; it is not an SB3 checkpoint") from ex
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, RuntimeError) as ex:
        raise CheckpointError(f"{path} is corrupt ({_first_line(ex)}); save it again with model.save()") from ex
    if len(raw) > max_bytes:
        raise CheckpointError(f"{path}: entry 'data' inflates past {max_bytes >> 20} MiB; refused")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as ex:
        raise CheckpointError(f"{path}: entry 'data' is not valid JSON; save the checkpoint again") from ex
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: entry 'data' is not a JSON object; save the checkpoint again")
    return data


def serialized_keys(data: dict[str, Any]) -> list[str]:
    """Top-level keys SB3 would unpickle (exactly the test ``json_to_data`` applies)."""
    return [k for k, v in data.items() if isinstance(v, dict) and ":serialized:" in v]


def _first_line(ex: BaseException) -> str:
    text = str(ex).strip()
    return text.splitlines()[0] if text else type(ex).__name__


# -- rebuilding every :serialized: entry -------------------------------------------------------------
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_CONSTANT = re.compile(rf"ConstantSchedule\(val=({_NUMBER})\)")
_LINEAR = re.compile(rf"LinearSchedule\(start=({_NUMBER}), end=({_NUMBER}), end_fraction=({_NUMBER})\)")
_LINEAR_KEYS = ("start", "end", "end_fraction")
#: schedules named after another value (SB3 keeps ``lr_schedule`` beside ``learning_rate``).
_SCHEDULE_OF = {"lr_schedule": "learning_rate"}
_CLASS_TEXT = re.compile(r"^<class '([\w.]+)'>$")
_SPACE_NUMBER = re.compile(rf"-?inf|nan|{_NUMBER}")


def _allowed_classes() -> dict[str, type]:
    """Classes a policy_kwargs entry may name: torch activations and optimizers, SB3 feature extractors."""
    import torch
    from stable_baselines3.common import torch_layers

    found: list[type] = [
        c for c in vars(torch.nn.modules.activation).values() if isinstance(c, type) and issubclass(c, torch.nn.Module)
    ]
    found += [c for c in vars(torch.optim).values() if isinstance(c, type) and issubclass(c, torch.optim.Optimizer)]
    found += [
        c
        for c in vars(torch_layers).values()
        if isinstance(c, type) and issubclass(c, torch.nn.Module) and c.__module__ == torch_layers.__name__
    ]
    return {f"{c.__module__}.{c.__qualname__}": c for c in found}


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, str)) or (isinstance(value, float) and math.isfinite(value))


class _Rebuild:
    """What a ``:serialized:`` entry is replaced with, from trusted sources only."""

    def __init__(self, path: Path, algo_cls: type, data: dict, spaces: dict[str, gym.Space], hyperparams: dict):
        self.path, self.algo_cls, self.data = path, algo_cls, data
        self.spaces, self.hyperparams = spaces, hyperparams
        self.defaults = {
            name: p.default
            for cls in reversed(algo_cls.__mro__)
            if "__init__" in vars(cls)
            for name, p in inspect.signature(vars(cls)["__init__"]).parameters.items()
            if p.default is not inspect.Parameter.empty
        }

    def value(self, key: str, entry: dict) -> Any:
        if key in self.spaces:
            return self.spaces[key]
        if key == "policy_class":
            return self.policy_class(entry)
        if key == "policy_kwargs":
            return self.policy_kwargs(entry)
        schedule = self.schedule(key, entry)
        if schedule is not None:
            return schedule
        if key in self.defaults:
            return self.constructor_value(key)
        return None  # not a constructor value: SB3 rebuilds it in _setup_model, or nothing reads it

    def schedule(self, key: str, entry: dict) -> Any:
        """A schedule rebuilt from its recorded text (constant or linear), else a constant; None for non-schedules."""
        from stable_baselines3.common.utils import FloatSchedule, LinearSchedule

        kind = str(entry.get(":type:"))
        if "Schedule" not in kind and "function" not in kind:
            return None
        text = str(entry.get("value_schedule", ""))
        if m := _CONSTANT.search(text):
            return FloatSchedule(float(m.group(1)))
        if m := _LINEAR.search(text):
            return FloatSchedule(LinearSchedule(*(float(g) for g in m.groups())))
        if "LinearSchedule" in kind and all(isinstance(entry.get(k), (int, float)) for k in _LINEAR_KEYS):
            return LinearSchedule(*(float(entry[k]) for k in _LINEAR_KEYS))
        # a function (RL Zoo's linear_schedule closure): its constant value, or the declared/default one
        return FloatSchedule(self.number(_SCHEDULE_OF.get(key, key.removesuffix("_schedule"))))

    def number(self, key: str) -> float:
        """The plain value saved, else declared in run.yaml, else the algorithm's default."""
        for source in (self.data.get(key), self.hyperparams.get(key), self.defaults.get(key)):
            if isinstance(source, (int, float)) and not isinstance(source, bool) and math.isfinite(source):
                return float(source)
        raise CheckpointError(f"{self.path}: cannot rebuild '{key}' without unpickling it; {TRUST_HINT}")

    def constructor_value(self, key: str) -> Any:
        declared = self.hyperparams.get(key)
        if isinstance(declared, list) and all(_plain(v) for v in declared):
            return tuple(declared)  # train_freq: [4, "step"] is the tuple SB3 expects
        value = declared if declared is not None and _plain(declared) else self.defaults[key]
        if key == "target_entropy" and value == "auto":  # what SAC/TQC compute from the env, which may be absent
            return -float(np.prod(self.spaces["action_space"].shape or ()))
        return value

    def policy_class(self, entry: dict) -> type:
        """The alias of the algorithm whose module and docstring the checkpoint records (MlpPolicy, CnnPolicy, ...)."""
        for cls in dict.fromkeys(getattr(self.algo_cls, "policy_aliases", {}).values()):
            if cls.__module__ == entry.get("__module__") and (cls.__doc__ or None) == (entry.get("__doc__") or None):
                return cls
        raise CheckpointError(
            f"{self.path} uses a policy class that is not one of {self.algo_cls.__name__}'s own "
            f"({', '.join(getattr(self.algo_cls, 'policy_aliases', {}))}); {TRUST_HINT}"
        )

    def policy_kwargs(self, entry: dict) -> dict:
        allowed = _allowed_classes()
        out: dict[str, Any] = {}
        for name, value in entry.items():
            if name.startswith(":"):
                continue
            m = _CLASS_TEXT.match(value) if isinstance(value, str) else None
            if m and m.group(1) in allowed:
                out[name] = allowed[m.group(1)]
            elif isinstance(value, str) and value.startswith("<"):
                raise CheckpointError(
                    f"{self.path}: policy_kwargs '{name}' is {value}, not rebuilt safely; {TRUST_HINT}"
                )
            else:
                out[name] = value
        return out


def _recorded_space_matches(entry: dict, space: gym.Space) -> bool:
    """Does the space the checkpoint records (type, shape, n, bounds as text) agree with the env's?"""
    cls = type(space)
    if entry.get(":type:") != f"<class '{cls.__module__}.{cls.__qualname__}'>":
        return False
    shape = entry.get("_shape")
    if isinstance(shape, list) and tuple(shape) != tuple(space.shape or ()):
        return False
    if isinstance(space, gym.spaces.Discrete) and str(entry.get("n")) != str(int(space.n)):
        return False
    if isinstance(space, gym.spaces.Box):
        return all(_bounds_match(entry.get(k), getattr(space, k)) for k in ("low", "high"))
    return True


def _bounds_match(text: Any, bounds: np.ndarray) -> bool:
    if not isinstance(text, str) or "..." in text:  # numpy abbreviates long arrays: nothing to compare
        return True
    values = [float(v) for v in _SPACE_NUMBER.findall(text)]
    if len(values) != bounds.size:
        return True  # not a layout this reader knows; the weights' shapes are still checked by SB3
    return bool(np.allclose(np.array(values), bounds.astype(float).ravel(), equal_nan=True))


def _space_text(entry: dict) -> str:
    m = _CLASS_TEXT.match(str(entry.get(":type:")))
    kind = m.group(1).rsplit(".", 1)[-1] if m else "space"
    return f"{kind}(shape={tuple(entry.get('_shape') or ())}" + (f", n={entry['n']})" if "n" in entry else ")")


def safe_custom_objects(
    path: Path, algo_cls: type, data: dict, spaces: dict[str, gym.Space], hyperparams: dict | None = None
) -> dict[str, Any]:
    """A replacement for every ``:serialized:`` entry of ``data``, so SB3 unpickles none of them.

    ``spaces`` (``observation_space``, ``action_space``) come from the run's env and must agree
    with what the checkpoint records, else :class:`CheckpointError` says which differs.
    """
    for what, space in spaces.items():
        entry = data.get(what)
        if isinstance(entry, dict) and ":serialized:" in entry and not _recorded_space_matches(entry, space):
            raise CheckpointError(
                f"checkpoint {what.replace('_', ' ')} {_space_text(entry)} does not match the env's "
                f"{repr(space).replace(chr(10), ' ')}; check env_id, env_kwargs and wrappers in run.yaml"
            )
    rebuild = _Rebuild(path, algo_cls, data, spaces, dict(hyperparams or {}))
    return {key: rebuild.value(key, data[key]) for key in serialized_keys(data)}


def load_checkpoint(
    path: Path,
    algo_cls: type[BaseAlgorithm],
    *,
    spaces_env: Any,
    env: Any = None,
    device: str = "cpu",
    hyperparams: dict | None = None,
    **overrides: Any,
):
    """``algo_cls.load(path, ...)`` with every ``:serialized:`` entry replaced (see :func:`safe_custom_objects`).

    ``spaces_env`` (a gym env or VecEnv of the run) supplies the observation and action spaces.
    """
    check_zip(path)
    data = read_data(path)
    spaces = {"observation_space": spaces_env.observation_space, "action_space": spaces_env.action_space}
    custom = safe_custom_objects(path, algo_cls, data, spaces, hyperparams)
    _check_network_size(path, custom.get("policy_kwargs", data.get("policy_kwargs")))
    return algo_cls.load(str(path), env=env, device=device, custom_objects=custom, **overrides)


def _layer_lists(net_arch: Any) -> list[list[int]]:
    """The hidden-layer width lists of an SB3 ``net_arch`` (a list, or a dict of lists such as pi/vf/qf)."""
    lists = list(net_arch.values()) if isinstance(net_arch, dict) else [net_arch]
    return [w for w in lists if isinstance(w, list) and all(isinstance(x, int) and x > 0 for x in w)]


def _check_network_size(path: Path, policy_kwargs: Any) -> None:
    """Refuse a ``net_arch`` describing a network far larger than the weights the zip holds.

    SB3 builds (and initializes) the network before it reads the weights, so ``net_arch:
    [100000, 100000]`` in a 30 KB upload would allocate and orthogonalize 40 GB first.
    """
    if not isinstance(policy_kwargs, dict):
        return
    declared = sum(a * b for widths in _layer_lists(policy_kwargs.get("net_arch")) for a, b in pairwise(widths))
    with zipfile.ZipFile(path) as zf:
        stored = sum(
            i.file_size for i in zf.infolist() if i.filename.endswith(".pth") and "optimizer" not in i.filename
        )
    if declared > 2 * (stored // 4) + 100_000:  # float32 weights; a wide margin for biases, shared layers, dtypes
        raise CheckpointError(
            f"{path}: policy_kwargs.net_arch describes a network of at least {declared:,} weights but the "
            f"checkpoint holds about {stored // 4:,}; refused before building it"
        )


# -- vecnormalize.pkl --------------------------------------------------------------------------------
def _safe_reconstruct(subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
    """numpy's array reconstructor, for plain ndarrays only (no subclasses with their own setstate)."""
    if subtype is not np.ndarray:
        raise _Refused("only plain numpy arrays may be reconstructed")
    return np.ndarray.__new__(np.ndarray, shape, dtype)


def _pickle_allow_list() -> dict[tuple[str, str], Any]:
    import numpy.random.bit_generator as bitgen
    from numpy._core.multiarray import scalar as np_scalar
    from numpy.random import _pickle as np_random_pickle
    from stable_baselines3.common.running_mean_std import RunningMeanStd
    from stable_baselines3.common.vec_env.vec_normalize import VecNormalize

    allowed: dict[tuple[str, str], Any] = {
        ("stable_baselines3.common.vec_env.vec_normalize", "VecNormalize"): VecNormalize,
        ("stable_baselines3.common.running_mean_std", "RunningMeanStd"): RunningMeanStd,
        ("numpy", "dtype"): np.dtype,
        ("numpy", "ndarray"): np.ndarray,
        ("collections", "OrderedDict"): OrderedDict,
        ("numpy.random._pickle", "__generator_ctor"): np_random_pickle.__generator_ctor,
        ("numpy.random._pickle", "__bit_generator_ctor"): np_random_pickle.__bit_generator_ctor,
        ("numpy.random._generator", "Generator"): np.random.Generator,
    }
    for core in ("numpy.core.multiarray", "numpy._core.multiarray"):  # numpy 1.x and 2.x spellings
        allowed[(core, "_reconstruct")] = _safe_reconstruct
        allowed[(core, "scalar")] = np_scalar
    for name in ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64"):
        cls = getattr(np.random, name)
        allowed[(cls.__module__, name)] = cls

    allowed[("numpy.random.bit_generator", "SeedSequence")] = bitgen.SeedSequence
    allowed[("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence")] = vars(bitgen)["__pyx_unpickle_SeedSequence"]
    for space in (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary):
        allowed[(space.__module__, space.__name__)] = space
    allowed[(gym.spaces.Dict.__module__, "Dict")] = gym.spaces.Dict
    allowed[(gym.spaces.Tuple.__module__, "Tuple")] = gym.spaces.Tuple
    return {k: v for k, v in allowed.items() if v is not None}


class _Refused(pickle.UnpicklingError):
    """A global outside the allow-list (as opposed to a damaged pickle)."""


class _RestrictedUnpickler(pickle.Unpickler):
    """Resolves only the globals VecNormalize's saved state needs; anything else is an error, never imported."""

    def __init__(self, file: Any, allowed: dict[tuple[str, str], Any]):
        super().__init__(file)
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise _Refused(f"'{module}.{name}' is not allowed in normalization statistics") from None

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("persistent ids are not allowed in normalization statistics")


def restricted_unpickle(path: Path, *, max_bytes: int = MAX_PICKLE_BYTES) -> Any:
    """Unpickle ``path`` admitting only VecNormalize's state; :class:`CheckpointError` names what was refused."""
    size = path.stat().st_size
    if size > max_bytes:
        raise CheckpointError(
            f"{path} is {size >> 20} MiB (more than {max_bytes >> 20} MiB); not normalization statistics"
        )
    try:
        with open(path, "rb") as f:
            return _RestrictedUnpickler(f, _pickle_allow_list()).load()
    except _Refused as ex:
        raise CheckpointError(f"{path} refused: {_first_line(ex)}; {TRUST_HINT}") from ex
    except Exception as ex:  # a damaged pickle fails in many ways, none of them should escape as a traceback
        raise CheckpointError(
            f"cannot read {path} ({_first_line(ex)}); save it again with vec_env.save() ({TRUST_HINT})"
        ) from ex


def load_vecnormalize(path: Path, venv: Any, *, trust: bool = False, evaluation: bool = True):
    """``venv`` wrapped in the statistics saved at ``path``.

    ``evaluation`` freezes them the way SB3 tells users to evaluate (``training=False``,
    ``norm_reward=False``); otherwise the saved flags are kept (fine-tuning goes on training them).
    """
    from stable_baselines3.common.vec_env import VecNormalize

    try:
        vn = VecNormalize.load(str(path), venv) if trust else restricted_unpickle(path)
    except CheckpointError:
        raise
    except Exception as ex:  # pickle errors come in many types
        raise CheckpointError(f"cannot load {path}: {_first_line(ex)}; save it again with vec_env.save()") from ex
    if not isinstance(vn, VecNormalize):
        raise CheckpointError(
            f"{path} holds a {type(vn).__name__}, not VecNormalize statistics; save them with vec_env.save()"
        )
    if not trust:
        try:
            vn.set_venv(venv)
        except Exception as ex:  # shape mismatch (AssertionError/ValueError) or a state that lacks fields
            raise CheckpointError(
                f"{path} does not fit the run's env ({_first_line(ex)}); check env_id and wrappers in run.yaml"
            ) from ex
    if evaluation:
        vn.training, vn.norm_reward = False, False
    return vn
