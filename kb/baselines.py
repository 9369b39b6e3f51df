"""Trivial baselines the bench reports next to Remedy: a figure counts only above them.

Diagnosis (no model at all, computed on the **dev** split and scored on any split):

- *most frequent cause*: always answer the cause found in the most dev scenarios' ground truth;
- *fixed top-3*: always answer the three causes found in the most dev scenarios' ground truth.

Fixing (no diagnosis; the same number of verified candidates and the same budget per
candidate as the fix loop, through the same :func:`verify_patch`):

- *tuned defaults*: fine-tune with the RL Zoo's tuned hyperparameters for the env and
  algorithm (:data:`ZOO_PPO`), then the same plus observation normalization, then plus
  reward normalization — the answer "use good defaults" gives without looking at the agent;
- *random search*: seeded random patches drawn over the patch space that fit the env.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from remedy.cases.errors import PatchRejectedError, VerificationError
from remedy.cases.patches.spec import Patch

from .fix_state import CONFIRMATIONS

__all__ = [
    "ZOO_SOURCE",
    "ZOO_PPO",
    "FINE_TUNABLE",
    "cause_counts",
    "most_frequent_causes",
    "score_constant",
    "zoo_hyperparameters",
    "default_candidates",
    "random_candidates",
    "BaselineFix",
    "run_fix_baseline",
    "FIX_BASELINES",
]

#: where :data:`ZOO_PPO` comes from (values copied by hand; no network at run time).
ZOO_SOURCE = (
    "RL Baselines3 Zoo, hyperparams/ppo.yml (github.com/DLR-RM/rl-baselines3-zoo, commit 208b6fd); "
    "'lin_x' schedules are given as their start value x; the zoo's LunarLander-v2 / "
    "LunarLanderContinuous-v3 and MuJoCo -v2/-v4 entries stand in for the -v3/-v5 envs used here"
)

#: RL Zoo tuned PPO settings per env id (``continuous`` LunarLander keyed with ``:continuous``).
ZOO_PPO: dict[str, dict[str, Any]] = {
    "CartPole-v1": {
        "gae_lambda": 0.8,
        "gamma": 0.98,
        "n_epochs": 20,
        "ent_coef": 0.0,
        "learning_rate": 0.001,
        "clip_range": 0.2,
    },
    "Acrobot-v1": {"normalize": True, "gae_lambda": 0.94, "gamma": 0.99, "n_epochs": 4, "ent_coef": 0.0},
    "MountainCar-v0": {"normalize": True, "gae_lambda": 0.98, "gamma": 0.99, "n_epochs": 4, "ent_coef": 0.0},
    "MountainCarContinuous-v0": {
        "normalize": True,
        "gamma": 0.9999,
        "learning_rate": 7.77e-05,
        "ent_coef": 0.00429,
        "clip_range": 0.1,
        "n_epochs": 10,
        "gae_lambda": 0.9,
        "max_grad_norm": 5.0,
        "vf_coef": 0.19,
    },
    "Pendulum-v1": {
        "gae_lambda": 0.95,
        "gamma": 0.9,
        "n_epochs": 10,
        "ent_coef": 0.0,
        "learning_rate": 0.001,
        "clip_range": 0.2,
    },
    "LunarLander-v3": {"gae_lambda": 0.98, "gamma": 0.999, "n_epochs": 4, "ent_coef": 0.01},
    "LunarLander-v3:continuous": {"gae_lambda": 0.98, "gamma": 0.999, "n_epochs": 4, "ent_coef": 0.01},
    "Hopper-v5": {
        "normalize": True,
        "gamma": 0.999,
        "learning_rate": 9.80828e-05,
        "ent_coef": 0.00229519,
        "clip_range": 0.2,
        "n_epochs": 5,
        "gae_lambda": 0.99,
        "max_grad_norm": 0.7,
        "vf_coef": 0.835671,
    },
    "InvertedDoublePendulum-v5": {
        "normalize": True,
        "gamma": 0.98,
        "learning_rate": 0.000155454,
        "ent_coef": 1.05057e-06,
        "clip_range": 0.4,
        "n_epochs": 10,
        "gae_lambda": 0.8,
        "max_grad_norm": 0.5,
        "vf_coef": 0.695929,
    },
    "InvertedPendulum-v5": {
        "normalize": True,
        "gamma": 0.999,
        "learning_rate": 0.000222425,
        "ent_coef": 1.37976e-07,
        "clip_range": 0.4,
        "n_epochs": 5,
        "gae_lambda": 0.9,
        "max_grad_norm": 0.3,
        "vf_coef": 0.19816,
    },
    "Reacher-v5": {
        "normalize": True,
        "gamma": 0.9,
        "learning_rate": 0.000104019,
        "ent_coef": 7.52585e-08,
        "clip_range": 0.3,
        "n_epochs": 5,
        "gae_lambda": 1.0,
        "max_grad_norm": 0.9,
        "vf_coef": 0.950368,
    },
}

#: zoo keys a fine-tune can change (n_steps/batch_size/policy_kwargs/use_sde shape the saved policy or buffer).
FINE_TUNABLE = frozenset(
    {"learning_rate", "gamma", "gae_lambda", "n_epochs", "ent_coef", "clip_range", "max_grad_norm", "vf_coef"}
)


# --------------------------------------------------------------------------- diagnosis baselines


def cause_counts(ground_truths: Sequence[Sequence[str]]) -> Counter[str]:
    """In how many scenarios each cause is part of the ground truth."""
    return Counter(c for truth in ground_truths for c in set(map(str, truth)))


def most_frequent_causes(ground_truths: Sequence[Sequence[str]], k: int = 3) -> list[str]:
    """The ``k`` causes found in the most scenarios' ground truth (ties: alphabetical, so it is deterministic)."""
    counts = cause_counts(ground_truths)
    return [c for c, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:k]]


