"""Fixtures for the KB tests: the real embedder (loaded once), a fresh KB, and case builders."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from remedy.cases.model import (
    Case,
    Cause,
    Diagnosis,
    Effect,
    EnvTraits,
    LiteratureEffect,
    Signature,
    Subject,
    Verification,
)
from remedy.cases.patches import Patch
from remedy.kb import KnowledgeBase
from remedy.retrieval import default_embedder

#: a small, varied corpus: (case_id, env, action space, algo, summary, symptoms, root cause, patch, status, effect)
CORPUS = [
    (
        "c-lander-hover",
        "LunarLander-v3",
        "discrete",
        "PPO",
        "The lander hovers above the pad and never touches down; episodes run out the clock.",
        ["hovering", "timeouts"],
        "reward_misspecification",
        {"kind": "training_budget", "extra_steps": 50000},
        "improved",
        180.0,
    ),
    (
        "c-pendulum-jitter",
        "Pendulum-v1",
        "continuous",
        "SAC",
        "Torque chatters between the bounds every step; bang-bang control with jerky actions.",
        ["jerky_actions"],
        "action_jitter",
        {"kind": "action_smoothness", "coef": 0.1},
        "improved",
        95.5,
    ),
    (
        "c-mountaincar-stuck",
        "MountainCar-v0",
        "discrete",
        "DQN",
        "The car rocks at the bottom of the valley and never reaches the flag; sparse reward, no success.",
        ["never_succeeds"],
        "insufficient_exploration",
        {"kind": "exploration_bonus", "ent_coef": 0.01},
        "no_effect",
        None,
    ),
    (
        "c-cartpole-short",
        "CartPole-v1",
        "discrete",
        "PPO",
        "The pole falls after a few dozen steps; learning stopped improving early.",
        ["premature_convergence"],
        "undertraining",
        {"kind": "training_budget", "extra_steps": 20000},
        "worse",
        -12.0,
    ),
    (
        "c-walker-scale",
        "BipedalWalker-v3",
        "continuous",
        "PPO",
        "Observations span very different scales and the walker falls over immediately.",
        [],
        "observation_scaling",
        {"kind": "normalization", "obs": True},
        "literature",
        None,
    ),
]


def make_case(
    case_id: str = "c-test",
    env_id: str = "CartPole-v1",
    action_space: str = "discrete",
    algo: str = "PPO",
    summary: str = "The pole falls over quickly.",
    symptoms: list[str] | None = None,
    cause: str = "undertraining",
    patch: dict | None = None,
    status: str = "improved",
    effect: float | None = 10.0,
) -> Case:
    """A valid case; ``status`` 'literature' gives a cited example, 'unverified' none."""
    verification = literature = None
    if status == "literature":
        literature = LiteratureEffect(claim="normalizing observations helps", source="SB3 tips and tricks")
    elif status != "unverified":
        eff = (
            None
            if effect is None
            else Effect(
                metric="return_iqm", treatment=effect, control=0.0, diff=effect, ci_low=effect - 5, ci_high=effect + 5
            )
        )
        verification = Verification(status=status, effect=eff, seeds=2)
    return Case(
        case_id=case_id,
        source="bench" if verification else "example",
        subject=Subject(
            env_id=env_id,
            algo=algo,
            traits=EnvTraits(action_space=action_space, obs_dim=4, action_dim=2),
        ),
        signature=Signature(features={"return_iqm": 1.0}, symptoms=symptoms or [], summary=summary),
        diagnosis=Diagnosis(causes=[Cause(cause=cause, confidence=0.8, rationale="test")]),
        patch=Patch.from_data(patch or {"kind": "training_budget", "extra_steps": 1000}),
        verification=verification,
        literature=literature,
    )


def corpus_cases() -> list[Case]:
    """The five cases of :data:`CORPUS`."""
    return [
        make_case(cid, env, space, algo, summary, symptoms, cause, patch, status, effect)
        for cid, env, space, algo, summary, symptoms, cause, patch, status, effect in CORPUS
    ]


@pytest.fixture(scope="session")
def embedder():
    """The real bundled MiniLM, loaded once per test session."""
    return default_embedder()


@pytest.fixture
def case_factory() -> Callable[..., Case]:
    """Build valid cases: ``case_factory(case_id=..., env_id=..., summary=...)``."""
    return make_case


@pytest.fixture
def corpus() -> list[Case]:
    """Five varied cases (lander, pendulum, mountain car, cartpole, walker)."""
    return corpus_cases()


@pytest.fixture
def kb_path(tmp_path: Path) -> Path:
    """Where the fresh KB lives."""
    return tmp_path / "kb"


@pytest.fixture
def kb(kb_path: Path, embedder):
    """A fresh, empty KnowledgeBase in tmp_path, using the session's embedder."""
    with KnowledgeBase.open(kb_path, embedder=embedder) as kb:
        yield kb


@pytest.fixture(scope="module")
def filled_kb(tmp_path_factory, embedder):
    """A KB holding the corpus, shared by a module's read-only tests (do not write to it)."""
    with KnowledgeBase.open(tmp_path_factory.mktemp("filled") / "kb", embedder=embedder) as kb:
        kb.add_many(corpus_cases())
        yield kb


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> Path:
    """The corpus as a JSONL file (read-only)."""
    from remedy.cases.io import write_cases

    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    write_cases(path, corpus_cases())
    return path


def invoke(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    """Run ``remedy ARGS`` in-process through ``main()`` (as a user would, errors mapped to exit codes);
    returns (exit code, stdout, stderr)."""
    import sys

    from remedy.kb.cli import main

    monkeypatch.setattr(sys, "argv", ["remedy", *map(str, args)])
    capsys.readouterr()
    try:
        main()
        code = 0
    except SystemExit as ex:
        code = ex.code if isinstance(ex.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err
