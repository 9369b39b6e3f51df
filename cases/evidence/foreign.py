"""Reading files other tools wrote, without running anything in them.

SB3 checkpoints (only the plain JSON values of the zip's ``data`` entry, read by
:func:`.checkpoint.read_data`; ``:serialized:`` pickles stay opaque), RL Zoo's ``config.yml`` / ``args.yml`` (``yaml.dump`` of OrderedDicts, read by a
SafeLoader that builds plain data only), RL Zoo's ``normalize`` / ``policy_kwargs`` strings
(parsed as literals, never evaluated: rl-baselines3-zoo #505), Hugging Face model cards,
``evaluations.npz`` (pickles refused) and the ``--success`` option's text. Every read is bounded.
"""

from __future__ import annotations

import ast
import math
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict
from pydantic import ValidationError as PydanticValidationError

from ..algos import SAVED_HYPERPARAMS
from ..errors import RunDirError
from ..success import FinalObs, FinalReward, InfoFlag, ReturnThreshold, SuccessSpec, Terminated, parse_success
from ..yamlfile import MAX_YAML_BYTES, BoundedLoader, check_expanded_size, first_error, safe_load_yaml
from .rundir import checkpoint_algos

__all__ = [
    "SUCCESS_FORMS",
    "CheckpointFacts",
    "checkpoint_facts",
    "plain_value",
    "load_zoo_yaml",
    "literal_kwargs",
    "normalize_setting",
    "model_card_names",
    "evaluations_summary",
    "unpack_logs",
    "parse_success_option",
]

#: a log unpacked from a metrics archive (RL Zoo's ``train_eval_metrics.zip`` on the Hub) is refused past this size
MAX_LOG_BYTES = 64_000_000
#: entries looked at in such an archive
MAX_LOG_ENTRIES = 256
#: what ``--success`` accepts (the error for a missing success definition quotes it)
SUCCESS_FORMS = (
    "'return>=X', 'info:KEY' (info[KEY] true at the end), 'final_reward>=X', 'obs[I]>=X' (also <=, >, <, ==), "
    "'terminated' (reaches a goal state), 'survive' (lasts to the time limit), "
    "or a YAML mapping such as '{kind: return_threshold, threshold: 200}'"
)
#: SB3 policy classes -> the alias a user passes (``PPO("MlpPolicy", ...)``); the same names in every algorithm
_POLICY_ALIASES = {
    "ActorCriticPolicy": "MlpPolicy",
    "ActorCriticCnnPolicy": "CnnPolicy",
    "MultiInputActorCriticPolicy": "MultiInputPolicy",
    "RecurrentActorCriticPolicy": "MlpLstmPolicy",
    "RecurrentActorCriticCnnPolicy": "CnnLstmPolicy",
    "RecurrentMultiInputActorCriticPolicy": "MultiInputLstmPolicy",
    "MaskableActorCriticPolicy": "MlpPolicy",
    "MaskableActorCriticCnnPolicy": "CnnPolicy",
    "MaskableMultiInputActorCriticPolicy": "MultiInputPolicy",
    "DQNPolicy": "MlpPolicy",
    "QRDQNPolicy": "MlpPolicy",
    "SACPolicy": "MlpPolicy",
    "TD3Policy": "MlpPolicy",
    "TQCPolicy": "MlpPolicy",
    "CrossQPolicy": "MlpPolicy",
    "ARSPolicy": "LinearPolicy",
    "ARSLinearPolicy": "LinearPolicy",
    "MlpPolicy": "MlpPolicy",
    "CnnPolicy": "CnnPolicy",
    "MultiInputPolicy": "MultiInputPolicy",
}


# --------------------------------------------------------------------------- SB3 checkpoints


def plain_value(value: Any) -> bool:
    """True for JSON data SB3 wrote as is (not a ``:serialized:`` pickle), with finite numbers."""
    if isinstance(value, dict):
        return ":serialized:" not in value and all(isinstance(k, str) and plain_value(v) for k, v in value.items())
    if isinstance(value, list):
        return all(plain_value(v) for v in value)
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, (bool, int, str))


def _policy_class_name(data: dict[str, Any]) -> str | None:
    """The policy class's name, from the method reprs SB3 writes beside the pickle (``<function X.__init__ at ...>``)."""
    policy = data.get("policy_class")
    if not isinstance(policy, dict):
        return None
    for value in policy.values():
        m = re.match(r"<function (\w+)\.\w+ at ", value) if isinstance(value, str) else None
        if m:
            return m.group(1)
    return None


