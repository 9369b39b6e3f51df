"""The sequential confirmation (issue 27, item 4): alpha-spending boundaries pinned on published values, the
look rule on hand-made arms, its A/A rate, and a confirmation that stops at its first look through
``verify_patch`` (a scripted executor stands in for training, so no fine-tune runs)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from remedy.cases.errors import VerificationError
from remedy.cases.model import Stage, Status
from remedy.cases.patches.spec import Patch
from remedy.cases.verify import stats
from remedy.cases.verify.arms import ArmResult, Scores
from remedy.cases.verify.executors import JobResult
from remedy.cases.verify.stats import SequentialDesign, sequential_look, spending_boundaries
from remedy.cases.verify.verification import VerifyConfig, verify_patch


def test_two_look_boundaries_match_the_published_lan_demets_values():
    """gsDesign's sfLDPocock / sfLDOF, k = 2 equally spaced looks, one-sided alpha 0.025."""
    pocock = spending_boundaries((0.5, 1.0), 0.025, "pocock")
    assert pocock.z == pytest.approx((2.157, 2.201), abs=2e-3)
    # alpha(0.5) = 0.025 * ln(1 + (e - 1) / 2) by hand
    assert pocock.spent[0] == pytest.approx(0.025 * np.log(1 + (np.e - 1) / 2))
    assert pocock.levels[0] == pytest.approx(pocock.spent[0])  # the first look spends exactly its nominal level
    obf = spending_boundaries((0.5, 1.0), 0.025, "obrien_fleming")
    assert obf.z == pytest.approx((2.963, 1.969), abs=2e-3)
    # one look is the fixed design: the whole alpha at z = 1.96
    assert spending_boundaries((1.0,), 0.025).z == pytest.approx((1.95996,), abs=1e-4)


def test_boundaries_refuse_what_is_not_a_design():
    for fractions in ((0.5, 0.5, 1.0), (0.5, 0.9), (0.0, 1.0), ()):
        with pytest.raises(ValueError, match="fractions"):
            spending_boundaries(fractions)
    with pytest.raises(ValueError, match="spending"):
        spending_boundaries((0.5, 1.0), kind="haybittle")
    with pytest.raises(ValueError):
        SequentialDesign(looks=(1, 8)).check()


def runs(values: list[float], episodes: int = 20) -> list[list[float]]:
    """An arm of all-or-nothing seeds: each seed scores its value in every episode."""
    return [[v] * episodes for v in values]


def test_a_decisive_gain_stops_at_the_first_look_only_where_the_permutation_test_can_reach_its_level():
    design = SequentialDesign(looks=(4, 8))
    # 4 of 4 against 0 of 4: the most extreme of C(8, 4) = 70 relabellings, p = 1/70 = 0.0143 <= 0.0155
    e, verdict = sequential_look("success_rate", runs([1] * 4), runs([0] * 4), design, 0, aggregate=stats.mean)
    assert verdict == stats.IMPROVED and e.p_value == pytest.approx(1 / 70)
    assert e.confidence_level == pytest.approx(1 - 2 * design.level(0))
    # O'Brien-Fleming-type spends 0.0015 at the first look: below 1/70, so no stop there, whatever the data
    obf = SequentialDesign(looks=(4, 8), spending="obrien_fleming")
    assert sequential_look("success_rate", runs([1] * 4), runs([0] * 4), obf, 0, aggregate=stats.mean)[1] == (
        stats.CONTINUE
    )
    # 3 of 4 against 0 of 4: p = 5/70, go on
    _, verdict = sequential_look("success_rate", runs([1, 1, 1, 0]), runs([0] * 4), design, 0, aggregate=stats.mean)
    assert verdict == stats.CONTINUE


