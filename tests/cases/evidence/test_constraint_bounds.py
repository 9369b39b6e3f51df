"""Constraint expressions whose value could be huge are refused when a run.yaml is read (issue 29).

``((10**8)**8)**8...`` is a handful of characters, passes a per-power exponent cap, and then
holds the GIL for tens of seconds at every env step; ``(0,) * 10**9`` allocates gigabytes.
Both must be refused by the static check, before anything evaluates them.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import yaml

from remedy.cases.errors import RunDirError, ValidationError
from remedy.cases.evidence.constraints import MAX_CONSTANT, compile_constraint
from remedy.cases.evidence.rundir import RunDir

NESTED_POWERS = "((((((((10**8)**8)**8)**8)**8)**8)**8)**8) > 0"


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        (NESTED_POWERS, "nests powers"),
        ("(obs[0] * 10**8)**8 > 1", "nests powers"),
        ("10**(2**8) > 1", "constant power of at most 8"),
        ("obs[0]**obs[1] > 1", "constant power of at most 8"),
        (f"{MAX_CONSTANT + 1} * 2 > obs[0]", "integer constant above"),
        ("len((0,) * 10**9) > 0", "name 'len'"),
        ("max((0,) * 999999999) > 0", "arithmetic on a tuple"),
        ("'a' * 999999999 == info['k']", "arithmetic on a tuple or a string"),
        ("((0,) if obs[0] > 0 else (1,)) * 99999999 == 0", "arithmetic on a tuple"),
        ("max((0,), (1,)) * 9 == 0", "arithmetic on a tuple"),
    ],
)
def test_expressions_that_could_be_huge_are_refused(expr: str, why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        compile_constraint(expr)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("obs[0]**2 + obs[1]**2 > 0.2", True),
        ("obs[0]**-2 > 10", False),
        ("obs[0] ** 0.5 > 1", False),
        ("np.hypot(obs[0], obs[1]) > 1e300", False),
        ("obs[0] * 10**8 * 10**7 > 1", True),
        ("info['mode'] == 'unsafe' and info['n'] * 2 > 3", True),
        ("obs[0, ] > 0.4", True),
    ],
)
def test_ordinary_expressions_still_evaluate(expr: str, expected: bool) -> None:
    violated = compile_constraint(expr)
    assert violated(np.array([0.5, 0.2]), np.array([0.1]), {"mode": "unsafe", "n": 2}) is expected


def test_a_bounded_worst_case_stays_small() -> None:
    """The largest integer an accepted expression can build: one power level over bounded constants."""
    worst = "(" + "*".join([str(MAX_CONSTANT - 1)] * 20) + ")**8 > obs[0]"
    with pytest.raises(ValidationError, match="OverflowError"):  # numpy cannot hold it: a clean error, fast
        compile_constraint(worst)(np.array([0.5]), np.array([0.0]))
    assert compile_constraint(worst.replace("obs[0]", "0"))(np.array([0.5]), np.array([0.0])) is True


def test_run_yaml_with_nested_powers_is_refused_on_load(cartpole_run, tmp_path) -> None:
    """`remedy signature` and the service's upload both read run.yaml through RunDir.load."""
    run = tmp_path / "run"
    shutil.copytree(cartpole_run, run)
    data = yaml.safe_load((run / "run.yaml").read_text())
    data["constraints"] = [{"name": "boom", "expr": NESTED_POWERS}]
    (run / "run.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(RunDirError, match=r"constraints\.0\.expr.*nests powers") as err:
        RunDir.load(run)
    assert "\n" not in str(err.value)  # one line
