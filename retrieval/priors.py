"""The built-in prior rulebook: what an experienced RL engineer would suspect first.

A cold KB (no cases, no accepted rules) still gives sensible advice from these.
Each :class:`PriorRule` has conditions over the signature's features and
symptoms and the env's traits, the root causes it suggests with a base
confidence, patch templates instantiated with env-aware parameters (a time
cost a tenth of the per-step reward, a budget as a multiple of the original
training steps, a learning rate a third of the current one), and the
``source`` it comes from. No constant is taken from the bench scenarios' own
settings: each is derived from a named source (RL Zoo, SB3 docs, Gymnasium docs,
papers) or from a stated first-principles argument. Reward code written here obeys the reward-shaping
contract and the sandbox (tests run every template through it).
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from remedy.cases.algos import canonical_algo, is_on_policy
from remedy.cases.errors import RemedyError
from remedy.cases.model import ActionSpaceType, RemedyFamily, RewardDensity, RootCause, Signature, Subject
from remedy.cases.patches.spec import (
    ActionMagnitude,
    ActionSmoothness,
    Curriculum,
    CurriculumStage,
    ExplorationBonus,
    Hyperparameters,
    Normalization,
    Patch,
    RewardShaping,
    SafetyConstraint,
    TimeLimit,
    TrainingBudget,
)
from remedy.cases.success import FinalObs, FinalReward, InfoFlag, Terminated, parse_success

if TYPE_CHECKING:
    from .diagnosis import ComputeCost

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
    "MAX_BUDGET_MULTIPLE",
    "Template",
    "PriorRule",
    "PriorMatch",
    "PRIORS",
    "match_priors",
    "prior_by_id",
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
    def success_spec(self) -> Any:
        """The parsed success definition, or None when the subject's text is not a spec."""
        return success_from_text(self.subject.success or "")


_Op = Literal[">=", ">", "<=", "<", "=="]
#: the comparison operators a spec text names, as the literal type the success specs take
_OP_NAMES: dict[str, _Op] = {">=": ">=", ">": ">", "<=": "<=", "<": "<", "==": "=="}


def success_from_text(text: str) -> Any:
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


# ---- patch templates -------------------------------------------------------------------------


@dataclass(frozen=True)
class Template:
    """A candidate patch built from the facts (``build`` returns None when it does not apply)."""

    family: RemedyFamily
    build: Callable[[Facts], Patch | None]
    rationale: str
    expected_effect: str
    side_effects: str
    compute_cost: ComputeCost = "low"
    weight: float = 1.0  # relative to the rule's other templates


@dataclass(frozen=True)
class PriorRule:
    """One prior: when ``conditions`` all hold, suspect ``causes`` and try ``templates``."""

    id: str
    title: str
    conditions: tuple[Condition, ...]
    causes: tuple[tuple[RootCause, float], ...]
    templates: tuple[Template, ...]
    source: str

    def holds(self, facts: Facts) -> bool:
        """Whether every condition holds."""
        return all(c.holds(facts) for c in self.conditions)

    def evidence(self, facts: Facts) -> tuple[str, ...]:
        """The conditions, described with the subject's values."""
        return tuple(c.describe(facts) for c in self.conditions)


@dataclass(frozen=True)
class PriorMatch:
    """A prior whose conditions hold, with the evidence and the instantiated patches."""

    rule: PriorRule
    evidence: tuple[str, ...]
    patches: tuple[tuple[Template, Patch], ...] = field(default_factory=tuple)


# Reward code: every template guards its inputs, because the sandbox fuzzes them with NaN, inf and
# huge values and wants a finite float back (BACKGROUND.md: hallucinated code must not crash training).
#: the env's own reward when a setup wrapper changed it (cases.wrappers records it in info), else the reward.
_ORIGINAL = 'info.get("original_reward", reward)'

_GUARD = """
def _finite(x, lo=-1e6, hi=1e6):
    x = float(x)
    if not math.isfinite(x):
        return 0.0
    return max(lo, min(hi, x))
"""