def test_futility_half_way_and_the_last_look():
    design = SequentialDesign(looks=(4, 8))
    tie = sequential_look("success_rate", runs([1, 0, 1, 0]), runs([0, 1, 1, 0]), design, 0, aggregate=stats.mean)
    assert tie[1] == stats.FUTILE and tie[0].diff == 0
    no_stop = SequentialDesign(looks=(4, 8), futility=False)
    assert sequential_look("x", runs([0, 1, 0, 0]), runs([1, 1, 0, 0]), no_stop, 0, aggregate=stats.mean)[1] == (
        stats.CONTINUE
    )
    # the last look: 7 of 8 against 1 of 8 passes its level (0.0139); 6 of 8 against 2 of 8 (p = 0.066) ends
    strong = sequential_look("x", runs([1] * 7 + [0]), runs([0] * 7 + [1]), design, 1, aggregate=stats.mean)
    assert strong[1] == stats.IMPROVED and strong[0].p_value <= design.level(1)
    weak = sequential_look("x", runs([1] * 6 + [0] * 2), runs([0] * 6 + [1] * 2), design, 1, aggregate=stats.mean)
    assert weak[1] == stats.END


def test_a_sequential_a_a_on_all_or_nothing_seeds_stays_below_the_level():
    """The worst case for a t-interval: each seed succeeds in every episode or in none (q = 0.5)."""
    design = SequentialDesign(looks=(4, 8))
    rng = np.random.default_rng(3)
    trials, passed = 1500, 0
    for _ in range(trials):
        t, c = (runs(list(rng.random(8) < 0.5), episodes=5) for _ in range(2))
        for k, n in enumerate(design.looks):
            _, verdict = sequential_look("x", t[:n], c[:n], design, k, aggregate=stats.mean)
            if verdict != stats.CONTINUE:
                passed += verdict == stats.IMPROVED
                break
    assert passed / trials <= 0.025 + 0.012  # nominal 2.5%; binomial sd at 1500 trials is 0.004


def test_the_config_names_its_design_and_refuses_an_unknown_one():
    cfg = VerifyConfig(seeds=3, confirm_seeds=8, confirm_design="sequential").confirmation(0)
    design = cfg.sequential()
    assert design is not None and design.looks == (4, 8) and design.alpha == pytest.approx(0.025)
    assert VerifyConfig(seeds=7, confirm_design="sequential").sequential().looks == (4, 7)
    assert VerifyConfig(seeds=3, confirm_design="sequential").sequential() is None  # half of 3 is under 2 seeds
    assert VerifyConfig(seeds=8, confirm_design="fixed").sequential() is None
    with pytest.raises(VerificationError, match="confirm design 'bayes' is unknown"):
        VerifyConfig(confirm_design="bayes").check()


