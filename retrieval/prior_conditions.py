"""The prior rulebook's vocabulary: facts about a subject and the conditions rules test on them.

:class:`Facts` wraps a subject and its signature with the derived numbers rules and templates need
(canonical algorithm, time limit, learning rate); each :class:`Condition` says whether it holds and
describes itself with the subject's values (the evidence a prior quotes). The rules live in
:mod:`remedy.retrieval.priors`, the patch templates in :mod:`remedy.retrieval.prior_templates`.
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from remedy.cases.algos import canonical_algo, is_on_policy
from remedy.cases.errors import RemedyError
from remedy.cases.model import ActionSpaceType, RewardDensity, Signature, Subject
from remedy.cases.success import FinalObs, FinalReward, InfoFlag, SuccessSpec, Terminated, parse_success

__all__ = [
    "Facts",
    "Condition",
    "Symptom",
    "Feature",
    "Trait",
    "EnvIs",
    "AnyOf",
    "Not",
    "TimeLimitShort",
    "BudgetBelow",
    "LearningRate",
    "ZOO_STEPS",
    "LR_HIGH_RATIO",
    "LR_LOW_RATIO",
    "registered_time_limit",
    "success_from_text",
]

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
}

#: default learning rates of SB3's algorithms (used when the run does not name one).
_DEFAULT_LR = {
    "PPO": 3e-4,
    "A2C": 7e-4,
    "DQN": 1e-4,
    "QRDQN": 5e-5,
    "SAC": 3e-4,
    "TD3": 1e-3,
    "DDPG": 1e-3,
    "TQC": 3e-4,
    "TRPO": 1e-3,
    "CrossQ": 1e-3,
    "RecurrentPPO": 3e-4,
    "MaskablePPO": 3e-4,
}


# ---- facts about the subject ------------------------------------------------------------------


@dataclass(frozen=True)
class Facts:
    """The subject and its signature, with the derived numbers templates need."""

    subject: Subject
    signature: Signature
    constraints: tuple[str, ...] = ()  # declared safety constraints: expressions TRUE WHEN VIOLATED

    def feature(self, name: str) -> float | None:
        """A finite feature value, or None when absent or NaN."""
        v = self.signature.features.get(name)
        return float(v) if v is not None and math.isfinite(v) else None

    def has(self, symptom: str) -> bool:
        """Whether the signature carries the symptom tag."""
        return symptom in self.signature.symptoms

    @property
    def algo(self) -> str:
        """Canonical algorithm name ("PPO"), or the raw string when unknown."""
        try:
            return canonical_algo(self.subject.algo)
        except RemedyError:
            return self.subject.algo

    @property
    def on_policy(self) -> bool:
        """Whether the algorithm learns from fresh rollouts (PPO/A2C/...)."""
        try:
            return is_on_policy(self.subject.algo)
        except RemedyError:
            return False

    @property
    def continuous(self) -> bool:
        """Whether the action space is continuous."""
        return self.subject.traits.action_space == ActionSpaceType.continuous

    @property
    def env_name(self) -> str:
        """The env id without namespace and version ("LunarLander")."""
        return self.subject.env_id.split(":")[-1].split("/")[-1].split("-v")[0]

    @property
    def time_limit(self) -> int | None:
        """Episode step limit: from the signature (length / fraction), else the Gymnasium registry."""
        length, frac = self.feature("ep_len_mean"), self.feature("ep_len_frac")
        if length and frac and frac > 0:
            return round(length / frac)
        return registered_time_limit(self.subject.env_id)

    @property
    def learning_rate(self) -> float:
        """The run's learning rate (a number), else the algorithm's SB3 default."""
        lr = self.subject.hyperparams.get("learning_rate")
        return float(lr) if isinstance(lr, (int, float)) and lr > 0 else _DEFAULT_LR.get(self.algo, 3e-4)

    @property
    def default_learning_rate(self) -> float:
        """SB3's default learning rate for the algorithm."""
        return _DEFAULT_LR.get(self.algo, 3e-4)

    @property
    def success_spec(self) -> SuccessSpec | None:
        """The parsed success definition, or None when the subject's text is not a spec."""
        return success_from_text(self.subject.success or "")


_Op = Literal[">=", ">", "<=", "<", "=="]
#: the comparison operators a spec text names, as the literal type the success specs take
_OP_NAMES: dict[str, _Op] = {">=": ">=", ">": ">", "<=": "<=", "<": "<", "==": "=="}


