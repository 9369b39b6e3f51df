"""Typed, composable patches (spec) and how they are applied to envs and algorithms."""

from .spec import (
    REWARD_SHAPING_SIGNATURE,
    ActionMagnitude,
    ActionRepeat,
    ActionSmoothness,
    Curriculum,
    CurriculumStage,
    ExplorationBonus,
    FrameStack,
    Hyperparameters,
    Normalization,
    Patch,
    PatchPart,
    RewardShaping,
    SafetyConstraint,
    TimeLimit,
    TrainingBudget,
)

__all__ = [
    "REWARD_SHAPING_SIGNATURE",
    "ActionMagnitude",
    "ActionRepeat",
    "ActionSmoothness",
    "Curriculum",
    "CurriculumStage",
    "ExplorationBonus",
    "FrameStack",
    "Hyperparameters",
    "Normalization",
    "Patch",
    "PatchPart",
    "RewardShaping",
    "SafetyConstraint",
    "TimeLimit",
    "TrainingBudget",
]