class Scripted:
    """An executor that trains nothing: every treatment seed succeeds in every episode, every control fails."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def run(self, jobs, progress=None):
        self.batches.append([j.id for j in jobs])
        out = []
        for job in jobs:
            spec = job.kwargs["spec"]
            good = spec.arm == "treatment"
            scores = Scores(returns=(500.0 if good else 9.0,) * 5, successes=(float(good),) * 5, violations=(0.0,) * 5)
            value = ArmResult(
                arm=spec.arm, seed=spec.seed, env_steps=spec.budget_steps, train_wall_s=0.0, nominal=scores
            )
            out.append(JobResult(id=job.id, ok=True, value=value))
        return out

    def shutdown(self) -> None:
        pass


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from remedy.cases.evidence.rundir import RunConfig
    from remedy.cases.verify.training import train

    config = RunConfig(
        env_id="CartPole-v1",
        algo="PPO",
        train_steps=256,
        n_envs=2,
        hyperparams={"n_steps": 64, "batch_size": 64, "n_epochs": 1, "policy_kwargs": {"net_arch": [8]}},
        success={"kind": "return_threshold", "threshold": 100},
    )
    return train(config, tmp_path_factory.mktemp("seq") / "run", seed=0).path


@pytest.mark.parametrize("design", ["sequential", "fixed"])
def test_a_decisive_confirmation_stops_at_its_first_look(tiny_run, design):
    patch = Patch.from_data({"kind": "hyperparameters", "changes": {"ent_coef": 0.01}})
    cfg = VerifyConfig(seeds=3, confirm_seeds=8, budget_steps=64, eval_episodes=5, n_envs=2, confirm_design=design)
    executor = Scripted()
    case = verify_patch(tiny_run, patch, cfg.confirmation(0), executor=executor, stage=Stage.confirm, confirms="s")
    v = case.verification
    assert v.status is Status.improved and v.effect.metric == "success_rate"
    if design == "fixed":  # one batch of 8 seeds per arm, tested at 95%
        assert [len(b) for b in executor.batches] == [16] and v.seeds == 8
        assert v.effect.confidence_level == pytest.approx(0.95)
        return
    # one look of 4 seeds per arm (the training seeds right after the screen's 3), then stop
    assert [len(b) for b in executor.batches] == [8] and v.seeds == 4 and v.seed_base == 3
    assert sorted(executor.batches[0]) == sorted(
        f"{a} seed {s}" for a in ("treatment", "control") for s in (3, 4, 5, 6)
    )
    assert v.effect.confidence_level == pytest.approx(1 - 2 * cfg.confirmation(0).sequential().level(0))
    assert v.effect.p_value == pytest.approx(1 / 70)
    assert "stopped at look 1 (4 seeds per arm" in v.reason and "efficacy boundary" in v.reason


def _null_crossing(design: SequentialDesign, draws: int = 200_000) -> float:
    """P(some look crosses its boundary) under the null, by Monte Carlo on the canonical joint distribution:
    Z_k = S_k / sqrt(n_k) with S the partial sums of independent normal increments (n_k seeds at look k)."""
    rng = np.random.default_rng(0)
    n = np.asarray(design.looks, dtype=float)
    increments = rng.standard_normal((draws, n.size)) * np.sqrt(np.diff(n, prepend=0.0))
    z = np.cumsum(increments, axis=1) / np.sqrt(n)
    return float(np.mean((z >= np.asarray(design.boundaries.z)).any(axis=1)))


@pytest.mark.parametrize(("kind", "alpha"), [("pocock", 0.05), ("obrien_fleming", 0.025)])
def test_three_look_boundaries_spend_exactly_alpha(kind, alpha):
    """Three looks (4/8/12): the boundaries' total type I error is alpha (Monte Carlo, sd ~0.0005), each look
    spends its share of the spending function, and Pocock's nominal levels stay nearly equal."""
    design = SequentialDesign(looks=(4, 8, 12), alpha=alpha, spending=kind)
    b = design.boundaries
    assert b.fractions == pytest.approx((1 / 3, 2 / 3, 1.0))
    assert b.spent[-1] == alpha and b.spent[0] == pytest.approx(stats.SPENDING[kind](alpha, 1 / 3))
    assert _null_crossing(design) == pytest.approx(alpha, abs=0.002)
    if kind == "pocock":
        assert max(b.levels) / min(b.levels) < 1.1 and all(lv < alpha for lv in b.levels)
    else:
        assert b.levels[0] < b.levels[1] < b.levels[2] < alpha


def test_a_decisive_gain_stops_at_the_first_of_three_looks_only_at_a_5_percent_level():
    """4 of 4 against 0 of 4 (p = 1/70 = 0.0143): Pocock's first of three looks at one-sided 5% is 0.0226, so it
    stops; at 2.5% the first look is 0.0113, out of the permutation test's reach, so it goes on."""
    at5 = SequentialDesign(looks=(4, 8, 12), alpha=0.05)
    assert sequential_look("x", runs([1] * 4), runs([0] * 4), at5, 0, aggregate=stats.mean)[1] == stats.IMPROVED
    at25 = SequentialDesign(looks=(4, 8, 12))
    assert sequential_look("x", runs([1] * 4), runs([0] * 4), at25, 0, aggregate=stats.mean)[1] == stats.CONTINUE
    # the bimodal fix's typical last look: 9 of 12 learners against 3 of 12 passes at 5%, 8 against 4 does not
    assert sequential_look("x", runs([1] * 9 + [0] * 3), runs([0] * 9 + [1] * 3), at5, 2, aggregate=stats.mean)[1] == (
        stats.IMPROVED
    )
    assert sequential_look("x", runs([1] * 8 + [0] * 4), runs([0] * 8 + [1] * 4), at5, 2, aggregate=stats.mean)[1] == (
        stats.END
    )