def _code_time_cost(cost: float) -> str:
    return f"""{_GUARD}
def shaped_reward(obs, action, reward, next_obs, terminated, truncated, info):
    # the env's own reward (undoing any setup wrapper that paid for survival) minus a per-step time cost:
    # running out the clock must cost more than it earns
    r = _finite({_ORIGINAL})
    return r - {cost:.4g}
"""


def _success_expr(spec: Any) -> str | None:
    if isinstance(spec, FinalObs):
        return f"terminated and _finite(_at(next_obs, {spec.index})) {spec.op} {spec.value!r}"
    if isinstance(spec, FinalReward):
        return f"terminated and _finite({_ORIGINAL}) {spec.op} {spec.value!r}"
    if isinstance(spec, InfoFlag):
        return f"bool(info.get({spec.key!r}, False))"
    if isinstance(spec, Terminated) and not spec.survive:
        return "terminated and not truncated"
    return None


_AT = """
def _at(o, i):
    o = np.asarray(o, dtype=float).ravel()
    return _finite(o[i], -1e3, 1e3) if i < o.shape[0] else 0.0
"""


def _code_sparse_success(facts: Facts) -> str | None:
    cond = _success_expr(facts.success_spec)
    if cond is None and facts.env_name == "LunarLander":
        cond = f"terminated and _finite({_ORIGINAL}) >= 50.0"
    if cond is None:
        return None
    return f"""{_GUARD}{_AT}
def shaped_reward(obs, action, reward, next_obs, terminated, truncated, info):
    # sparse and hard to game: +100 on task success, -0.1 per step (BACKGROUND.md)
    if {cond}:
        return 100.0
    return -0.1
"""


def _code_potential(facts: Facts) -> str | None:
    """Potential-based shaping F = gamma * phi(s') - phi(s) (Ng et al. 1999: keeps the optimal policy)."""
    gamma = facts.subject.hyperparams.get("gamma", 0.99)
    gamma = float(gamma) if isinstance(gamma, (int, float)) and 0 < gamma <= 1 else 0.99
    if facts.env_name in ("MountainCar", "MountainCarContinuous"):
        # mechanical energy: height plus kinetic energy; the car must build momentum to climb
        phi = "100.0 * (0.0025 * math.sin(3.0 * _at(o, 0)) + 0.5 * _at(o, 1) ** 2)"
    elif isinstance(facts.success_spec, FinalObs):
        s = facts.success_spec
        phi = f"-min(10.0, abs({s.value!r} - _at(o, {s.index})))"
    else:
        return None
    return f"""{_GUARD}{_AT}
GAMMA = {gamma!r}

def _phi(o):
    return _finite({phi}, -100.0, 100.0)

def shaped_reward(obs, action, reward, next_obs, terminated, truncated, info):
    # potential-based shaping: a dense hint that leaves the optimal policy unchanged (Ng et al. 1999)
    before = _phi(obs)
    after = 0.0 if terminated else _phi(next_obs)
    return _finite(info.get("original_reward", reward)) + GAMMA * after - before
"""


def _hovering_cost(facts: Facts) -> float:
    # A tenth of the agent's typical per-step reward: large enough that stalling to the time limit
    # adds up (a 1,000-step episode pays 100 steps' worth), small enough not to swamp the task's own
    # signal (SB3 docs, RL Tips and Tricks: keep reward terms on comparable scales). No env-specific
    # value and no bonus on top of the env's own terminal reward.
    return round(max(0.01, 0.1 * abs(facts.feature("reward_per_step") or 1.0)), 4)


def _build_time_cost(facts: Facts) -> Patch:
    cost = _hovering_cost(facts)
    desc = f"per-step time cost {cost:g}"
    return Patch(parts=[RewardShaping(description=desc, code=_code_time_cost(cost))], description=desc)


def _build_sparse_success(facts: Facts) -> Patch | None:
    code = _code_sparse_success(facts)
    if code is None:
        return None
    desc = "sparse success reward: +100 on success, -0.1 per step"
    return Patch(parts=[RewardShaping(description=desc, code=code)], description=desc)


