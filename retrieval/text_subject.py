"""What a description says about the subject and the signature: user tags, env, algorithm, action space.

:func:`text_subject` builds the subject from what the user said (env id, algorithm, action space);
unknowns stay unknown (:data:`~remedy.retrieval.diagnosis.UNSPECIFIED`) and are noted.
:func:`text_signature` is a signature with no measured features: the tags read and the text itself
as the summary (which is what retrieval embeds). :func:`parse_tags` checks tags a user gives.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from remedy.cases.algos import canonical_algo
from remedy.cases.errors import RemedyError, ValidationError
from remedy.cases.model import ActionSpaceType, EnvTraits, RewardDensity, Signature, Subject
from remedy.cases.vocab import SYMPTOMS

from .diagnosis import UNSPECIFIED

__all__ = ["parse_tags", "text_subject", "algo_fixes_action_space", "text_signature"]


def parse_tags(tags: str | Sequence[str]) -> list[str]:
    """User-given tags ("hovering,timeouts" or a list), checked against the vocabulary."""
    items = tags.split(",") if isinstance(tags, str) else list(tags)
    out = []
    for raw in items:
        tag = raw.strip().lower().replace("-", "_").replace(" ", "_")
        if not tag:
            continue
        if tag not in SYMPTOMS:
            close = difflib.get_close_matches(tag, list(SYMPTOMS), n=1, cutoff=0.5)
            hint = f"did you mean '{close[0]}'?" if close else f"choose from {', '.join(SYMPTOMS)}"
            raise ValidationError(f"unknown symptom tag '{raw.strip()}'; {hint}")
        if tag not in out:
            out.append(tag)
    return out


def _space(action_space: str | None) -> ActionSpaceType | None:
    if action_space is None:
        return None
    try:
        return ActionSpaceType(str(action_space).strip().lower())
    except ValueError:
        raise ValidationError(f"unknown action space '{action_space}'; use discrete or continuous") from None


#: algorithms that only take one kind of action space, so naming them says which one it is.
_DISCRETE_ONLY = {"DQN", "QRDQN"}
_CONTINUOUS_ONLY = {"SAC", "TD3", "DDPG", "TQC", "CrossQ"}


def algo_fixes_action_space(algo: str | None) -> bool:
    """Whether the (canonical) algorithm takes only one kind of action space (DQN: discrete; SAC: continuous)."""
    return algo in _DISCRETE_ONLY | _CONTINUOUS_ONLY


def _env_traits(env_id: str, notes: list[str]) -> EnvTraits | None:
    """The registered env's traits, or None (a custom env Remedy cannot make) with a note."""
    from remedy.cases.evidence.envs import env_traits, suggest_env_id  # gymnasium: only when an env id is read

    try:
        return env_traits(env_id)
    except RemedyError as ex:
        hint = suggest_env_id(env_id)
        if hint and hint != env_id:
            notes.append(
                f"env '{env_id}' is not registered in Gymnasium (did you mean '{hint}'?); "
                "its traits come from --action-space and the algorithm"
            )
        else:
            notes.append(
                f"env '{env_id}' could not be made ({str(ex)[:120]}); its traits come from --action-space "
                "and the algorithm"
            )
        return None


def text_subject(
    env_id: str | None = None, algo: str | None = None, action_space: str | None = None, tags: Sequence[str] = ()
) -> tuple[Subject, list[str]]:
    """The subject a description talks about, and notes on what had to be assumed.

    The action space comes from ``action_space``, else the registered env, else an
    algorithm that takes only one kind, else a tag only continuous actions have; failing
    all, continuous is assumed (it rules no patch kind out) and said so.
    """
    notes: list[str] = []
    space = _space(action_space)
    canon = None
    if algo:
        try:
            canon = canonical_algo(algo)
        except RemedyError as ex:
            notes.append(f"{ex}; kept as written, so patches are checked against the env only")
    traits = _env_traits(env_id, notes) if env_id else None
    if space is None and traits is not None:
        space = traits.action_space
    if space is None and canon in _DISCRETE_ONLY | _CONTINUOUS_ONLY:
        space = ActionSpaceType.discrete if canon in _DISCRETE_ONLY else ActionSpaceType.continuous
    if space is None and {"jerky_actions", "saturated_actions"} & set(tags):
        space = ActionSpaceType.continuous
    if space is None:
        space = ActionSpaceType.continuous
        notes.append(
            "action space not given: assumed continuous so that no patch kind is ruled out; "
            "pass --action-space discrete|continuous"
        )
    if traits is None or traits.action_space != space:
        traits = EnvTraits(
            action_space=space,
            obs_dim=traits.obs_dim if traits else 0,
            action_dim=traits.action_dim if traits else 0,
            reward_density=traits.reward_density if traits else RewardDensity.dense,
        )
    subject = Subject(env_id=env_id or UNSPECIFIED, algo=canon or algo or UNSPECIFIED, traits=traits)
    return subject, notes


def text_signature(text: str, tags: Sequence[str]) -> Signature:
    """A signature read from words: no measured features, the tags read, the text as the summary."""
    summary = " ".join((text or "").split())
    if not summary:
        raise ValidationError(
            "the description is empty; describe what the agent does, e.g. "
            "'the lander hovers above the pad and never lands'"
        )
    return Signature(features={}, symptoms=list(tags), summary=summary)