def score_constant(answer: Sequence[str], ground_truths: Sequence[Sequence[str]]) -> tuple[float, float]:
    """``(top1, top3)`` accuracy of always answering ``answer`` (a ranked list) on these scenarios."""
    if not ground_truths:
        return 0.0, 0.0
    top1 = sum(bool(answer) and answer[0] in set(t) for t in ground_truths)
    top3 = sum(any(c in set(t) for c in answer[:3]) for t in ground_truths)
    return top1 / len(ground_truths), top3 / len(ground_truths)


# --------------------------------------------------------------------------- fixing baselines


def zoo_hyperparameters(env_id: str, env_kwargs: dict | None, algo: str) -> tuple[dict[str, Any], bool] | None:
    """The zoo's fine-tunable PPO settings and its ``normalize`` flag for this env, or None when it has none."""
    if algo.upper() != "PPO":
        return None
    key = f"{env_id}:continuous" if (env_kwargs or {}).get("continuous") else env_id
    entry = ZOO_PPO.get(key)
    if entry is None:
        return None
    return {k: v for k, v in entry.items() if k in FINE_TUNABLE}, bool(entry.get("normalize", False))


def default_candidates(scenario: Any, n: int) -> list[Patch]:
    """Up to ``n`` "tuned defaults" patches: zoo settings, + obs normalization, + reward normalization."""
    zoo = zoo_hyperparameters(scenario.env_id, scenario.env_kwargs, scenario.algo)
    hp, _ = zoo if zoo is not None else ({}, False)
    hp_part = [{"kind": "hyperparameters", "changes": hp}] if hp else []
    ladder = [
        hp_part,
        [*hp_part, {"kind": "normalization", "obs": True}],
        [*hp_part, {"kind": "normalization", "obs": True, "reward": True}],
    ]
    out = [
        Patch.model_validate({"parts": parts, "description": f"tuned defaults #{i + 1}"})
        for i, parts in enumerate(ladder)
        if parts
    ]
    return out[:n]


