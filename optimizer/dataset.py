"""Examples from the KB: what the diagnoser saw, and what verification later said worked.

An *example* is one attempt group: the cases one fix loop (or one ``remedy verify`` screen
and its confirmation) produced for one failing agent, linked by ``parent_id`` and
``verification.confirms``. Its input is the first round's subject and signature; its labels
are the root causes and patch families of the attempts that were verified ``improved``.

Counting rules (docs/optimizing.md):

- each attempt is a screen plus, when it cleared, the confirmation on fresh seeds; it is
  counted once, at its final verdict (the confirmation's status when there is one);
- only a confirmation can make an attempt ``improved``; a screen that says ``improved`` with
  no confirmation (cases stored before confirmations existed) counts as ``inconclusive``;
- bundled example cases and cases without a verification are not evidence and are skipped;
- a candidate a race stopped early (``stopped_early``: a share of the budget on few seeds) stays
  in its group (it links the loop's cases) and in ``tried`` with that status, but it is no
  verdict: not a family verified not to help (:data:`~remedy.optimizer.metric.FAILED_STATUSES`).

The cause an attempt stands for is the highest-ranked cause of the diagnosis that proposed it
among the causes its patch family addresses in the prior rulebook (a time-limit patch that
worked speaks for ``time_limit_misconfiguration`` even when the diagnosis ranked something else
first); the diagnosis's top cause when none of them is addressed.

A group that is a **dev** fault scenario may also carry ``truth``: the scenario's answer key (its
injected fault's root causes). Dev scenarios are the ones priors, weights and prompts may be
tuned on (docs/scenarios.md); the caller passes their keys (:func:`dev_answer_keys`) and a holdout
scenario's key never enters an example. The metric uses it only where verification confirmed
nothing (most bench groups), so a verified outcome always outranks the key.

Examples are split by *group*: the fault scenario, else the user run (checkpoint hash, else a
hash of env, algorithm, hyperparameters and training steps), so the cases of one scenario or one
run never sit on both sides of a train/validation split.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache

from remedy.cases.errors import OptimizeError
from remedy.cases.model import Case, RemedyFamily, RootCause, Signature, Source, Stage, Status, Subject
from remedy.cases.outcomes import final_verdicts
from remedy.retrieval.diagnosis import patch_family
from remedy.retrieval.priors import PRIORS

__all__ = [
    "Tried",
    "Example",
    "build_examples",
    "split_examples",
    "example_group",
    "family_causes",
    "dev_answer_keys",
]


@dataclass(frozen=True)
class Tried:
    """One measured attempt of a group, at its final verdict."""

    family: RemedyFamily
    cause: RootCause | None  # the cause the attempt stands for (see the module docstring)
    status: str  # a Status value: improved only from a confirmation
    effect: float | None  # treatment - control on the task metric (the final verdict's case)
    metric: str | None  # the task metric the effect is measured on
    case_id: str  # the case that carries the final verdict
    patch: str = ""  # the patch, summarized
    #: the confirmation also made the agent work (``verification.fixed``); False when never judged
    fixed: bool = False

    def text(self) -> str:
        """``reward_shaping (for reward_misspecification): improved, +120 return_iqm`` (``improved, fixed`` when the
        agent now works)."""
        why = f" (for {self.cause.value})" if self.cause else ""
        eff = "" if self.effect is None else f", {self.effect:+.3g} {self.metric or ''}".rstrip()
        return f"{self.family.value}{why}: {self.status}{', fixed' if self.fixed else ''}{eff}"


@dataclass(frozen=True)
class Example:
    """One attempt group as a training example for the diagnoser."""

    key: str  # stable id: the first case id of the attempt group
    group: str  # the split unit: the scenario name, else the user run
    subject: Subject
    signature: Signature  # what the diagnoser saw (the first round's signature)
    causes: tuple[RootCause, ...]  # labels: causes of the attempts verified improved (empty: none improved)
    families: tuple[RemedyFamily, ...]  # labels: families of the attempts verified improved
    tried: tuple[Tried, ...]  # every measured attempt of the group
    case_ids: tuple[str, ...]
    #: a dev fault scenario's answer key (its injected fault's causes); empty for user runs and holdout scenarios
    truth: tuple[RootCause, ...] = ()

    @property
    def solved(self) -> bool:
        """True when some attempt of the group was confirmed ``improved``."""
        return bool(self.families)

    @property
    def n_improved(self) -> int:
        """Attempts of the group confirmed ``improved`` (the labels come from these)."""
        return sum(t.status == Status.improved.value for t in self.tried)

    @property
    def n_fixed(self) -> int:
        """... of which the agent now works (``verification.fixed``)."""
        return sum(t.fixed for t in self.tried)


def example_group(case: Case) -> str:
    """The split unit of a case: ``scenario:<name>``, else ``run:<checkpoint sha or config hash>``."""
    if case.scenario:
        return f"scenario:{case.scenario}"
    s = case.subject
    if s.checkpoint_sha256:
        return f"run:{s.checkpoint_sha256[:16]}"
    blob = json.dumps([s.env_id, s.env_kwargs, s.algo, s.hyperparams, s.train_steps], sort_keys=True, default=str)
    return "run:" + hashlib.sha256(blob.encode()).hexdigest()[:16]


@cache
def family_causes() -> dict[RemedyFamily, frozenset[RootCause]]:
    """Which root causes each patch family addresses, read off the prior rulebook's templates."""
    out: dict[RemedyFamily, set[RootCause]] = defaultdict(set)
    for rule in PRIORS:
        for tmpl in rule.templates:
            out[tmpl.family].update(cause for cause, _ in rule.causes)
    return {f: frozenset(cs) for f, cs in out.items()}


