"""Task-success definitions: what "the agent did the job" means, declaratively.

A run directory and a fault scenario each name one. Verification always judges
arms by this definition and the original return, never by a patched reward.
"""

from __future__ import annotations

import operator
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

__all__ = [
    "EpisodeOutcome",
    "ReturnThreshold",
    "InfoFlag",
    "FinalReward",
    "FinalObs",
    "Terminated",
    "SuccessSpec",
    "parse_success",
    "is_success",
    "success_margin",
]

_OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt, "==": operator.eq}


class EpisodeOutcome(BaseModel):
    """What a success test may look at: the end of one episode under the ORIGINAL reward."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    ret: float
    length: int
    terminated: bool
    truncated: bool
    final_reward: float
    final_obs: list[float]
    final_info: dict = Field(default_factory=dict)


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def describe(self) -> str:  # pragma: no cover - overridden
        raise NotImplementedError


class ReturnThreshold(_Spec):
    """Success when the original episode return reaches ``threshold``."""

    kind: Literal["return_threshold"] = "return_threshold"
    threshold: float

    def test(self, o: EpisodeOutcome) -> bool:
        return o.ret >= self.threshold

    def describe(self) -> str:
        return f"return >= {self.threshold:g}"


class InfoFlag(_Spec):
    """Success when ``info[key]`` is truthy at the episode's last step (e.g. ``is_success``)."""

    kind: Literal["info_flag"] = "info_flag"
    key: str = "is_success"

    def test(self, o: EpisodeOutcome) -> bool:
        return bool(o.final_info.get(self.key, False))

    def describe(self) -> str:
        return f"info['{self.key}'] at the end"


class FinalReward(_Spec):
    """Success when the last step's original reward compares to ``value`` (LunarLander's +100 landing)."""

    kind: Literal["final_reward"] = "final_reward"
    op: Literal[">=", ">", "<=", "<", "=="] = ">="
    value: float
    require_terminated: bool = True

    def test(self, o: EpisodeOutcome) -> bool:
        if self.require_terminated and not o.terminated:
            return False
        return bool(_OPS[self.op](o.final_reward, self.value))

    def describe(self) -> str:
        return f"last reward {self.op} {self.value:g}"


class FinalObs(_Spec):
    """Success when ``final_obs[index]`` compares to ``value`` (MountainCar position >= 0.45)."""

    kind: Literal["final_obs"] = "final_obs"
    index: int = Field(ge=0)
    op: Literal[">=", ">", "<=", "<", "=="] = ">="
    value: float

    def test(self, o: EpisodeOutcome) -> bool:
        if self.index >= len(o.final_obs):
            return False
        return bool(_OPS[self.op](o.final_obs[self.index], self.value))

    def describe(self) -> str:
        return f"obs[{self.index}] {self.op} {self.value:g} at the end"


class Terminated(_Spec):
    """Success when the episode terminated (reached a goal state) rather than hit the time limit.

    With ``survive=True`` the opposite: success is lasting until the time limit (CartPole).
    """

    kind: Literal["terminated"] = "terminated"
    survive: bool = False

    def test(self, o: EpisodeOutcome) -> bool:
        return (o.truncated and not o.terminated) if self.survive else (o.terminated and not o.truncated)

    def describe(self) -> str:
        return "survives to the time limit" if self.survive else "reaches a terminal goal state"


SuccessSpec = Annotated[
    ReturnThreshold | InfoFlag | FinalReward | FinalObs | Terminated,
    Field(discriminator="kind"),
]

_ADAPTER: TypeAdapter = TypeAdapter(SuccessSpec)


def parse_success(data: object) -> SuccessSpec:
    """Validate a success definition from a dict (YAML/JSON)."""
    return _ADAPTER.validate_python(data)


def _oriented(op: str, q: float, value: float) -> float:
    """``q`` compared to ``value`` as a signed distance, larger = closer to (or further past) success."""
    if op in (">=", ">"):
        return q - value
    if op in ("<=", "<"):
        return value - q
    return -abs(q - value)


def success_margin(spec: SuccessSpec, outcome: EpisodeOutcome) -> float:
    """The success definition's own quantity, oriented so larger is better; NaN when it has none beyond pass/fail.

    A failing episode still has one: how far the final observation or final
    reward was from the threshold, how far the return fell short, how long a
    survival task lasted. The trajectory preference check orders failing
    agents' episodes by it.
    """
    if isinstance(spec, ReturnThreshold):
        return float(outcome.ret - spec.threshold)
    if isinstance(spec, FinalReward):
        return _oriented(spec.op, float(outcome.final_reward), spec.value)
    if isinstance(spec, FinalObs) and spec.index < len(outcome.final_obs):
        return _oriented(spec.op, float(outcome.final_obs[spec.index]), spec.value)
    if isinstance(spec, Terminated) and spec.survive:
        return float(outcome.length)
    return float("nan")


def is_success(spec: SuccessSpec, outcome: EpisodeOutcome) -> bool:
    """Apply a success definition to one episode's outcome."""
    if not np.isfinite(outcome.ret):
        return False
    return bool(spec.test(outcome))
