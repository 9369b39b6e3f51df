"""The bundled example cases: every line a valid, honest, well-formed Case."""

from __future__ import annotations

import inspect
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import remedy.cases as cases_pkg
from remedy.cases.model import Case, RemedyFamily, RootCause, Source
from remedy.cases.vocab import FEATURES, SYMPTOMS

EXAMPLES_DIR = Path(cases_pkg.__file__).parent / "examples"
FILES = sorted(EXAMPLES_DIR.glob("*.jsonl"))


def _load() -> list[tuple[str, Case]]:
    out = []
    for f in FILES:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if line.strip():
                out.append((f"{f.name}:{n}", Case.from_json(line)))
    return out


@pytest.fixture(scope="module")
def examples() -> list[tuple[str, Case]]:
    return _load()


def test_every_line_parses_as_a_case():
    assert FILES, f"no example files under {EXAMPLES_DIR}"
    bad = []
    for f in FILES:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            try:
                Case.from_json(line)
            except Exception as e:
                bad.append(f"{f.name}:{n}: {str(e).splitlines()[0]}")
    assert not bad, "\n".join(bad)


def test_count_and_unique_ids(examples):
    assert 60 <= len(examples) <= 100
    ids = Counter(c.case_id for _, c in examples)
    assert [i for i, k in ids.items() if k > 1] == []
    assert all(c.case_id.startswith("ex-") for _, c in examples)


def test_examples_carry_no_measurements(examples):
    for where, c in examples:
        assert c.source == Source.example, where
        assert c.verification is None, where
        assert c.effect_value is None, where
        assert c.status in ("literature", "unverified"), where
        if c.literature is not None:
            assert c.literature.claim.strip() and c.literature.source.strip(), where


def test_signatures_use_only_the_shared_vocabulary(examples):
    for where, c in examples:
        assert set(c.signature.features) <= set(FEATURES), (where, set(c.signature.features) - set(FEATURES))
        assert set(c.signature.symptoms) <= set(SYMPTOMS), (where, set(c.signature.symptoms) - set(SYMPTOMS))
        assert all(math.isfinite(v) for v in c.signature.features.values()), where
        assert len(c.signature.summary) >= 40, where


def test_diagnoses_are_human_and_ranked(examples):
    for where, c in examples:
        d = c.diagnosis
        assert d is not None and d.backend == "human" and 1 <= len(d.causes) <= 3, where
        confs = [x.confidence for x in d.causes]
        assert confs == sorted(confs, reverse=True), where
        assert all(x.rationale for x in d.causes), where


def test_every_root_cause_appears_at_least_twice(examples):
    seen = Counter(cause for _, c in examples for cause in c.root_causes)
    missing = {rc.value: seen[rc] for rc in RootCause if rc != RootCause.unknown and seen[rc] < 2}
    assert not missing, missing


def test_every_patch_kind_appears(examples):
    kinds = {k for _, c in examples for k in c.patch.kinds}
    assert {f.value for f in RemedyFamily} <= kinds


def test_traits_match_the_real_gymnasium_spaces(examples):
    gym = pytest.importorskip("gymnasium")
    spaces: dict[tuple, tuple] = {}
    for where, c in examples:
        s = c.subject
        key = (s.env_id, tuple(sorted(s.env_kwargs.items())))
        if key not in spaces:
            env = gym.make(s.env_id, **s.env_kwargs)
            a = env.action_space
            kind = "discrete" if isinstance(a, gym.spaces.Discrete) else "continuous"
            adim = int(a.n) if kind == "discrete" else int(a.shape[0])
            spaces[key] = (kind, int(env.observation_space.shape[0]), adim)
            env.close()
        t = s.traits
        assert (t.action_space.value, t.obs_dim, t.action_dim) == spaces[key], where


def _algo_class(name: str):
    import sb3_contrib
    import stable_baselines3

    key = name.replace("-", "").upper()
    for mod in (stable_baselines3, sb3_contrib):
        for attr in dir(mod):
            if attr.upper() == key:
                return getattr(mod, attr)
    raise LookupError(name)


def test_hyperparameter_patches_name_real_constructor_arguments(examples):
    for where, c in examples:
        params = set(inspect.signature(_algo_class(c.subject.algo).__init__).parameters)
        for part in c.patch.parts:
            if part.kind == "hyperparameters":
                assert set(part.changes) <= params, (where, set(part.changes) - params)


def test_curriculum_fractions_sum_to_one(examples):
    for where, c in examples:
        for part in c.patch.parts:
            if part.kind == "curriculum":
                assert math.isclose(sum(s.fraction for s in part.stages), 1.0), where


def test_safety_predicates_compile(examples):
    for where, c in examples:
        for part in c.patch.parts:
            if part.kind == "safety_constraint":
                compile(part.predicate, where, "eval")


_EXTREMES = [0.0, 1.0, -1.0, 1e9, -1e9, float("nan"), float("inf"), float("-inf")]


def test_reward_shaping_code_compiles_and_stays_finite(examples):
    """Compile each bundled shaping function and call it on extreme inputs (plain exec; the
    bundled code is ours, the sandbox checks untrusted code elsewhere)."""
    n = 0
    for where, c in examples:
        t = c.subject.traits
        for part in c.patch.parts:
            if part.kind != "reward_shaping":
                continue
            assert "import" not in part.code and "__" not in part.code, where
            ns: dict = {"np": np, "math": math}
            exec(compile(part.code, where, "exec"), ns)
            f = ns["shaped_reward"]
            for i, v in enumerate(_EXTREMES):
                obs = np.full(t.obs_dim, v)
                act = i % t.action_dim if t.action_space.value == "discrete" else np.full(t.action_dim, v)
                for done in (False, True):
                    out = f(obs, act, v, obs, done, False, {})
                    assert isinstance(out, float) and math.isfinite(out), (where, v, out)
            n += 1
    assert n >= 10