def success_from_text(text: str) -> SuccessSpec | None:
    """A SuccessSpec from JSON or from its ``describe()`` text (what a Subject stores); None otherwise."""
    text = text.strip()
    if not text:
        return None
    try:
        return parse_success(json.loads(text))
    except Exception:  # not JSON: try the describe() forms below
        pass
    num = r"(-?[0-9.]+(?:e-?[0-9]+)?)"
    if m := re.fullmatch(r"obs\[(\d+)\] (>=|>|<=|<|==) " + num + " at the end", text):
        return FinalObs(index=int(m[1]), op=_OP_NAMES[m[2]], value=float(m[3]))
    if m := re.fullmatch(r"last reward (>=|>|<=|<|==) " + num, text):
        return FinalReward(op=_OP_NAMES[m[1]], value=float(m[2]))
    if m := re.fullmatch(r"info\['([^']+)'\] at the end", text):
        return InfoFlag(key=m[1])
    if text == "reaches a terminal goal state":
        return Terminated()
    return None


def registered_time_limit(env_id: str) -> int | None:
    """``max_episode_steps`` of the env's Gymnasium registration, or None.

    An id naming a module (``pkg.mod:Env-v0``) comes from a case or a request: gym.spec would import
    that module, so only the registered part is looked up.
    """
    env_id = env_id.rsplit(":", 1)[-1]
    try:
        import gymnasium as gym

        return gym.spec(env_id).max_episode_steps
    except Exception:  # unknown or unregistered env: no default to compare with
        return None


#: the features behind each symptom tag, quoted in rationales as evidence.
_SYMPTOM_FEATURES: dict[str, tuple[str, ...]] = {
    "hovering": ("truncation_rate", "ep_len_frac", "success_rate"),
    "timeouts": ("truncation_rate",),
    "never_succeeds": ("success_rate",),
    "low_success": ("success_rate",),
    "jerky_actions": ("action_jerk",),
    "saturated_actions": ("action_saturation",),
    "collapsed_entropy": ("entropy_drop", "entropy_final"),
    "premature_convergence": ("curve_plateau", "return_iqm"),
    "unstable_learning": ("curve_oscillation", "curve_collapse", "approx_kl_max"),
    "reward_hacking_suspected": ("reward_success_corr", "success_rate"),
    "constraint_violations": ("constraint_violation_rate",),
    "early_termination": ("early_termination_rate",),
    "low_coverage": ("state_coverage",),
    "unscaled_observations": ("obs_abs_max", "obs_scale_ratio"),
    "high_variance": ("return_spread", "return_std"),
    "poor_generalization": ("shifted_gap",),
    "undertrained": ("curve_plateau",),
}


# ---- conditions ------------------------------------------------------------------------------


class Condition:
    """Base of conditions: ``holds(facts)`` and ``describe(facts)`` (the evidence, with values)."""

    def holds(self, facts: Facts) -> bool:  # pragma: no cover - overridden
        raise NotImplementedError

    def describe(self, facts: Facts) -> str:  # pragma: no cover - overridden
        raise NotImplementedError


@dataclass(frozen=True)
class Symptom(Condition):
    """The signature carries symptom tag ``name``."""

    name: str

    def holds(self, facts: Facts) -> bool:
        return facts.has(self.name)

    def describe(self, facts: Facts) -> str:
        shown = [f"{n}={v:.3g}" for n in _SYMPTOM_FEATURES.get(self.name, ()) if (v := facts.feature(n)) is not None]
        return f"symptom {self.name}" + (f" ({', '.join(shown)})" if shown else "")


@dataclass(frozen=True)
class Feature(Condition):
    """Feature ``name`` compares to ``value`` (absent or NaN never holds)."""

    name: str
    op: str
    value: float

    def holds(self, facts: Facts) -> bool:
        v = facts.feature(self.name)
        return v is not None and _OPS[self.op](v, self.value)

    def describe(self, facts: Facts) -> str:
        v = facts.feature(self.name)
        return f"{self.name}={v:.3g}" if v is not None else f"{self.name} {self.op} {self.value:g}"