def _build_potential(facts: Facts) -> Patch | None:
    code = _code_potential(facts)
    if code is None:
        return None
    desc = "potential-based progress shaping (Ng et al. 1999)"
    return Patch(parts=[RewardShaping(description=desc, code=code)], description=desc)


def _build_smoothness(facts: Facts) -> Patch | None:
    if not facts.continuous:
        return None
    jerk = facts.feature("action_jerk") or 0.3
    coef = round(min(1.0, max(0.05, 0.5 * jerk)), 3)  # jerkier policies need a firmer penalty
    return Patch(parts=[ActionSmoothness(coef=coef)])


def _build_magnitude(facts: Facts) -> Patch | None:
    return Patch(parts=[ActionMagnitude(coef=0.05)]) if facts.continuous else None


def _build_obs_norm(facts: Facts) -> Patch:
    return Patch(parts=[Normalization(obs=True, reward=False)])


def _build_reward_norm(facts: Facts) -> Patch:
    return Patch(parts=[Normalization(obs=False, reward=True)])


def _build_exploration(facts: Facts) -> Patch | None:
    if facts.algo in ("DQN", "QRDQN"):
        return Patch(
            parts=[Hyperparameters(changes={"exploration_fraction": 0.3, "exploration_final_eps": 0.1})],
            description="longer epsilon-greedy exploration",
        )
    if facts.on_policy and facts.algo != "ARS":
        current = facts.subject.hyperparams.get("ent_coef", 0.0)
        current = float(current) if isinstance(current, (int, float)) else 0.0
        return Patch(parts=[ExplorationBonus(ent_coef=round(max(0.01, 5 * current), 4))])
    return None


def _build_count_bonus(facts: Facts) -> Patch:
    return Patch(parts=[ExplorationBonus(count_bonus=0.1)])


def _build_lower_lr(facts: Facts) -> Patch | None:
    if facts.learning_rate <= facts.default_learning_rate / 3:  # already small: lowering it further is no fix
        return None
    changes: dict[str, Any] = {"learning_rate": float(f"{facts.learning_rate / 3:.3g}")}
    if facts.algo in ("PPO", "RecurrentPPO", "MaskablePPO"):
        clip = facts.subject.hyperparams.get("clip_range", 0.2)
        clip = float(clip) if isinstance(clip, (int, float)) else 0.2
        changes["clip_range"] = round(min(0.1, clip / 2), 3)
    return Patch(parts=[Hyperparameters(changes=changes)])


def _build_default_lr(facts: Facts) -> Patch:
    return Patch(
        parts=[Hyperparameters(changes={"learning_rate": facts.default_learning_rate})],
        description=f"learning rate back to SB3's default {facts.default_learning_rate:g}",
    )


#: The largest extra training budget Remedy proposes, as a multiple of the run's own steps: doubling,
#: the step of a geometric (doubling) search over budgets, which finds a sufficient budget within a
#: factor of two at a total cost at most twice that budget (the classic doubling argument; geometric
#: budgets as in Hyperband, Li et al. 2018). Chosen from that argument, not from the bench suite.
MAX_BUDGET_MULTIPLE = 1.0


def _budget_steps(facts: Facts, fraction: float) -> int:
    # An undertrained agent needs a multiple of its budget, not a small top-up; the Zoo's tuned
    # budget for the env (n_timesteps) caps the cost.
    steps = facts.subject.train_steps or 100_000
    extra = steps * fraction
    cap = ZOO_STEPS.get(facts.env_name)
    if cap:
        extra = min(extra, max(cap - steps, steps * 0.25))
    return max(1_000, int(round(extra, -3)))


def _build_budget(fraction: float) -> Callable[[Facts], Patch]:
    def build(facts: Facts) -> Patch:
        return Patch(parts=[TrainingBudget(extra_steps=_budget_steps(facts, fraction))])

    return build


def _build_time_limit(facts: Facts) -> Patch | None:
    used = facts.time_limit
    if not used:
        return None
    default = registered_time_limit(facts.subject.env_id) or 0
    return Patch(parts=[TimeLimit(max_episode_steps=int(max(2 * used, default)))])


