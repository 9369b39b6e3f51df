"""Tuning the diagnoser against verified outcomes: datasets from the KB, the metric, and the tuning jobs."""

from .dataset import Example, Tried, build_examples, example_group, split_examples
from .metric import Score, score_prediction

__all__ = ["Example", "Tried", "build_examples", "example_group", "split_examples", "Score", "score_prediction"]
