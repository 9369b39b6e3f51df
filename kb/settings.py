"""One settings type per verb: what `remedy verify` and `remedy fix` take, locally or through the service.

The CLI builds these from its options; the service's request models
(:class:`~remedy.kb.server.models.VerifyJobIn`, :class:`~remedy.kb.server.models.FixJobIn`)
are these plus what names the uploaded run; the library functions
(:func:`remedy.kb.verify.verify`, :func:`remedy.kb.fixloop.fix`) are called with what
they hold. One definition with one set of defaults and limits, so the two
transports cannot drift apart again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, TypeVar

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from remedy.cases.errors import ValidationError

if TYPE_CHECKING:
    from remedy.cases.verify.racing import RaceSettings
    from remedy.cases.verify.verification import VerifyConfig

__all__ = ["VerifySettings", "FixSettings", "ExecutorName", "DiagnoserName", "settings_from"]

ExecutorName = Literal["local", "ray"]
#: the built-in diagnosers (``remedy.retrieval.diagnosis.diagnoser_names``; a test keeps the two equal)
DiagnoserName = Literal["offline", "llm", "auto"]


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)  # a misspelt option is an error, not a silent default

    seeds: int = Field(3, ge=1, le=20, description="Training seeds per arm of a screen.")
    #: the default is ``remedy.cases.verify.verification.CONFIRM_SEEDS``
    confirm_seeds: int = Field(8, ge=2, le=40, description="Training seeds per arm of a confirmation (fresh seeds).")
    screen_confidence: float = Field(
        0.8, ge=0.5, le=0.99, description="Two-sided level at which a screen passes and earns a confirmation."
    )
    budget: int | None = Field(
        None, ge=1, le=50_000_000, description="Fine-tuning env steps per arm (default: 20% of train_steps)."
    )
    executor: ExecutorName = Field("local", description="Where verification jobs run: local or ray.")

    @classmethod
    def default(cls, name: str) -> Any:
        """The default of field ``name``: what the CLI's option defaults to, so the two cannot differ."""
        return cls.model_fields[name].default

    def verify_config(self, control_cache: str | None = None, **more: Any) -> VerifyConfig:
        """The library's verification config for these settings (``more``: fields only one verb sets)."""
        from remedy.cases.verify.verification import VerifyConfig

        config = VerifyConfig(
            seeds=self.seeds,
            confirm_seeds=self.confirm_seeds,
            screen_confidence=self.screen_confidence,
            budget_steps=self.budget,
            executor=self.executor,
            control_cache=control_cache,
            **more,
        )
        config.check()
        return config


class VerifySettings(_Settings):
    """`remedy verify`: screen a patch and, when the screen clears, confirm it on fresh seeds."""

    episodes: int = Field(20, ge=1, le=500, description="Evaluation episodes per agent.")
    n_envs: int = Field(8, ge=1, le=64, description="Parallel envs of an on-policy fine-tune.")
    seed_base: int = Field(
        0, ge=0, le=1_000_000, description="First training seed; a confirmation uses the next block."
    )
    confirm: bool = Field(True, description="Confirm a screen that clears (False: screen only, `--no-confirm`).")
    force: bool = Field(False, description="Train even if the trajectory preference check fails.")

    def config(self, control_cache: str | None = None) -> VerifyConfig:
        """The library's verification config."""
        return self.verify_config(
            control_cache, eval_episodes=self.episodes, n_envs=self.n_envs, seed_base=self.seed_base, force=self.force
        )


class FixSettings(_Settings):
    """`remedy fix`: diagnose, verify the top candidates (raced), confirm, store, repeat."""

    rounds: int = Field(3, ge=1, le=20, description="Diagnose-verify rounds at most.")
    candidates: int = Field(2, ge=1, le=10, description="Candidates verified per round.")
    diagnoser: DiagnoserName = "offline"
    exhaustive: bool = Field(False, description="Verify every round's candidates even after a fix.")
    #: the default is ``remedy.kb.fixloop.CONFIRMATIONS``
    confirmations: int = Field(2, ge=1, le=10, description="Confirmations on fresh seeds the loop may run.")
    out: str | None = Field(None, max_length=500, description="Where the winning patch and the fixed agent go.")
    race: bool = Field(True, description="Race each round's candidates (stage 1 on a share of the budget).")
    race_fraction: float = Field(1 / 3, gt=0, lt=1, description="Share of the budget stage 1 of a race spends.")
    race_seeds: int = Field(2, ge=2, le=20, description="Training seeds per arm at stage 1 of a race.")

    def config(self, control_cache: str | None = None) -> VerifyConfig:
        """The library's verification config (the loop shares controls under the KB unless given a cache)."""
        return self.verify_config(control_cache)

    def race_settings(self) -> RaceSettings:
        """The race of each round."""
        from remedy.cases.verify.racing import RaceSettings

        race = RaceSettings(enabled=self.race, fraction=self.race_fraction, seeds=self.race_seeds)
        race.check()
        return race

    def loop_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`remedy.kb.fixloop.fix` these settings fix (not the KB, run, or output)."""
        return {
            "config": self.config(),
            "rounds": self.rounds,
            "candidates": self.candidates,
            "exhaustive": self.exhaustive,
            "confirmations": self.confirmations,
            "race": self.race_settings(),
        }


S = TypeVar("S", bound=BaseModel)


def settings_from(cls: type[S], **values: Any) -> S:
    """``cls(**values)``, with a bad value as one :class:`ValidationError` line (the CLI's options)."""
    try:
        return cls(**values)
    except pydantic.ValidationError as err:
        first = err.errors()[0]
        field = str(first["loc"][0]) if first.get("loc") else ""
        flag = f"--{field.replace('_', '-')}" if field else "an option"
        msg = str(first.get("msg", "invalid value")).removeprefix("Input ").removeprefix("Value error, ")
        raise ValidationError(f"{flag}: got {first.get('input')!r}: {msg}; see --help for the limits") from None
