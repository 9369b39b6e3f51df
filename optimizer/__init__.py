"""Tuning the diagnoser against verified outcomes: datasets from the KB, the metric, and the tuning jobs."""

from .dataset import Example, Tried, build_examples, dev_answer_keys, example_group, split_examples
from .job import OptimizeOptions, OptimizeResult, run_optimize
from .metric import Score, score_prediction
from .offline import OfflineTuning, evaluate, prepare, tune_offline
from .versions import ProgramStore, ProgramVersion, active_offline, promotion_decision

__all__ = [
    "Example",
    "Tried",
    "build_examples",
    "dev_answer_keys",
    "example_group",
    "split_examples",
    "Score",
    "score_prediction",
    "OfflineTuning",
    "prepare",
    "evaluate",
    "tune_offline",
    "ProgramStore",
    "ProgramVersion",
    "active_offline",
    "promotion_decision",
    "OptimizeOptions",
    "OptimizeResult",
    "run_optimize",
]
