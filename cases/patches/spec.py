"""Typed, declarative patches: what a fix *is*, independent of how it is applied.

A :class:`Patch` is an ordered list of parts; parts compose (a reward-shaping
part and a hyperparameter delta can travel together). Each part is a frozen
pydantic model with a literal ``kind`` so files and HTTP bodies parse into the
right type. Applying parts to an env/algorithm lives in ``cases.patches.apply``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "RewardShaping",
    "ActionSmoothness",
    "ActionMagnitude",
    "Hyperparameters",
    "Normalization",
    "TimeLimit",
    "FrameStack",
    "ActionRepeat",
    "ExplorationBonus",
    "CurriculumStage",
    "Curriculum",
    "SafetyConstraint",
    "TrainingBudget",
    "PatchPart",
    "Patch",
    "REWARD_SHAPING_SIGNATURE",
]

#: The one function a reward-shaping patch must define.
REWARD_SHAPING_SIGNATURE = "shaped_reward(obs, action, reward, next_obs, terminated, truncated, info) -> float"


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def summary(self) -> str:  # pragma: no cover - overridden
        return self.kind  # type: ignore[attr-defined]


class RewardShaping(_Part):
    """Replace the env reward with ``shaped_reward(...)`` from sandboxed ``code``."""

    kind: Literal["reward_shaping"] = "reward_shaping"
    description: str = ""
    code: str

    def summary(self) -> str:
        return f"reward shaping: {self.description or 'custom code'}"


class ActionSmoothness(_Part):
    """Penalty ``coef * ||a_t - a_{t-1}||^2`` on the change between consecutive actions."""

    kind: Literal["action_smoothness"] = "action_smoothness"
    coef: float = Field(0.1, gt=0)

    def summary(self) -> str:
        return f"action smoothness penalty {self.coef:g}"


class ActionMagnitude(_Part):
    """Penalty ``coef * ||a_t||^2`` on action magnitude (effort/fuel)."""

    kind: Literal["action_magnitude"] = "action_magnitude"
    coef: float = Field(0.05, gt=0)

    def summary(self) -> str:
        return f"action magnitude penalty {self.coef:g}"


class Hyperparameters(_Part):
    """New values for algorithm constructor arguments (validated against the algorithm)."""

    kind: Literal["hyperparameters"] = "hyperparameters"
    changes: dict[str, Any]

    def summary(self) -> str:
        return "hyperparameters " + ", ".join(f"{k}={v}" for k, v in sorted(self.changes.items()))


class Normalization(_Part):
    """Running normalization of observations and/or rewards (SB3 ``VecNormalize``)."""

    kind: Literal["normalization"] = "normalization"
    obs: bool = True
    reward: bool = False

    def summary(self) -> str:
        what = [n for n, on in (("obs", self.obs), ("reward", self.reward)) if on]
        return "normalize " + "+".join(what or ["nothing"])


class TimeLimit(_Part):
    """Set the episode time limit (``max_episode_steps``)."""

    kind: Literal["time_limit"] = "time_limit"
    max_episode_steps: int = Field(gt=0)

    def summary(self) -> str:
        return f"time limit {self.max_episode_steps}"


class FrameStack(_Part):
    """Stack the last ``n`` observations (changes the observation space)."""

    kind: Literal["frame_stack"] = "frame_stack"
    n: int = Field(4, ge=2, le=16)

    def summary(self) -> str:
        return f"frame stack {self.n}"


class ActionRepeat(_Part):
    """Repeat each chosen action ``n`` env steps (summing rewards)."""

    kind: Literal["action_repeat"] = "action_repeat"
    n: int = Field(2, ge=2, le=16)

    def summary(self) -> str:
        return f"action repeat {self.n}"


class ExplorationBonus(_Part):
    """More exploration: an entropy coefficient and/or a count-based novelty bonus."""

    kind: Literal["exploration_bonus"] = "exploration_bonus"
    ent_coef: float | None = Field(default=None, ge=0)
    count_bonus: float = Field(default=0.0, ge=0)

    def summary(self) -> str:
        bits = []
        if self.ent_coef is not None:
            bits.append(f"ent_coef={self.ent_coef:g}")
        if self.count_bonus:
            bits.append(f"count bonus {self.count_bonus:g}")
        return "exploration " + (", ".join(bits) or "bonus")


class CurriculumStage(BaseModel):
    """One stage: env kwargs used for a fraction of the fine-tuning budget."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    fraction: float = Field(gt=0, le=1)


class Curriculum(_Part):
    """Easy-to-hard stages over env kwargs; fractions sum to 1."""

    kind: Literal["curriculum"] = "curriculum"
    stages: list[CurriculumStage] = Field(min_length=1)

    def summary(self) -> str:
        return f"curriculum of {len(self.stages)} stages"


class SafetyConstraint(_Part):
    """A predicate over ``(obs, action, info)`` (sandboxed expression) that is penalized or terminates."""

    kind: Literal["safety_constraint"] = "safety_constraint"
    description: str = ""
    predicate: str
    mode: Literal["penalty", "terminate"] = "penalty"
    penalty: float = Field(1.0, ge=0)

    def summary(self) -> str:
        return f"safety constraint ({self.mode}): {self.description or self.predicate}"


class TrainingBudget(_Part):
    """Extra training steps; the one patch whose control is the unpatched checkpoint."""

    kind: Literal["training_budget"] = "training_budget"
    extra_steps: int = Field(gt=0)

    def summary(self) -> str:
        return f"+{self.extra_steps:,} training steps"


PatchPart = Annotated[
    RewardShaping
    | ActionSmoothness
    | ActionMagnitude
    | Hyperparameters
    | Normalization
    | TimeLimit
    | FrameStack
    | ActionRepeat
    | ExplorationBonus
    | Curriculum
    | SafetyConstraint
    | TrainingBudget,
    Field(discriminator="kind"),
]


class Patch(BaseModel):
    """An ordered composition of patch parts, with a one-line human description."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    parts: list[PatchPart] = Field(min_length=1)
    description: str = ""

    @property
    def kinds(self) -> list[str]:
        """The ``kind`` of each part, in order."""
        return [p.kind for p in self.parts]

    @property
    def budget_only(self) -> bool:
        """Whether the patch only adds training steps (its comparison is more training vs none)."""
        return set(self.kinds) == {"training_budget"}

    def summary(self) -> str:
        """One line for tables: the description, or the parts' summaries joined."""
        return self.description or "; ".join(p.summary() for p in self.parts)

    @classmethod
    def from_data(cls, data: Any) -> Patch:
        """Accept either ``{"parts": [...]}`` or a single part (``{"kind": ...}``)."""
        if isinstance(data, dict) and "parts" not in data and "kind" in data:
            part = dict(data)
            keeps_description = part["kind"] in ("reward_shaping", "safety_constraint")
            desc = part.get("description", "") if keeps_description else part.pop("description", "")
            return cls.model_validate({"parts": [part], "description": desc})
        return cls.model_validate(data)
