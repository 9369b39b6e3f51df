"""Algorithm registry: SB3 and sb3-contrib classes looked up by name.

Run directories and scenarios name their algorithm as a string ("PPO",
"tqc"); this module turns it into the class, case-insensitively, and says
whether it learns on-policy (no replay buffer, fine-tunes from rollouts).
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator

from .errors import AlgorithmError

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm

__all__ = [
    "AlgoName",
    "ALGOS",
    "ON_POLICY",
    "get_algo",
    "is_on_policy",
    "canonical_algo",
    "algo_names",
    "constructor_hyperparams",
    "constructor_defaults",
    "SAVED_HYPERPARAMS",
]

#: canonical name -> "module:attribute" (imported lazily; sb3-contrib is optional at import time).
ALGOS: dict[str, str] = {
    "PPO": "stable_baselines3:PPO",
    "A2C": "stable_baselines3:A2C",
    "DQN": "stable_baselines3:DQN",
    "SAC": "stable_baselines3:SAC",
    "TD3": "stable_baselines3:TD3",
    "DDPG": "stable_baselines3:DDPG",
    "QRDQN": "sb3_contrib:QRDQN",
    "TQC": "sb3_contrib:TQC",
    "TRPO": "sb3_contrib:TRPO",
    "ARS": "sb3_contrib:ARS",
    "CrossQ": "sb3_contrib:CrossQ",
    "RecurrentPPO": "sb3_contrib:RecurrentPPO",
    "MaskablePPO": "sb3_contrib:MaskablePPO",
}

#: algorithms that learn from fresh rollouts only (no replay buffer). ARS is population-based, no buffer either.
ON_POLICY: frozenset[str] = frozenset({"PPO", "A2C", "TRPO", "ARS", "RecurrentPPO", "MaskablePPO"})

_BY_LOWER = {k.lower(): k for k in ALGOS}


def algo_names() -> list[str]:
    """Canonical names of every supported algorithm."""
    return list(ALGOS)


def canonical_algo(name: str) -> str:
    """The canonical spelling of ``name`` ("ppo" -> "PPO"); raises with a did-you-mean when unknown."""
    key = str(name).strip().lower().replace("-", "").replace("_", "")
    if key in _BY_LOWER:
        return _BY_LOWER[key]
    close = difflib.get_close_matches(key, list(_BY_LOWER), n=1, cutoff=0.5)
    hint = f"; did you mean '{_BY_LOWER[close[0]]}'?" if close else f"; choose one of {', '.join(ALGOS)}"
    raise AlgorithmError(f"unknown algorithm '{name}'{hint}")


def get_algo(name: str) -> type[BaseAlgorithm]:
    """The SB3/sb3-contrib class for ``name`` (case-insensitive)."""
    canon = canonical_algo(name)
    module, attr = ALGOS[canon].split(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError as ex:  # sb3-contrib missing
        raise AlgorithmError(f"algorithm '{canon}' needs the '{module}' package; install it ({ex})") from ex


#: constructor arguments SB3 and sb3-contrib keep as same-named attributes, so ``data`` holds them
SAVED_HYPERPARAMS = (
    "learning_rate",
    "n_steps",
    "batch_size",
    "n_epochs",
    "gamma",
    "gae_lambda",
    "ent_coef",
    "vf_coef",
    "max_grad_norm",
    "use_sde",
    "sde_sample_freq",
    "normalize_advantage",
    "target_kl",
    "clip_range",
    "clip_range_vf",
    "buffer_size",
    "learning_starts",
    "tau",
    "gradient_steps",
    "target_update_interval",
    "exploration_fraction",
    "exploration_initial_eps",
    "exploration_final_eps",
    "policy_delay",
    "target_policy_noise",
    "target_noise_clip",
    "target_entropy",
    "top_quantiles_to_drop_per_net",
    "cg_max_steps",
    "cg_damping",
    "line_search_shrinking_factor",
    "line_search_max_iter",
    "n_critic_updates",
    "sub_sampling_factor",
    "n_delta",
    "n_top",
    "delta_std",
    "zero_policy",
    "alive_bonus_offset",
    "policy_kwargs",
)


def constructor_hyperparams(algo: str | type, hyperparams: dict[str, Any]) -> dict[str, Any]:
    """Keep what ``algo``'s constructor takes: SB3 saves attributes some algorithms do not accept (DQN's use_sde).

    ``policy_kwargs.use_sde`` goes too: SAC and TD3 write it there from their own ``use_sde`` argument.
    Looking at the signature imports SB3 (and torch).
    """
    cls: type = get_algo(algo) if isinstance(algo, str) else algo
    accepted = inspect.signature(cls).parameters  # the class's signature is its __init__'s, without self
    kept = {k: v for k, v in hyperparams.items() if k in accepted}
    if isinstance(kept.get("policy_kwargs"), dict):
        kept["policy_kwargs"] = {k: v for k, v in kept["policy_kwargs"].items() if k != "use_sde"}
    return kept


@functools.cache
def constructor_defaults(algo: str) -> dict[str, Any]:
    """``algo``'s constructor defaults (SB3 / sb3-contrib), e.g. PPO's ``gamma`` 0.99: what a run that does not
    set a hyperparameter trained with. Looking at the signature imports SB3 (and torch)."""
    params = inspect.signature(get_algo(algo)).parameters
    return {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}


def is_on_policy(name: str) -> bool:
    """True when the algorithm learns on-policy (PPO, A2C, TRPO, ...), False for replay-buffer methods."""
    return canonical_algo(name) in ON_POLICY


def _validated(name: str) -> str:
    try:
        return canonical_algo(name)
    except AlgorithmError as ex:  # pydantic reports ValueErrors with the field's name
        raise ValueError(str(ex)) from None


#: An algorithm name in a pydantic model: validated and stored in its canonical spelling.
AlgoName = Annotated[str, AfterValidator(_validated)]