def _build_safety(facts: Facts) -> Patch | None:
    if not facts.constraints:  # without a declared constraint there is nothing to enforce
        return None
    predicate = " or ".join(f"({c})" for c in facts.constraints) if len(facts.constraints) > 1 else facts.constraints[0]
    return Patch(
        parts=[
            SafetyConstraint(
                description="penalize the declared constraint where it is broken",
                predicate=predicate,
                mode="penalty",
                penalty=1.0,
            )
        ]
    )


#: Domain-randomization stages around each env's documented defaults (Gymnasium env docs): LunarLander
#: from calm air to its default wind (wind_power 15.0; the docs recommend 0-20) in two steps; Pendulum
#: at its default g = 10.0 and 10% either side.
_RANDOMIZE: dict[str, list[dict[str, Any]]] = {
    "LunarLander": [{}, {"enable_wind": True, "wind_power": 7.5}, {"enable_wind": True, "wind_power": 15.0}],
    "Pendulum": [{"g": 10.0}, {"g": 9.0}, {"g": 11.0}],
    "CartPole": [{}, {}, {}],
}


def _build_curriculum(facts: Facts) -> Patch | None:
    stages = _RANDOMIZE.get(facts.env_name)
    if not stages or not any(stages):
        return None
    keep = {k: v for k, v in facts.subject.env_kwargs.items() if k not in ("enable_wind", "wind_power", "g")}
    parts = [CurriculumStage(env_kwargs={**keep, **s}, fraction=round(1 / len(stages), 4)) for s in stages]
    return Patch(parts=[Curriculum(stages=parts)], description="randomize the env over shifted variants")


# ---- the rulebook ----------------------------------------------------------------------------

_C = RootCause
_F = RemedyFamily
_CONT = Trait(action_space=ActionSpaceType.continuous)
_SB3_TIPS = "SB3 docs, 'Reinforcement Learning Tips and Tricks'"
_ZOO = "RL Baselines3 Zoo tuned hyperparameters"
_ANDRY = "Andrychowicz et al. 2021, 'What Matters in On-Policy RL?'"

_T_TIME_COST = Template(
    _F.reward_shaping,
    _build_time_cost,
    "a per-step cost makes stalling expensive",
    "episodes end by reaching the goal; success rate up, episode length down",
    "may make the agent rush or crash to end episodes early; check crash rate",
    "medium",
)
_T_SPARSE = Template(
    _F.reward_shaping,
    _build_sparse_success,
    "a sparse success reward cannot be gamed the way a clever dense term can",
    "reward tracks the task metric again",
    "slower learning signal; may need a larger budget",
    "medium",
    0.8,
)
_T_POTENTIAL = Template(
    _F.reward_shaping,
    _build_potential,
    "potential-based shaping adds a dense hint without changing the optimal policy",
    "the agent finds the goal sooner",
    "a badly chosen potential slows learning",
    "low",
)
_T_BUDGET = Template(
    _F.training_budget,
    _build_budget(MAX_BUDGET_MULTIPLE),
    "more training at the same settings",
    "returns keep rising where the curve had not flattened",
    "none on behaviour; costs env steps",
    "medium",
)
_T_BUDGET_SMALL = Template(
    _F.training_budget,
    _build_budget(MAX_BUDGET_MULTIPLE / 2),
    "a modest extra budget",
    "small gains if still learning",
    "costs env steps",
    "medium",
    0.6,
)
_T_EXPLORE = Template(
    _F.exploration_bonus,
    _build_exploration,
    "more exploration keeps the policy from locking in early",
    "wider state coverage; escapes the poor plateau",
    "noisier actions early in fine-tuning",
    "low",
)
_T_COUNT = Template(
    _F.exploration_bonus,
    _build_count_bonus,
    "a novelty bonus pays for visiting new states",
    "reaches the sparse goal at least sometimes",
    "can distract once the goal is found",
    "medium",
    0.7,
)
_T_LR = Template(
    _F.hyperparameters,
    _build_lower_lr,
    "smaller, clipped updates stop the policy from overshooting",
    "a smoother learning curve without collapses",
    "slower progress per step",
    "low",
)
_T_OBS_NORM = Template(
    _F.normalization,
    _build_obs_norm,
    "running mean/std normalization puts every input on unit scale",
    "faster, more stable learning",
    "statistics must be saved with the model (vecnormalize.pkl)",
    "low",
)
_T_REW_NORM = Template(
    _F.normalization,
    _build_reward_norm,
    "reward scaling tames noisy, badly scaled returns",
    "a steadier value function and learning curve",
    "changes the reward scale the critic sees",
    "low",
    0.8,
)