class CheckpointFacts(BaseModel):
    """What a checkpoint's plain ``data`` values say about how the agent was trained."""

    model_config = ConfigDict(frozen=True)
    train_steps: int | None = None
    n_envs: int | None = None
    seed: int | None = None
    hyperparams: dict[str, Any] = {}
    algos: set[str] = set()
    observation_space: str | None = None
    action_space: str | None = None
    notes: list[str] = []

    def describe(self) -> str:
        """One line: what was read."""
        return (
            f"data entry (JSON, no pickles): num_timesteps={self.train_steps}, n_envs={self.n_envs}, "
            f"{len(self.hyperparams)} hyperparameters"
        )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _space_class(value: Any) -> str | None:
    """``"<class 'gymnasium.spaces.box.Box'>"`` -> ``"Box"`` (the type SB3 writes beside a pickled space)."""
    m = re.fullmatch(r"<class '[\w.]*?(\w+)'>", value.get(":type:", "")) if isinstance(value, dict) else None
    return m.group(1) if m else None


def checkpoint_facts(data: dict[str, Any]) -> CheckpointFacts:
    """Steps, envs, seed, constructor hyperparameters, possible algorithms and space kinds from ``data``."""
    hyper = {k: data[k] for k in SAVED_HYPERPARAMS if k in data and data[k] is not None and plain_value(data[k])}
    notes = []
    opaque = [k for k in SAVED_HYPERPARAMS if isinstance(data.get(k), dict) and ":serialized:" in data[k]]
    if opaque:
        notes.append(f"saved as pickles, not read: {', '.join(opaque)}")
    cls = _policy_class_name(data)
    if cls in _POLICY_ALIASES:
        hyper["policy"] = _POLICY_ALIASES[cls]
    elif cls:
        notes.append(f"custom policy class {cls} (fine-tuning loads it from the checkpoint)")
    return CheckpointFacts(
        train_steps=_int(data.get("num_timesteps")),
        n_envs=_int(data.get("n_envs")),
        seed=_int(data.get("seed")),
        hyperparams=hyper,
        algos=checkpoint_algos(data),
        observation_space=_space_class(data.get("observation_space")),
        action_space=_space_class(data.get("action_space")),
        notes=notes,
    )


# --------------------------------------------------------------------------- RL Zoo YAML


class _ZooLoader(BoundedLoader):
    """The bounded SafeLoader plus the inert tags RL Zoo's ``yaml.dump`` writes; any other Python tag stays an error.

    ``!!python/object/apply:collections.OrderedDict`` becomes a dict, ``!!python/tuple`` a list and
    ``!!python/name:torch.nn.ReLU`` the dotted name as a string (never imported). Aliases are counted.
    """


def _ordered_dict(loader: yaml.SafeLoader, node: yaml.Node) -> dict:
    if not isinstance(node, yaml.SequenceNode) or len(node.value) != 1:
        raise yaml.constructor.ConstructorError(
            None, None, "an OrderedDict written in an unknown form", node.start_mark
        )
    pairs = loader.construct_sequence(node.value[0], deep=True)
    if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        raise yaml.constructor.ConstructorError(None, None, "an OrderedDict whose items are not pairs", node.start_mark)
    return {k: v for k, v in pairs}


_ZooLoader.add_constructor("tag:yaml.org,2002:python/object/apply:collections.OrderedDict", _ordered_dict)
_ZooLoader.add_constructor(
    "tag:yaml.org,2002:python/tuple",
    lambda loader, node: loader.construct_sequence(node, deep=True),  # type: ignore[arg-type]
)
_ZooLoader.add_multi_constructor("tag:yaml.org,2002:python/name:", lambda loader, suffix, node: suffix)


def load_zoo_yaml(path: Path) -> dict[str, Any]:
    """Read an RL Zoo ``config.yml`` / ``args.yml`` / ``env_kwargs.yml`` into plain data; RunDirError if it cannot be."""
    if path.stat().st_size > MAX_YAML_BYTES:
        raise RunDirError(f"{path} is over {MAX_YAML_BYTES:,} bytes; refusing to read it")
    loader = _ZooLoader(path.read_text(encoding="utf-8", errors="replace"))
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as ex:
        problem = getattr(ex, "problem", None) or str(ex).splitlines()[0]
        raise RunDirError(f"{path}: {problem}") from None
    finally:
        loader.dispose()
    check_expanded_size(data, str(path), RunDirError)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RunDirError(f"{path} is not a mapping")
    return data


def literal_kwargs(text: str) -> tuple[dict[str, Any], list[str]] | None:
    """``"dict(a=1, b=True)"`` or ``"{'a': 1}"`` read as literals, never evaluated: (kwargs, names left unread).

    None when the text is neither form. A keyword whose value is not a literal (``activation_fn=nn.ReLU``)
    is left out and named, so the caller can say so.
    """
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None
    if isinstance(node, ast.Dict):
        try:
            value = ast.literal_eval(node)
        except ValueError:
            return None
        return (value, []) if isinstance(value, dict) else None
    if not (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args
    ):
        return None
    kwargs, skipped = {}, []
    for kw in node.keywords:
        if kw.arg is None:
            return None
        try:
            kwargs[kw.arg] = ast.literal_eval(kw.value)
        except ValueError:
            skipped.append(kw.arg)
    return kwargs, skipped


# --------------------------------------------------------------------------- RL Zoo settings, Hub cards, eval logs


