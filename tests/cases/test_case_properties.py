"""Property tests (Hypothesis): any JSON record either round-trips through import/export or is
refused with one clear line naming where the problem is."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remedy.cases.errors import ImportFileError
from remedy.cases.io import case_from_json, case_to_json, read_cases, write_cases
from remedy.cases.model import Case, Cause, Diagnosis, Effect, EnvTraits, Signature, Subject, Verification
from remedy.cases.patches.spec import Patch

VALID = Case(
    case_id="c-prop",
    source="verified",
    subject=Subject(
        env_id="CartPole-v1",
        algo="PPO",
        train_steps=1000,
        traits=EnvTraits(action_space="discrete", obs_dim=4, action_dim=2),
    ),
    signature=Signature(features={"return_iqm": 12.0, "coverage": float("nan")}, symptoms=["timeouts"], summary="s"),
    diagnosis=Diagnosis(causes=[Cause(cause="undertraining", confidence=0.7)]),
    patch=Patch.from_data({"kind": "training_budget", "extra_steps": 500}),
    verification=Verification(
        status="improved",
        seeds=2,
        budget_steps=100,
        effect=Effect(metric="return_iqm", treatment=3.0, control=1.0, diff=2.0, ci_low=0.5, ci_high=3.5),
    ),
)
BASE = json.loads(case_to_json(VALID))

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.sampled_from(["NaN", "Infinity", "improved", "PPO", "undertraining"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


ALL_PATHS = [p for p in _paths(BASE) if p]


@st.composite
def mutated_records(draw):
    """The valid case with one field (at any depth) replaced, deleted, or a new key added."""
    record = json.loads(json.dumps(BASE))
    path = draw(st.sampled_from(ALL_PATHS))
    parent = record
    for key in path[:-1]:
        parent = parent[key]
    action = draw(st.sampled_from(["replace", "delete", "add"]))
    if action == "delete" and isinstance(parent, dict):
        del parent[path[-1]]
    elif action == "add" and isinstance(parent, dict):
        parent[draw(st.text(min_size=1, max_size=8))] = draw(json_values)
    else:
        parent[path[-1]] = draw(json_values)
    return record


def _check(record) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.jsonl"
        src.write_text(json.dumps(record) + "\n")  # json.dumps writes NaN/Infinity tokens, as careless exporters do
        try:
            cases, problems = read_cases(src)
        except ImportFileError as err:
            msg = str(err)
            assert "\n" not in msg and "Traceback" not in msg
            assert "line 1" in msg and "nothing imported" in msg
            return
        assert problems == [] and len(cases) == 1
        text = case_to_json(cases[0])
        assert case_to_json(case_from_json(text)) == text  # the stored form reads back identically
        out = Path(tmp) / "out.jsonl"
        write_cases(out, cases)
        again, _ = read_cases(out)
        assert [case_to_json(c) for c in again] == [text]
        eff = cases[0].verification.effect if cases[0].verification else None
        if eff is not None:
            assert all(math.isfinite(x) for x in (eff.treatment, eff.control, eff.diff, eff.ci_low, eff.ci_high))
            assert eff.ci_low <= eff.ci_high


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_records())
def test_mutated_case_round_trips_or_is_refused_clearly(record):
    _check(record)


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_any_json_value_round_trips_or_is_refused_clearly(value):
    _check(value)


@settings(max_examples=100, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True), st.floats(allow_nan=True, allow_infinity=True))
def test_effect_bounds(low, high):
    record = json.loads(json.dumps(BASE))
    record["verification"]["effect"].update(ci_low=low, ci_high=high)
    _check(record)