def test_a_three_look_a_a_at_5_percent_on_all_or_nothing_seeds_stays_below_the_level():
    design = SequentialDesign(looks=(4, 8, 12), alpha=0.05)
    rng = np.random.default_rng(5)
    trials, passed = 800, 0
    for _ in range(trials):
        t, c = (runs(list(rng.random(12) < 0.5), episodes=5) for _ in range(2))
        for k, n in enumerate(design.looks):
            _, verdict = sequential_look("x", t[:n], c[:n], design, k, aggregate=stats.mean)
            if verdict != stats.CONTINUE:
                passed += verdict == stats.IMPROVED
                break
    assert passed / trials <= 0.05 + 0.023  # nominal 5%; binomial sd at 800 trials is 0.0077


def test_the_config_builds_three_looks_and_its_own_alpha_only_when_asked():
    cfg = VerifyConfig(seeds=4, confirm_seeds=12, confirm_design="sequential3")
    design = cfg.confirmation(0).sequential()
    assert design is not None and design.looks == (4, 8, 12) and design.alpha == pytest.approx(0.025)
    at5 = VerifyConfig(seeds=4, confirm_seeds=12, confirm_design="sequential3", confirm_alpha=0.05)
    assert at5.confirmation(0).sequential() == SequentialDesign(looks=(4, 8, 12), alpha=0.05)
    assert VerifyConfig(seeds=7, confirm_design="sequential3").sequential().looks == (3, 5, 7)
    # the design docs/benchmarks.md names for a default (D16): a 4-seed screen at one-sided 35%, 6/12/18 at 2.5%
    d16 = VerifyConfig(seeds=4, screen_confidence=0.3, confirm_seeds=18, confirm_design="sequential3")
    d16.check()
    d16_design = d16.confirmation(1).sequential()
    assert d16_design.looks == (6, 12, 18) and d16_design.alpha == pytest.approx(0.025)
    assert d16.confirmation(1).seed_base == 4 + 18  # the second confirmation's fresh seeds
    assert VerifyConfig(seeds=5, confirm_design="sequential3").sequential().looks == (3, 5)  # a third is 1 seed
    assert VerifyConfig(seeds=8, confirm_design="sequential", confirm_alpha=0.05).sequential().alpha == 0.05
    # the shipped default is untouched: a fixed confirmation at (1 - 0.95) / 2
    assert VerifyConfig().confirm_design == "fixed" and VerifyConfig().confirm_alpha is None
    for bad in (VerifyConfig(confirm_alpha=0.05), VerifyConfig(confirm_design="sequential3", confirm_alpha=0.6)):
        with pytest.raises(VerificationError, match="confirm_alpha must be between 0 and 0.5"):
            bad.check()


def test_a_three_look_confirmation_at_5_percent_stops_at_4_seeds_and_is_its_own_case(tiny_run):
    patch = Patch.from_data({"kind": "hyperparameters", "changes": {"ent_coef": 0.01}})
    base = VerifyConfig(seeds=4, confirm_seeds=12, budget_steps=64, eval_episodes=5, n_envs=2)
    cases = {}
    for name, cfg in {
        "sequential": replace(base, confirm_design="sequential", confirm_seeds=8),
        "sequential3": replace(base, confirm_design="sequential3", confirm_alpha=0.05),
    }.items():
        executor = Scripted()
        cases[name] = verify_patch(
            tiny_run, patch, cfg.confirmation(0), executor=executor, stage=Stage.confirm, confirms="s"
        )
        v = cases[name].verification
        assert v.status is Status.improved and v.seeds == 4 and v.seed_base == 4
        assert [len(b) for b in executor.batches] == [8]
    assert cases["sequential3"].verification.effect.confidence_level == pytest.approx(1 - 2 * 0.0226, abs=2e-4)
    # the same 4 seeds decided by another rule: a different case, not a cache hit of the other design
    assert cases["sequential3"].case_id != cases["sequential"].case_id
