"""Parameterized fault templates: a few families expanded into many bench scenarios.

``cases/scenarios/templates/faults.yaml`` declares env bases (env, algorithm,
hyperparameters, budgets, success definition) and one template per fault family
(the injected fault, its ground truth, the families expected to fix it and an
``oracle`` patch: a known fix). Each template lists *cells* (one env each) and
each cell one or more *magnitudes*; every magnitude becomes one
:class:`~remedy.cases.verify.scenarios.Scenario` named ``<env>_<family>_<tag>``.
A magnitude's fields override the cell's env base (``hyperparams`` merged key
by key); strings in the description, fault text and oracle are formatted with
the scenario's own numbers (``{learning_rate}``, ``{factor}``, ...).

**Split.** A whole env x family cell is ``dev`` or ``holdout`` so the holdout is
never a near-copy of a dev scenario at another magnitude: :func:`split_for`
hashes ``"<family>:<env key>"`` (SHA-256) and holds the cell out when the first
byte is below 128 (half the cells). A cell whose family and env id match a
hand-written scenario (those are all ``dev``: the priors were written while
looking at them) is forced to ``dev``.
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any

import yaml

from ..errors import ScenarioError

__all__ = ["TEMPLATE_FILE", "HOLDOUT_BELOW", "split_for", "expand_templates", "template_fields"]

#: the bundled template file.
TEMPLATE_FILE = Path(__file__).parent.parent / "scenarios" / "templates" / "faults.yaml"
#: a cell is held out when the first byte of ``sha256("<family>:<env>")`` is below this (half of the cells).
HOLDOUT_BELOW = 128


def split_for(family: str, env: str, env_id: str = "", reserved: frozenset[tuple[str, str]] = frozenset()) -> str:
    """``dev`` or ``holdout`` for one env x family cell (deterministic; see the module docstring).

    ``env`` is the cell's env key in the template file; ``reserved`` holds ``(family, env_id)``
    pairs of hand-written dev scenarios, whose cells stay dev.
    """
    if (family, env_id) in reserved:
        return "dev"
    first = hashlib.sha256(f"{family}:{env}".encode()).digest()[0]
    return "holdout" if first < HOLDOUT_BELOW else "dev"


def _vars(fields: dict[str, Any]) -> dict[str, Any]:
    """Numbers a template's text may name: training fields, hyperparameters and wrapper params."""
    out: dict[str, Any] = {k: v for k, v in fields.items() if not isinstance(v, (dict, list))}
    out.update({k: v for k, v in fields.get("hyperparams", {}).items() if not isinstance(v, (dict, list))})
    for w in fields.get("wrappers", []):
        out.update(w.get("params", {}))
    return out


def _fill(value: Any, names: dict[str, Any]) -> Any:
    """Format every string inside ``value`` with ``names`` (a missing name is a template error)."""
    if isinstance(value, str):
        try:
            return value.format(**names)
        except (KeyError, IndexError) as ex:
            raise ScenarioError(f"template text '{value[:60]}' names {ex}, which the scenario does not set") from None
    if isinstance(value, dict):
        return {k: _fill(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, names) for v in value]
    return value


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``; ``hyperparams`` merged key by key, everything else replaced."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if key == "hyperparams":
            out["hyperparams"] = {**out.get("hyperparams", {}), **value}
        else:
            out[key] = copy.deepcopy(value)
    return out


def _scenario_fields(
    family: str, template: dict, env_key: str, env_base: dict, magnitude: dict, split: str
) -> dict[str, Any]:
    mag = dict(magnitude)
    tag = str(mag.pop("tag"))
    fields = _merge(env_base, mag)
    oracle = fields.pop("oracle", None) or template.get("oracles", {}).get(env_key) or template.get("oracle")
    names = {"env": env_key, "tag": tag, **_vars(fields)}
    fields.update(
        name=f"{env_key}_{family}_{tag}".lower().replace(".", "p"),
        family=family,
        split=split,
        description=_fill(template["description"], names),
        fault=_fill(template["fault"], names),
        ground_truth=template["ground_truth"],
        expected_families=template["expected_families"],
        oracle=_fill(oracle, names) if oracle is not None else None,
    )
    return fields


def expand_templates(data: dict[str, Any], reserved: frozenset[tuple[str, str]] = frozenset()) -> list[dict[str, Any]]:
    """Scenario field dicts from parsed template data (``envs`` + ``templates``), in file order."""
    envs, out = data.get("envs") or {}, []
    for family, template in (data.get("templates") or {}).items():
        for env_key, magnitudes in (template.get("cells") or {}).items():
            if env_key not in envs:
                raise ScenarioError(f"template '{family}' names env '{env_key}', which 'envs' does not define")
            split = split_for(family, env_key, envs[env_key]["env_id"], reserved)
            out += [_scenario_fields(family, template, env_key, envs[env_key], m, split) for m in magnitudes]
    return out


def template_fields(
    path: str | Path = TEMPLATE_FILE, reserved: frozenset[tuple[str, str]] = frozenset()
) -> list[dict[str, Any]]:
    """The scenario field dicts a template file expands into (validated as scenarios by
    :func:`remedy.cases.verify.scenarios.load_template_scenarios`)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as ex:
        raise ScenarioError(f"cannot read the fault templates {path}: {ex}; fix or restore the file") from ex
    return expand_templates(data, reserved)