PRIORS: tuple[PriorRule, ...] = (
    PriorRule(
        "prior-hovering-time-cost",
        "hovering: the reward pays for staying alive",
        (Symptom("hovering"),),
        ((_C.reward_misspecification, 0.8), (_C.time_limit_misconfiguration, 0.1)),
        (_T_TIME_COST, _T_BUDGET_SMALL),
        _SB3_TIPS + "; Amodei et al. 2016 (reward misspecification)",
    ),
    PriorRule(
        "prior-timeouts-no-goal",
        "runs out the clock and never reaches the goal",
        (
            Symptom("timeouts"),
            Symptom("never_succeeds"),
            Not(Symptom("hovering")),
            Not(TimeLimitShort()),
            Not(Feature("reward_per_step", "<=", -0.5)),
        ),  # the env already charges for time (Acrobot)
        ((_C.reward_misspecification, 0.4), (_C.insufficient_exploration, 0.3)),
        (_T_TIME_COST, _T_EXPLORE),
        _SB3_TIPS,
    ),
    PriorRule(
        "prior-time-limit-short",
        "time limit below the env's default",
        (Symptom("timeouts"), TimeLimitShort()),
        ((_C.time_limit_misconfiguration, 0.85),),
        (
            Template(
                _F.time_limit,
                _build_time_limit,
                "the task cannot be finished in the steps allowed",
                "episodes end at the goal instead of the clock",
                "longer episodes cost more env steps",
                "low",
            ),
        ),
        "Pardo et al. 2018, 'Time Limits in Reinforcement Learning'",
    ),
    PriorRule(
        "prior-jerky-continuous",
        "bang-bang control on continuous actions",
        (Symptom("jerky_actions"), _CONT),
        ((_C.action_jitter, 0.85),),
        (
            Template(
                _F.action_smoothness,
                _build_smoothness,
                "penalizing the change between consecutive actions smooths control",
                "lower action jerk at similar return",
                "too strong a penalty makes control sluggish",
                "low",
            ),
        ),
        "Mysore et al. 2021, 'Regularizing Action Policies for Smooth Control' (CAPS)",
    ),
    PriorRule(
        "prior-saturated-continuous",
        "actions pinned at their bounds",
        (Symptom("saturated_actions"), _CONT),
        ((_C.action_jitter, 0.4), (_C.unstable_optimization, 0.15)),
        (
            Template(
                _F.action_magnitude,
                _build_magnitude,
                "an effort penalty pulls actions off the bounds",
                "less saturation and fuel use",
                "can weaken control authority where it is needed",
                "low",
                0.8,
            ),
        ),
        _SB3_TIPS + " (normalize and bound the action space)",
    ),
    PriorRule(
        "prior-unscaled-obs",
        "observations far from unit scale",
        (AnyOf((Symptom("unscaled_observations"), Feature("obs_abs_max", ">=", 100.0))),),
        ((_C.observation_scaling, 0.9),),
        (_T_OBS_NORM,),
        _SB3_TIPS + "; " + _ZOO + " (normalize: true)",
    ),
    PriorRule(
        "prior-sparse-never",
        "sparse reward and the goal is never found",
        (Symptom("never_succeeds"), AnyOf((Trait(reward_density=RewardDensity.sparse), Symptom("sparse_signal")))),
        ((_C.sparse_reward, 0.8), (_C.insufficient_exploration, 0.45)),
        (_T_POTENTIAL, _T_COUNT, _T_EXPLORE),
        "Ng et al. 1999, 'Policy Invariance under Reward Transformations'; " + _SB3_TIPS,
    ),
    PriorRule(
        "prior-low-coverage",
        "the agent explores little of the state space",
        (Symptom("low_coverage"), AnyOf((Symptom("low_success"), Symptom("never_succeeds")))),
        ((_C.insufficient_exploration, 0.6),),
        (_T_EXPLORE, _T_COUNT),
        _SB3_TIPS + "; " + _ANDRY,
    ),
    PriorRule(
        "prior-entropy-collapse",
        "the policy turned deterministic early",
        (AnyOf((Symptom("collapsed_entropy"), Feature("entropy_drop", ">=", 0.9))),),
        ((_C.premature_convergence, 0.75), (_C.insufficient_exploration, 0.35)),
        (_T_EXPLORE,),
        _ANDRY + "; " + _ZOO + " (ent_coef)",
    ),
    PriorRule(
        "prior-premature-plateau",
        "learning plateaued early at a poor return",
        (Symptom("premature_convergence"),),
        ((_C.premature_convergence, 0.6), (_C.insufficient_exploration, 0.25)),
        (_T_EXPLORE, _T_LR),
        _ANDRY,
    ),
    PriorRule(
        "prior-unstable",
        "the learning curve oscillates or collapses",
        (Symptom("unstable_learning"),),
        ((_C.unstable_optimization, 0.75),),
        (_T_LR,),
        _ANDRY + "; " + _ZOO + " (learning rates, clip ranges)",
    ),
    PriorRule(
        "prior-large-kl",
        "PPO updates far beyond the trust region",
        (Feature("approx_kl_max", ">=", 0.1),),
        ((_C.unstable_optimization, 0.6),),
        (_T_LR,),
        "Schulman et al. 2017 (PPO); " + _ANDRY,
    ),
    PriorRule(
        "prior-collapse",
        "training return collapsed from its best",
        (Feature("curve_collapse", ">=", 0.5), Not(Symptom("unstable_learning"))),
        ((_C.unstable_optimization, 0.5),),
        (_T_LR,),
        _ANDRY,
    ),
    PriorRule(
        "prior-nan",
        "NaN or inf during rollouts",
        (Symptom("numerical_instability"),),
        ((_C.unstable_optimization, 0.5), (_C.observation_scaling, 0.35)),
        (
            Template(
                _F.normalization,
                lambda f: Patch(parts=[Normalization(obs=True, reward=True)]),
                "normalized inputs and rewards keep values finite",
                "no more NaNs",
                "statistics must be saved with the model",
                "low",
            ),
            _T_LR,
        ),
        _SB3_TIPS,
    ),
    PriorRule(
        "prior-undertrained",
        "returns still rising when training stopped",
        (Symptom("undertrained"),),
        ((_C.undertraining, 0.85),),
        (_T_BUDGET,),
        _SB3_TIPS + " ('RL needs many samples'); " + _ZOO + " (n_timesteps)",
    ),
    PriorRule(
        "prior-tiny-budget",
        "trained for a small fraction of a known-good budget",
        (BudgetBelow(0.1), AnyOf((Symptom("low_success"), Symptom("never_succeeds")))),
        ((_C.undertraining, 0.85),),
        (_T_BUDGET,),
        _ZOO + " (n_timesteps); " + _SB3_TIPS,
    ),
    PriorRule(
        "prior-lr-too-high",
        "learning rate far above the algorithm's default",
        (LearningRate(">", LR_HIGH_RATIO),),
        ((_C.unstable_optimization, 0.85),),
        (
            Template(
                _F.hyperparameters,
                _build_default_lr,
                "updates that large overshoot and undo learning",
                "a curve that climbs instead of collapsing",
                "slower early progress",
                "low",
            ),
        ),
        _ZOO + "; " + _ANDRY + " (learning rate is the most important PPO setting)",
    ),
    PriorRule(
        "prior-lr-too-low",
        "learning rate far below the algorithm's default",
        (
            LearningRate("<", LR_LOW_RATIO),
            AnyOf((Symptom("low_success"), Symptom("never_succeeds"), Symptom("premature_convergence"))),
        ),
        ((_C.undertraining, 0.6), (_C.unstable_optimization, 0.35)),
        (
            Template(
                _F.hyperparameters,
                _build_default_lr,
                "the policy barely moves between updates",
                "learning resumes within the same budget",
                "less stable if the default is too high here",
                "low",
            ),
        ),
        _ZOO + "; " + _ANDRY,
    ),
    PriorRule(
        "prior-low-success-rising",
        "partial success and a curve that had not flattened",
        (Symptom("low_success"), Not(Symptom("never_succeeds")), Feature("curve_plateau", "<", 0.5)),
        ((_C.undertraining, 0.45),),
        (_T_BUDGET,),
        _SB3_TIPS,
    ),
    PriorRule(
        "prior-low-success",
        "succeeds less than half the time",
        (Symptom("low_success"),),
        ((_C.undertraining, 0.2), (_C.insufficient_exploration, 0.1)),
        (_T_BUDGET_SMALL,),
        _SB3_TIPS,
    ),
    PriorRule(
        "prior-reward-hacking",
        "reward up while the task metric is not",
        (Symptom("reward_hacking_suspected"),),
        ((_C.reward_hacking, 0.85), (_C.reward_misspecification, 0.3)),
        (_T_SPARSE,),
        "Amodei et al. 2016, 'Concrete Problems in AI Safety'; BACKGROUND.md",
    ),
    PriorRule(
        "prior-constraints",
        "breaks declared safety constraints",
        (AnyOf((Symptom("constraint_violations"), Feature("constraint_violation_rate", ">", 0.01))),),
        ((_C.safety_violation, 0.9),),
        (
            Template(
                _F.safety_constraint,
                _build_safety,
                "penalize the violation where it happens",
                "fewer violations at a small cost in return",
                "an over-strong penalty freezes the agent",
                "low",
            ),
        ),
        "Amodei et al. 2016; Achiam et al. 2017, 'Constrained Policy Optimization'",
    ),
    PriorRule(
        "prior-generalization",
        "performance drops on shifted variants",
        (AnyOf((Symptom("poor_generalization"), Feature("shifted_gap", "<=", -0.3))),),
        ((_C.generalization_gap, 0.85),),
        (
            Template(
                _F.curriculum,
                _build_curriculum,
                "training across variants (domain randomization)",
                "a smaller gap on shifted envs",
                "nominal return may dip slightly",
                "medium",
            ),
        ),
        "Tobin et al. 2017 (domain randomization); Cobbe et al. 2019 (Procgen)",
    ),
    PriorRule(
        "prior-noisy-returns",
        "returns vary widely and the curve oscillates",
        (Symptom("high_variance"), AnyOf((Feature("curve_oscillation", ">=", 0.3), Symptom("unstable_learning")))),
        ((_C.unstable_optimization, 0.35), (_C.reward_misspecification, 0.15)),
        (_T_REW_NORM, _T_LR),
        _SB3_TIPS + " (VecNormalize); " + _ANDRY,
    ),
    PriorRule(
        "prior-early-termination",
        "episodes end early by failure",
        (Symptom("early_termination"), AnyOf((Symptom("low_success"), Symptom("never_succeeds")))),
        ((_C.undertraining, 0.3), (_C.reward_misspecification, 0.2)),
        (_T_BUDGET_SMALL,),
        _SB3_TIPS,
    ),
)


def prior_by_id(rule_id: str) -> PriorRule:
    """The prior with ``rule_id`` (KeyError when unknown)."""
    for rule in PRIORS:
        if rule.id == rule_id:
            return rule
    raise KeyError(rule_id)


def match_priors(
    subject: Subject, signature: Signature, priors: tuple[PriorRule, ...] = PRIORS, constraints: tuple[str, ...] = ()
) -> list[PriorMatch]:
    """The priors whose conditions hold for this subject, with evidence and instantiated patches.

    ``constraints`` are the run's declared safety constraints (expressions true when violated).
    """
    facts = Facts(subject, signature, tuple(constraints))
    out = []
    for rule in priors:
        if not rule.holds(facts):
            continue
        built = tuple((t, p) for t in rule.templates if (p := t.build(facts)) is not None)
        out.append(PriorMatch(rule=rule, evidence=rule.evidence(facts), patches=built))
    return out
