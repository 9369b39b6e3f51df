"""The prior rulebook's patch templates: candidate patches built from a subject's facts.

Each :class:`Template` instantiates a patch with env-aware parameters (a time cost a tenth of the
per-step reward, a budget as a multiple of the original training steps, a learning rate a third of
the current one). Reward code written here obeys the reward-shaping contract and the sandbox (tests
run every template through it). The named templates at the bottom are shared by the measured priors
(:mod:`remedy.retrieval.priors`) and the description priors (:mod:`remedy.retrieval.text_priors`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from remedy.cases.model import RemedyFamily
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
from remedy.cases.success import FinalObs, FinalReward, InfoFlag, SuccessSpec, Terminated

from .prior_conditions import ZOO_STEPS, Facts, registered_time_limit

if TYPE_CHECKING:
    from .diagnosis import ComputeCost

__all__ = [
    "Template",
    "MAX_BUDGET_MULTIPLE",
    "SB3_TIPS",
    "ZOO_SOURCE",
    "ANDRYCHOWICZ",
    "T_TIME_COST",
    "T_SPARSE",
    "T_POTENTIAL",
    "T_BUDGET",
    "T_BUDGET_SMALL",
    "T_EXPLORE",
    "T_COUNT",
    "T_LR",
    "T_OBS_NORM",
    "T_REW_NORM",
    "T_TIME_LIMIT",
    "T_SMOOTHNESS",
    "T_MAGNITUDE",
    "T_NORM_BOTH",
    "T_DEFAULT_LR_HIGH",
    "T_DEFAULT_LR_LOW",
    "T_SAFETY",
    "T_CURRICULUM",
]

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


def _success_expr(spec: SuccessSpec | None) -> str | None:
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


# ---- the named templates (and the sources rules cite) ------------------------------------------

_F = RemedyFamily
SB3_TIPS = "SB3 docs, 'Reinforcement Learning Tips and Tricks'"
ZOO_SOURCE = "RL Baselines3 Zoo tuned hyperparameters"
ANDRYCHOWICZ = "Andrychowicz et al. 2021, 'What Matters in On-Policy RL?'"

T_TIME_COST = Template(
    _F.reward_shaping,
    _build_time_cost,
    "a per-step cost makes stalling expensive",
    "episodes end by reaching the goal; success rate up, episode length down",
    "may make the agent rush or crash to end episodes early; check crash rate",
    "medium",
)
T_SPARSE = Template(
    _F.reward_shaping,
    _build_sparse_success,
    "a sparse success reward cannot be gamed the way a clever dense term can",
    "reward tracks the task metric again",
    "slower learning signal; may need a larger budget",
    "medium",
    0.8,
)
T_POTENTIAL = Template(
    _F.reward_shaping,
    _build_potential,
    "potential-based shaping adds a dense hint without changing the optimal policy",
    "the agent finds the goal sooner",
    "a badly chosen potential slows learning",
    "low",
)
T_BUDGET = Template(
    _F.training_budget,
    _build_budget(MAX_BUDGET_MULTIPLE),
    "more training at the same settings",
    "returns keep rising where the curve had not flattened",
    "none on behaviour; costs env steps",
    "medium",
)
T_BUDGET_SMALL = Template(
    _F.training_budget,
    _build_budget(MAX_BUDGET_MULTIPLE / 2),
    "a modest extra budget",
    "small gains if still learning",
    "costs env steps",
    "medium",
    0.6,
)
T_EXPLORE = Template(
    _F.exploration_bonus,
    _build_exploration,
    "more exploration keeps the policy from locking in early",
    "wider state coverage; escapes the poor plateau",
    "noisier actions early in fine-tuning",
    "low",
)
T_COUNT = Template(
    _F.exploration_bonus,
    _build_count_bonus,
    "a novelty bonus pays for visiting new states",
    "reaches the sparse goal at least sometimes",
    "can distract once the goal is found",
    "medium",
    0.7,
)
T_LR = Template(
    _F.hyperparameters,
    _build_lower_lr,
    "smaller, clipped updates stop the policy from overshooting",
    "a smoother learning curve without collapses",
    "slower progress per step",
    "low",
)
T_OBS_NORM = Template(
    _F.normalization,
    _build_obs_norm,
    "running mean/std normalization puts every input on unit scale",
    "faster, more stable learning",
    "statistics must be saved with the model (vecnormalize.pkl)",
    "low",
)
T_REW_NORM = Template(
    _F.normalization,
    _build_reward_norm,
    "reward scaling tames noisy, badly scaled returns",
    "a steadier value function and learning curve",
    "changes the reward scale the critic sees",
    "low",
    0.8,
)
T_TIME_LIMIT = Template(
    _F.time_limit,
    _build_time_limit,
    "the task cannot be finished in the steps allowed",
    "episodes end at the goal instead of the clock",
    "longer episodes cost more env steps",
    "low",
)
T_SMOOTHNESS = Template(
    _F.action_smoothness,
    _build_smoothness,
    "penalizing the change between consecutive actions smooths control",
    "lower action jerk at similar return",
    "too strong a penalty makes control sluggish",
    "low",
)
T_MAGNITUDE = Template(
    _F.action_magnitude,
    _build_magnitude,
    "an effort penalty pulls actions off the bounds",
    "less saturation and fuel use",
    "can weaken control authority where it is needed",
    "low",
    0.8,
)
T_NORM_BOTH = Template(
    _F.normalization,
    lambda f: Patch(parts=[Normalization(obs=True, reward=True)]),
    "normalized inputs and rewards keep values finite",
    "no more NaNs",
    "statistics must be saved with the model",
    "low",
)
T_DEFAULT_LR_HIGH = Template(
    _F.hyperparameters,
    _build_default_lr,
    "updates that large overshoot and undo learning",
    "a curve that climbs instead of collapsing",
    "slower early progress",
    "low",
)
T_DEFAULT_LR_LOW = Template(
    _F.hyperparameters,
    _build_default_lr,
    "the policy barely moves between updates",
    "learning resumes within the same budget",
    "less stable if the default is too high here",
    "low",
)
T_SAFETY = Template(
    _F.safety_constraint,
    _build_safety,
    "penalize the violation where it happens",
    "fewer violations at a small cost in return",
    "an over-strong penalty freezes the agent",
    "low",
)
T_CURRICULUM = Template(
    _F.curriculum,
    _build_curriculum,
    "training across variants (domain randomization)",
    "a smaller gap on shifted envs",
    "nominal return may dip slightly",
    "medium",
)