def _random_part(rng: random.Random, continuous: bool, budget: int) -> dict[str, Any]:
    """One random patch part over the kinds that need no code (reward code has no prior to sample from)."""
    kinds = ["learning_rate", "ent_coef", "epochs", "normalization", "budget"] + (["smoothness"] if continuous else [])
    kind = rng.choice(kinds)
    if kind == "learning_rate":
        return {"kind": "hyperparameters", "changes": {"learning_rate": round(10 ** rng.uniform(-5, -2), 7)}}
    if kind == "ent_coef":
        return {"kind": "exploration_bonus", "ent_coef": round(10 ** rng.uniform(-4, -1), 5)}
    if kind == "epochs":
        return {"kind": "hyperparameters", "changes": {"n_epochs": rng.choice([3, 5, 10, 20])}}
    if kind == "normalization":
        return {"kind": "normalization", "obs": True, "reward": rng.random() < 0.5}
    if kind == "smoothness":
        return {"kind": "action_smoothness", "coef": round(10 ** rng.uniform(-2, 0), 4)}
    return {"kind": "training_budget", "extra_steps": budget}


def random_candidates(scenario: Any, n: int, seed: int = 0) -> list[Patch]:
    """``n`` seeded random patches that fit the scenario's env and algorithm (fit-checked before use)."""
    from remedy.cases.evidence.envs import env_traits
    from remedy.cases.patches.check import check_fit

    traits = env_traits(scenario.env_id, scenario.env_kwargs)
    continuous = str(getattr(traits.action_space, "value", traits.action_space)) == "continuous"
    rng = random.Random(f"{seed}:{scenario.name}")  # a string seed hashes deterministically (not salted)
    out: list[Patch] = []
    while len(out) < n:
        patch = Patch.model_validate(
            {"parts": [_random_part(rng, continuous, scenario.budget)], "description": f"random search #{len(out) + 1}"}
        )
        try:
            check_fit(patch, traits, scenario.algo)
        except PatchRejectedError:
            continue
        out.append(patch)
    return out


@dataclass(frozen=True)
class BaselineFix:
    """One no-diagnosis arm on one scenario: did any of its candidates verify as improved?"""

    arm: str
    fixed: bool
    budget_only: bool
    attempts: int
    env_steps: int
    statuses: list[str]
    winning_patch: str | None
    error: str = ""


#: the fixing baselines by name: ``candidates(scenario, n, seed)``.
FIX_BASELINES = {
    "tuned_defaults": lambda s, n, seed: default_candidates(s, n),
    "random_search": random_candidates,
}


def run_fix_baseline(
    arm: str, scenario: Any, run: Any, n: int, verify_config: Any, seed: int = 0, max_confirmations: int = CONFIRMATIONS
) -> BaselineFix:
    """Verify up to ``n`` candidates of ``arm`` on the built patient ``run`` as the fix loop does: a screen,
    then, for a screen that clears, a confirmation on the next block of fresh seeds (at most
    ``max_confirmations``, the loop's cap); stop at the first confirmed improvement.

    Before, the arms ran screens alone, and a screen never ends ``improved``: they could not fix
    anything, and the bench's "0%" beside Remedy was not a measurement."""
    from remedy.cases.evidence.rollcache import RolloutCache
    from remedy.cases.model import Stage
    from remedy.cases.verify.verification import verify_patch

    statuses, steps, tried, confirmations = [], 0, 0, 0
    rollouts = RolloutCache()  # every candidate's evidence is the same rollouts of the patient
    for patch in FIX_BASELINES[arm](scenario, n, seed):
        tried += 1
        screen = _checked(verify_patch(run, patch, verify_config, scenario=scenario, rollouts=rollouts))
        statuses.append(screen.verification.status.value)
        steps += screen.verification.env_steps
        if not screen.verification.passed_screen or confirmations >= max_confirmations:
            continue
        config = verify_config.confirmation(confirmations)
        confirmations += 1  # counted even if it crashes: its seeds are spent
        case = _checked(
            verify_patch(
                run, patch, config, scenario=scenario, rollouts=rollouts, stage=Stage.confirm, confirms=screen.case_id
            )
        )
        statuses.append(f"confirm:{case.verification.status.value}")
        steps += case.verification.env_steps
        if case.verification.status.value == "improved":
            return BaselineFix(arm, True, patch.kinds == ["training_budget"], tried, steps, statuses, patch.summary())
    return BaselineFix(arm, False, False, tried, steps, statuses, None)


def _checked(case: Any) -> Any:
    if case.verification is None:  # verify_patch always records one
        raise VerificationError(f"case {case.case_id} has no verification")
    return case
