"""The root-cause registry: everything Remedy knows about one root cause, in one entry.

The causes themselves are the members of :class:`~remedy.cases.model.RootCause` (a case stores
them; never rename one). A :class:`CauseEntry` gives each its one-line description, the remedy
families that address it, the phrasings that state it outright in a description, and the hook the
prior rulebooks use when a description states it (``stated_families``). Every other module reads
these through the views below (:data:`CAUSE_TEXT`, :data:`FAMILY_CAUSES`, :data:`CAUSE_PHRASES`,
:data:`STATED_FAMILIES`); the prior rules that suggest a cause from a signature or a description
name it in :data:`remedy.retrieval.priors.PRIORS` and :data:`remedy.retrieval.text_priors.TEXT_PRIORS`.

Adding a cause means a ``RootCause`` member, one entry here and at least one prior rule that
proposes it (a cold KB must be able to name it); ``tests/retrieval/test_taxonomy.py`` checks the
entries, the enum, the priors, the bench scenarios and the labelled reports agree.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from remedy.cases.errors import ValidationError
from remedy.cases.model import RemedyFamily, RootCause

__all__ = [
    "CauseEntry",
    "TAXONOMY",
    "DIAGNOSABLE",
    "cause_entry",
    "CAUSE_TEXT",
    "FAMILY_CAUSES",
    "CAUSE_PHRASES",
    "STATED_FAMILIES",
]

_C, _F = RootCause, RemedyFamily


@dataclass(frozen=True)
class CauseEntry:
    """One root cause.

    ``description`` is one line from the taxonomy's meaning (never from the bench reports; the cause
    ranker compares a description's text with it); ``families`` are the remedy families that address
    the cause (RL practice, as in the prior rulebook's templates); ``phrases`` state the cause outright
    in a description (only causes no symptom tag carries: a behaviour that is odd rather than failed,
    and settings a user reports; from the taxonomy's meaning and SB3 "Tips and Tricks"), and
    ``stated_families`` are the families the offline vote tries first when a description states it,
    most direct first.
    """

    cause: RootCause
    description: str
    families: tuple[RemedyFamily, ...]
    phrases: tuple[str, ...] = ()
    stated_families: tuple[RemedyFamily, ...] = ()

    @property
    def diagnosable(self) -> bool:
        """Whether a diagnosis can name this cause (``unknown`` is the absence of one)."""
        return self.cause is not RootCause.unknown


_ENTRIES = (
    CauseEntry(
        _C.reward_misspecification,
        "the reward function rewards the wrong behaviour, so the agent learns something unintended",
        (_F.reward_shaping,),
        phrases=(
            "the learned behaviour looks unnatural",
            "the robot moves in a strange way that was not intended",
            "the robot walks with a weird gait",
            "the humanoid ends up in an odd pose",
            "the agent solves the task in an unintended way",
        ),
        stated_families=(_F.reward_shaping,),
    ),
    CauseEntry(
        _C.sparse_reward,
        "the reward is rarely received, so the agent gets almost no learning signal",
        (_F.reward_shaping, _F.exploration_bonus, _F.curriculum),
    ),
    CauseEntry(
        _C.reward_hacking,
        "the agent exploits a loophole in the reward and scores high without doing the task",
        (_F.reward_shaping, _F.action_magnitude),
    ),
    CauseEntry(
        _C.insufficient_exploration,
        "the agent does not explore enough to discover the rewarding behaviour",
        (_F.action_repeat, _F.exploration_bonus),
        phrases=("the exploration noise is too small", "epsilon decays too quickly"),
        stated_families=(_F.exploration_bonus, _F.hyperparameters),
    ),
    CauseEntry(
        _C.premature_convergence,
        "the policy became deterministic too early and got stuck in a poor local optimum",
        (_F.hyperparameters, _F.exploration_bonus),
    ),
    CauseEntry(
        _C.undertraining,
        "the agent has not been trained for long enough and would improve with more training",
        (_F.training_budget,),
        phrases=("it was trained for only a few thousand steps", "the training budget is too small"),
        stated_families=(_F.training_budget,),
    ),
    CauseEntry(
        _C.unstable_optimization,
        "training is unstable because of hyperparameters such as a too high learning rate",
        (_F.hyperparameters, _F.normalization),
        phrases=("the learning rate is too high", "the value loss is huge", "the gradients explode"),
        stated_families=(_F.hyperparameters, _F.normalization),
    ),
    CauseEntry(
        _C.observation_scaling,
        "the observations are badly scaled or not normalized for the network",
        (_F.normalization, _F.frame_stack),
    ),
    CauseEntry(
        _C.action_jitter,
        "the actions oscillate and chatter from one step to the next",
        (_F.action_smoothness, _F.action_magnitude, _F.action_repeat),
    ),
    CauseEntry(
        _C.safety_violation,
        "the agent violates safety constraints or keeps a constraint cost too high",
        (_F.safety_constraint,),
    ),
    CauseEntry(
        _C.time_limit_misconfiguration,
        "the episode time limit is too short or handled wrongly at truncation",
        (_F.time_limit,),
    ),
    CauseEntry(
        _C.generalization_gap,
        "the policy works in training conditions but fails in new or different conditions",
        (_F.curriculum,),
    ),
    # not a diagnosis: what a backend says when the evidence points to no cause above; no family fixes it
    CauseEntry(_C.unknown, "the evidence points to none of the known root causes", ()),
)

#: root cause -> its entry, in the order of ``RootCause``.
TAXONOMY: dict[RootCause, CauseEntry] = {e.cause: e for e in sorted(_ENTRIES, key=lambda e: list(_C).index(e.cause))}

#: every root cause a diagnosis can name (``unknown`` is not a diagnosis), as names, in taxonomy order.
DIAGNOSABLE: tuple[str, ...] = tuple(c.value for c, e in TAXONOMY.items() if e.diagnosable)


def cause_entry(name: str | RootCause) -> CauseEntry:
    """The entry of root cause ``name``; an unknown name is refused with the closest known one."""
    try:
        return TAXONOMY[RootCause(name)]
    except ValueError:
        close = difflib.get_close_matches(str(name), [c.value for c in RootCause], n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"known causes: {', '.join(c.value for c in RootCause)}"
        raise ValidationError(f"unknown root cause '{name}'; {hint}") from None


# -- views other modules read ---------------------------------------------------------------------

#: cause name -> its one-line description (diagnosable causes only).
CAUSE_TEXT: dict[str, str] = {c.value: e.description for c, e in TAXONOMY.items() if e.diagnosable}

#: remedy family name -> the cause names it addresses, for every family.
FAMILY_CAUSES: dict[str, tuple[str, ...]] = {
    f.value: tuple(c.value for c, e in TAXONOMY.items() if f in e.families) for f in RemedyFamily
}

#: root cause -> phrasings of a fact that names it outright (causes that have some).
CAUSE_PHRASES: dict[RootCause, tuple[str, ...]] = {c: e.phrases for c, e in TAXONOMY.items() if e.phrases}

#: root cause stated outright -> the remedy families RL practice tries first for it, most direct first.
STATED_FAMILIES: dict[RootCause, tuple[RemedyFamily, ...]] = {
    c: e.stated_families for c, e in TAXONOMY.items() if e.stated_families
}