@dataclass(frozen=True)
class Trait(Condition):
    """The env's action space and/or reward density are as given."""

    action_space: ActionSpaceType | None = None
    reward_density: RewardDensity | None = None

    def holds(self, facts: Facts) -> bool:
        t = facts.subject.traits
        return (self.action_space is None or t.action_space == self.action_space) and (
            self.reward_density is None or t.reward_density == self.reward_density
        )

    def describe(self, facts: Facts) -> str:
        bits = [str(x.value) for x in (self.action_space, self.reward_density) if x is not None]
        return " ".join(bits) + (
            " actions"
            if self.action_space and not self.reward_density
            else " reward"
            if self.reward_density and not self.action_space
            else ""
        )


@dataclass(frozen=True)
class EnvIs(Condition):
    """The env's name (id without version) is one of ``names``."""

    names: tuple[str, ...]

    def holds(self, facts: Facts) -> bool:
        return facts.env_name in self.names

    def describe(self, facts: Facts) -> str:
        return f"env {facts.subject.env_id}"


@dataclass(frozen=True)
class AnyOf(Condition):
    """At least one of ``conditions`` holds."""

    conditions: tuple[Condition, ...]

    def holds(self, facts: Facts) -> bool:
        return any(c.holds(facts) for c in self.conditions)

    def describe(self, facts: Facts) -> str:
        held = [c.describe(facts) for c in self.conditions if c.holds(facts)]
        return " / ".join(held) or "any of " + ", ".join(c.describe(facts) for c in self.conditions)


@dataclass(frozen=True)
class Not(Condition):
    """``condition`` does not hold."""

    condition: Condition

    def holds(self, facts: Facts) -> bool:
        return not self.condition.holds(facts)

    def describe(self, facts: Facts) -> str:
        return f"not {self.condition.describe(facts)}"


@dataclass(frozen=True)
class TimeLimitShort(Condition):
    """The time limit in use is below ``fraction`` of the env's registered default."""

    fraction: float = 0.9

    def holds(self, facts: Facts) -> bool:
        used, default = facts.time_limit, registered_time_limit(facts.subject.env_id)
        return bool(used and default and used < self.fraction * default)

    def describe(self, facts: Facts) -> str:
        return f"time limit {facts.time_limit} < registered {registered_time_limit(facts.subject.env_id)}"


@dataclass(frozen=True)
class LearningRate(Condition):
    """The run's learning rate compares (``op``) to ``ratio`` x SB3's default for the algorithm."""

    op: str
    ratio: float

    def holds(self, facts: Facts) -> bool:
        lr = facts.subject.hyperparams.get("learning_rate")
        return isinstance(lr, (int, float)) and _OPS[self.op](float(lr), self.ratio * facts.default_learning_rate)

    def describe(self, facts: Facts) -> str:
        lr = facts.subject.hyperparams.get("learning_rate")
        return f"learning_rate={lr:g} vs SB3 default {facts.default_learning_rate:g} for {facts.algo}"


#: The span of learning rates in RL Baselines3 Zoo's tuned PPO configs (hyperparams/ppo.yml: 2.06e-5 for
#: HalfCheetah-v4 up to 1e-3 for CartPole-v1/Pendulum-v1), as ratios to SB3's PPO default 3e-4. A learning
#: rate outside what tuned configs ever use is suspect; the thresholds come from that span, not the suite.
LR_HIGH_RATIO = 1e-3 / 3e-4
LR_LOW_RATIO = 2.0633e-05 / 3e-4

#: RL Baselines3 Zoo's tuned training budgets (n_timesteps, PPO where listed), by env name.
ZOO_STEPS: dict[str, int] = {
    "CartPole": 100_000,
    "Acrobot": 1_000_000,
    "MountainCar": 1_000_000,
    "MountainCarContinuous": 50_000,
    "Pendulum": 100_000,
    "LunarLander": 1_000_000,
    "BipedalWalker": 5_000_000,
    "HalfCheetah": 1_000_000,
    "Hopper": 1_000_000,
    "Walker2d": 1_000_000,
    "Ant": 1_000_000,
    "Swimmer": 1_000_000,
}


@dataclass(frozen=True)
class BudgetBelow(Condition):
    """The run trained for less than ``fraction`` of the RL Zoo budget for its env."""

    fraction: float = 0.1

    def holds(self, facts: Facts) -> bool:
        zoo, steps = ZOO_STEPS.get(facts.env_name), facts.subject.train_steps
        return bool(zoo and steps is not None and steps < self.fraction * zoo)

    def describe(self, facts: Facts) -> str:
        return f"train_steps={facts.subject.train_steps:,} < {self.fraction:g} x RL Zoo's {ZOO_STEPS.get(facts.env_name, 0):,}"