def build_examples(
    cases: Iterable[Case], *, answer_keys: Mapping[str, Sequence[RootCause]] | None = None
) -> list[Example]:
    """One :class:`Example` per attempt group of the measured cases, sorted by group then key.

    Cases without a verification and bundled example cases are skipped; see the module
    docstring for how attempts, verdicts and labels are counted. ``answer_keys`` (scenario name
    -> root causes; dev scenarios only, see :func:`dev_answer_keys`) fills ``truth``.
    """
    measured = {c.case_id: c for c in cases if c.verification is not None and c.source != Source.example}
    components = _components(measured)
    examples = [_example([measured[i] for i in ids], answer_keys or {}) for ids in components]
    return sorted(examples, key=lambda e: (e.group, e.key))


def dev_answer_keys(scenario_names: Iterable[str]) -> dict[str, tuple[RootCause, ...]]:
    """The answer keys (``ground_truth``) of the bundled **dev** scenarios among ``scenario_names``.

    Holdout scenarios are left out: they are reported, never tuned on.
    """
    from remedy.cases.verify.scenarios import bundled_scenarios  # YAML and templates: only when asked

    wanted = set(scenario_names)
    if not wanted:
        return {}
    return {s.name: tuple(s.ground_truth) for s in bundled_scenarios() if s.name in wanted and s.split == "dev"}


