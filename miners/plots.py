"""The report's figures, as PNG bytes: a forest plot of rule effects, and before/after plots of cases.

Figures are built with matplotlib's object API (``Figure``, no pyplot): no global state and no
display, so rendering is safe in servers and CI; PNGs come from the Agg renderer. Every figure is
saved without the ``Software`` PNG tag and with fixed size and DPI, so the same inputs give the
same bytes.
Randomness (the horizontal jitter of seed points) comes from a seeded generator.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure

from remedy.cases.model import Case

from .model import Rule, RuleStatus

__all__ = ["STATUS_COLOURS", "forest_plot", "before_after_plot", "arm_values"]

#: colour of a rule by where it stands in review; a flagged accepted rule is shown apart
STATUS_COLOURS = {"accepted": "#1a7f37", "proposed": "#0969da", "flagged": "#cf222e", "rejected": "#6e7781"}

_DPI = 100


def _rule_colour_key(rule: Rule) -> str:
    if rule.status is RuleStatus.accepted and rule.flag:
        return "flagged"
    return rule.status.value


def _png(fig: Figure) -> bytes:
    """The figure as PNG bytes, without the matplotlib version tag (byte-stable across runs)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, metadata={"Software": None})
    return buf.getvalue()


def forest_plot(rules: Sequence[Rule], scale: str) -> bytes:
    """One row per rule: its pooled effect with its CI, coloured by review status, and a zero line.

    ``rules`` are drawn top to bottom in the given order; ``scale`` labels the x axis.
    """
    n = len(rules)
    fig = Figure(figsize=(8.0, 1.2 + 0.42 * max(n, 1)))
    ax = fig.subplots()
    ys = np.arange(n)[::-1]
    for y, rule in zip(ys, rules):
        ev, colour = rule.evidence, STATUS_COLOURS[_rule_colour_key(rule)]
        ax.errorbar(
            ev.effect,
            y,
            # clipped at 0: matplotlib refuses negative error bars, and a stored CI need not hold the point
            xerr=[[max(0.0, ev.effect - ev.ci_low)], [max(0.0, ev.ci_high - ev.effect)]],
            fmt="s",
            color=colour,
            ecolor=colour,
            capsize=3,
            markersize=6,
        )
    ax.axvline(0.0, color="#444444", linewidth=1, linestyle="--")
    ax.set_yticks(ys, [f"{r.id}  {r.family.value}" for r in rules], fontsize=8)
    ax.set_ylim(-0.8, n - 0.2)
    ax.set_xlabel(scale, fontsize=9)
    ax.set_title("Rule effects with 95% CIs (green accepted, blue proposed, red flagged)", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return _png(fig)


@dataclass(frozen=True)
class ArmValues:
    """What a case says about its two arms: per-seed values, or only means (``per_seed`` False)."""

    metric: str
    control: list[float]
    treatment: list[float]
    per_seed: bool
    #: the 95% CI of the difference, shifted onto the control mean (drawn when there are no seeds)
    treatment_ci: tuple[float, float] | None = None


def arm_values(case: Case) -> ArmValues | None:
    """The control and treatment values of ``case``'s verification, or None when it has none."""
    v = case.verification
    if v is None or v.effect is None:
        return None
    eff = v.effect
    control, treatment = v.per_seed.get("control", []), v.per_seed.get("treatment", [])
    if control and treatment:
        return ArmValues(eff.metric, list(control), list(treatment), per_seed=True)
    ci = (eff.control + eff.ci_low, eff.control + eff.ci_high)
    return ArmValues(eff.metric, [eff.control], [eff.treatment], per_seed=False, treatment_ci=ci)


def before_after_plot(case: Case, *, seed: int = 0) -> bytes | None:
    """Control vs treatment on the original task metric: one point per training seed and the arm means.

    Without per-seed data the arm means are drawn, the treatment with the CI of the difference
    placed on the control mean. Returns None for a case without a measured effect.
    """
    arms = arm_values(case)
    if arms is None:
        return None
    rng = np.random.default_rng(seed)
    fig = Figure(figsize=(4.2, 3.2))
    ax = fig.subplots()
    for x, values, colour in ((0, arms.control, "#6e7781"), (1, arms.treatment, "#0969da")):
        jitter = rng.uniform(-0.08, 0.08, size=len(values)) if arms.per_seed else np.zeros(len(values))
        ax.scatter(x + jitter, values, color=colour, s=28, zorder=3)
        ax.hlines(float(np.mean(values)), x - 0.25, x + 0.25, color=colour, linewidth=2)
    if arms.treatment_ci is not None:
        lo, hi = arms.treatment_ci
        mid = arms.treatment[0]
        yerr = [[max(0.0, mid - lo)], [max(0.0, hi - mid)]]
        ax.errorbar(1, mid, yerr=yerr, fmt="none", ecolor="#0969da", capsize=4)
    ax.plot([0, 1], [float(np.mean(arms.control)), float(np.mean(arms.treatment))], color="#999999", linewidth=1)
    ax.set_xticks([0, 1], ["control", "treatment"])
    ax.set_xlim(-0.6, 1.6)
    ax.set_ylabel(arms.metric, fontsize=9)
    what = "one point per training seed" if arms.per_seed else "arm means; bar: control + 95% CI of the difference"
    status = case.verification.status.value if case.verification else "unverified"
    ax.set_title(f"{case.case_id} ({status})\n{what}", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return _png(fig)