def normalize_setting(value: Any) -> tuple[bool, str]:
    """Whether RL Zoo's ``normalize`` hyperparameter means VecNormalize was on, and what was read of it."""
    if isinstance(value, str):
        if value.strip() in ("", "False", "false", "None"):
            return False, f"normalize: {value!r}"
        parsed = literal_kwargs(value)
        if parsed is None:
            # RL Zoo evaluates this string; a truthy string there means normalization was on
            return True, f"normalize: {value!r} (not evaluated; read as on)"
        value = parsed[0]
    if isinstance(value, dict):
        obs = value.get("norm_obs", True)
        return True, f"normalize: {value} (observations {'normalized' if obs else 'not normalized'})"
    return bool(value), f"normalize: {value}"


def model_card_names(text: str) -> tuple[str | None, str | None]:
    """(algorithm, env id) a Hub model card names: its ``model-index`` front matter, else the generated title line."""
    algo = env = None
    if m := re.match(r"---\s*\n(.*?)\n---\s*\n", text[:MAX_YAML_BYTES], re.S):
        try:
            meta = safe_load_yaml(m.group(1), "model card", RunDirError)
        except RunDirError:
            meta = None
        index = meta.get("model-index") if isinstance(meta, dict) else None
        if isinstance(index, list) and index and isinstance(index[0], dict):
            algo = index[0].get("name") if isinstance(index[0].get("name"), str) else None
            results = index[0].get("results") or [{}]
            dataset = results[0].get("dataset") if isinstance(results[0], dict) else None
            env = dataset.get("name") if isinstance(dataset, dict) and isinstance(dataset.get("name"), str) else None
    if m := re.search(r"\*\*(\w+)\*\* Agent playing \*\*([\w./:-]+)\*\*", text[:MAX_YAML_BYTES]):
        algo, env = algo or m.group(1), env or m.group(2)
    return algo, env


def evaluations_summary(path: Path) -> str:
    """One line about EvalCallback's / RL Zoo's ``evaluations.npz``, loaded with pickles refused."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            steps, results = npz["timesteps"], npz["results"]
        if not len(steps):
            return "no evaluations in it"
        last = float(np.mean(results[-1]))
        return f"{len(steps)} evaluations, last mean return {last:.4g} at step {int(steps[-1])}"
    except (ValueError, KeyError, OSError, IndexError) as ex:
        return f"unreadable ({ex})"


def unpack_logs(archive: Path, dest: Path, wanted: Callable[[str], bool]) -> list[str]:
    """Copy the entries of ``archive`` whose base name is ``wanted`` into ``dest``, flat; their names.

    Bounded like a checkpoint: at most :data:`MAX_LOG_ENTRIES` entries looked at, each read to at most
    :data:`MAX_LOG_BYTES` whatever its header says; a name's folders are dropped, so nothing lands
    outside ``dest``. Raises RunDirError for an archive that is not a readable zip or holds an oversized log.
    """
    names: list[str] = []
    try:
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist()[:MAX_LOG_ENTRIES]:
                base = Path(info.filename).name
                if info.is_dir() or not wanted(base) or base in names:
                    continue
                with zf.open(info) as f:
                    raw = f.read(MAX_LOG_BYTES + 1)
                if len(raw) > MAX_LOG_BYTES:
                    raise RunDirError(f"{archive}: {info.filename} inflates beyond {MAX_LOG_BYTES:,} bytes")
                dest.mkdir(parents=True, exist_ok=True)
                (dest / base).write_bytes(raw)
                names.append(base)
    except (zipfile.BadZipFile, OSError, EOFError) as ex:
        raise RunDirError(f"{archive} is not a readable zip ({ex})") from ex
    return names


# --------------------------------------------------------------------------- success option


_NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_OP = r"(>=|<=|==|>|<)"


def parse_success_option(text: str) -> SuccessSpec:
    """A success definition from ``--success`` text; the accepted forms are :data:`SUCCESS_FORMS`."""
    s = text.strip()
    if s.startswith("{"):
        data = safe_load_yaml(s, "--success", RunDirError)
        try:
            return parse_success(data)
        except PydanticValidationError as ex:
            raise RunDirError(f"--success {text!r}: {first_error(ex)}; accepted: {SUCCESS_FORMS}") from None
    compact = re.sub(r"\s+", "", s)
    if m := re.fullmatch(rf"return>={_NUM}", compact):
        return ReturnThreshold(threshold=float(m.group(1)))
    if m := re.fullmatch(r"info:(\w+)", compact):
        return InfoFlag(key=m.group(1))
    if m := re.fullmatch(rf"final_reward{_OP}{_NUM}", compact):
        return FinalReward(op=m.group(1), value=float(m.group(2)))
    if m := re.fullmatch(rf"obs\[(\d+)\]{_OP}{_NUM}", compact):
        return FinalObs(index=int(m.group(1)), op=m.group(2), value=float(m.group(3)))
    if compact in ("terminated", "survive"):
        return Terminated(survive=compact == "survive")
    raise RunDirError(f"--success {text!r} is not a success definition; accepted: {SUCCESS_FORMS}")