def split_examples(
    examples: Sequence[Example], *, val_fraction: float = 0.3, seed: int = 0
) -> tuple[list[Example], list[Example]]:
    """Split into (train, validation) by group, deterministically for a given ``seed``.

    Groups with a confirmed fix and groups without are shuffled apart and each cut at
    ``val_fraction`` (rounded, at least one group on each side when there are two or more), so
    both sides see solved and unsolved groups. No group is ever on both sides.
    """
    if not 0.0 < val_fraction < 1.0 or math.isnan(val_fraction):
        raise OptimizeError(f"--val-fraction must be between 0 and 1 (exclusive), got {val_fraction}")
    by_group: dict[str, list[Example]] = defaultdict(list)
    for ex in examples:
        by_group[ex.group].append(ex)
    if len(by_group) < 2:
        raise OptimizeError(
            f"{len(by_group)} example group(s) in the KB; a train/validation split needs at least 2 "
            "(verify more runs or scenarios first)"
        )
    rng = random.Random(seed)
    solved = sorted(g for g, exs in by_group.items() if any(e.solved for e in exs))
    unsolved = sorted(set(by_group) - set(solved))
    val_groups: set[str] = set()
    for stratum in (solved, unsolved):
        rng.shuffle(stratum)
        val_groups.update(stratum[: round(len(stratum) * val_fraction)])
    ordered = sorted(by_group)
    if not val_groups:
        val_groups.add(ordered[rng.randrange(len(ordered))])
    if len(val_groups) == len(ordered):
        val_groups.discard(sorted(val_groups)[rng.randrange(len(val_groups))])
    train = [e for g in ordered if g not in val_groups for e in by_group[g]]
    val = [e for g in ordered if g in val_groups for e in by_group[g]]
    return train, val


# ---- grouping ----------------------------------------------------------------------------------


def _components(cases: dict[str, Case]) -> list[list[str]]:
    """Case ids joined by ``parent_id`` and ``confirms`` links (union-find), each list sorted."""
    root = {i: i for i in cases}

    def find(i: str) -> str:
        while root[i] != i:
            root[i] = root[root[i]]
            i = root[i]
        return i

    for cid, case in cases.items():
        v = case.verification
        for other in (case.parent_id, v.confirms if v else None):
            if other in cases and example_group(cases[other]) == example_group(case):
                root[find(cid)] = find(other)
    comps: dict[str, list[str]] = defaultdict(list)
    for cid in sorted(cases):
        comps[find(cid)].append(cid)
    return list(comps.values())


def _order(case: Case) -> tuple:
    return (case.provenance.created_at, case.case_id)


def _example(cases: list[Case], answer_keys: Mapping[str, Sequence[RootCause]]) -> Example:
    cases = sorted(cases, key=_order)
    ids = {c.case_id for c in cases}
    first = next((c for c in cases if c.parent_id not in ids), cases[0])
    tried = _attempts(cases)
    good = [t for t in tried if t.status == Status.improved.value]
    good.sort(key=lambda t: -(t.effect if t.effect is not None else 0.0))
    return Example(
        key=first.case_id,
        group=example_group(first),
        subject=first.subject,
        signature=first.signature,
        causes=tuple(dict.fromkeys(t.cause for t in good if t.cause is not None)),
        families=tuple(dict.fromkeys(t.family for t in good)),
        tried=tuple(tried),
        case_ids=tuple(c.case_id for c in cases),
        truth=tuple(answer_keys.get(first.scenario, ())) if first.scenario else (),
    )


def _attempts(cases: list[Case]) -> list[Tried]:
    """Each screen with its confirmations folded in, at its final verdict, in the order tried."""
    return [_tried(screen, final) for screen, final in final_verdicts(cases) if screen.verification is not None]


def _tried(screen: Case, final: Case) -> Tried:
    v = final.verification
    assert v is not None  # only measured cases reach here
    status = v.status.value
    if v.status == Status.improved and v.stage != Stage.confirm:
        status = Status.inconclusive.value  # improved only from a confirmation on fresh seeds
    family = patch_family(screen.patch)
    return Tried(
        family=family,
        cause=_cause_of(screen, family),
        status=status,
        effect=v.effect.diff if v.effect is not None else None,
        metric=v.effect.metric if v.effect is not None else None,
        case_id=final.case_id,
        patch=screen.patch.summary()[:120],
        fixed=status == Status.improved.value and bool(v.fixed),
    )


def _cause_of(case: Case, family: RemedyFamily) -> RootCause | None:
    """The highest-ranked diagnosed cause the family addresses; else the diagnosis's top cause."""
    ranked = [c for c in case.root_causes if c != RootCause.unknown]
    addressed = family_causes().get(family, frozenset())
    return next((c for c in ranked if c in addressed), ranked[0] if ranked else None)
