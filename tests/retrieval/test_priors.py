"""The built-in prior rulebook: well-formed, sourced, and every template it writes is usable.

Every patch template is instantiated for several subjects (discrete and continuous,
on- and off-policy) and must pass the patch fit check; every piece of reward code
and every safety predicate must pass the real sandbox (static check, compile, fuzz).
"""

from __future__ import annotations

import pytest

from remedy.cases.model import EnvTraits, RemedyFamily, RootCause, Signature, Subject
from remedy.cases.patches.check import check_fit, check_patch
from remedy.cases.patches.sandbox import compile_reward
from remedy.cases.success import FinalObs, FinalReward, InfoFlag, Terminated
from remedy.retrieval.prior_conditions import Facts, registered_time_limit, success_from_text
from remedy.retrieval.priors import PRIORS, match_priors, prior_by_id

SUBJECTS = [
    Subject(
        env_id="LunarLander-v3",
        env_kwargs={"continuous": True},
        algo="PPO",
        train_steps=150_000,
        success=FinalReward(value=100).describe(),
        hyperparams={"ent_coef": 0.0, "learning_rate": 3e-4},
        traits=EnvTraits(action_space="continuous", obs_dim=8, action_dim=2),
    ),
    Subject(
        env_id="MountainCarContinuous-v0",
        algo="SAC",
        train_steps=50_000,
        success=FinalObs(index=0, value=0.45).describe(),
        traits=EnvTraits(action_space="continuous", obs_dim=2, action_dim=1, reward_density="sparse"),
    ),
    Subject(
        env_id="MountainCar-v0",
        algo="DQN",
        train_steps=100_000,
        success=Terminated().describe(),
        traits=EnvTraits(action_space="discrete", obs_dim=2, action_dim=3, reward_density="sparse"),
    ),
    Subject(
        env_id="CartPole-v1",
        algo="A2C",
        train_steps=20_000,
        success=InfoFlag(key="is_success").describe(),
        traits=EnvTraits(action_space="discrete", obs_dim=4, action_dim=2),
    ),
    Subject(
        env_id="Pendulum-v1",
        algo="TD3",
        train_steps=20_000,
        traits=EnvTraits(action_space="continuous", obs_dim=3, action_dim=1),
    ),
]
#: declared safety constraints (true when violated) per env, as run directories carry them
CONSTRAINTS = {"LunarLander-v3": ("abs(obs[0]) > 0.2",), "Pendulum-v1": ("abs(action[0]) > 1.5", "abs(obs[2]) > 6.0")}
SIGNATURE = Signature(
    features={"ep_len_mean": 200.0, "ep_len_frac": 1.0, "action_jerk": 0.6, "reward_per_step": -1.0},
    symptoms=[],
    summary="probe",
)


def _all_patches():
    """(subject, rule id, family, patch) for every template that builds for every subject."""
    out = []
    for subject in SUBJECTS:
        facts = Facts(subject, SIGNATURE, CONSTRAINTS.get(subject.env_id, ()))
        for rule in PRIORS:
            for tmpl in rule.templates:
                patch = tmpl.build(facts)
                if patch is not None:
                    out.append((subject, rule.id, tmpl.family, patch))
    return out


PATCHES = _all_patches()


def test_rulebook_is_well_formed_and_sourced():
    assert 15 <= len(PRIORS) <= 25
    assert len({r.id for r in PRIORS}) == len(PRIORS)
    for rule in PRIORS:
        assert rule.source.strip() and rule.conditions and rule.templates
        assert all(isinstance(c, RootCause) and 0 < conf <= 1 for c, conf in rule.causes)
    assert prior_by_id("prior-jerky-continuous").causes[0][0] == RootCause.action_jitter


def test_literature_named_in_the_brief_is_cited():
    sources = " ".join(r.source for r in PRIORS)
    for name in (
        "Tips and Tricks",
        "Zoo",
        "Mysore et al. 2021",
        "Andrychowicz et al. 2021",
        "Ng et al. 1999",
        "Pardo et al. 2018",
        "Amodei et al. 2016",
    ):
        assert name in sources


def test_templates_cover_most_families():
    families = {fam for _, _, fam, _ in PATCHES}
    assert families >= {
        RemedyFamily.reward_shaping,
        RemedyFamily.action_smoothness,
        RemedyFamily.hyperparameters,
        RemedyFamily.normalization,
        RemedyFamily.time_limit,
        RemedyFamily.exploration_bonus,
        RemedyFamily.curriculum,
        RemedyFamily.safety_constraint,
        RemedyFamily.training_budget,
    }


@pytest.mark.parametrize("subject", SUBJECTS, ids=lambda s: f"{s.env_id}-{s.algo}")
def test_every_template_fits_its_subject(subject):
    for subj, _rule_id, _family, patch in PATCHES:
        if subj is subject:
            check_fit(patch, subject.traits, subject.algo)  # raises PatchRejectedError on a misfit


def test_every_code_template_passes_the_sandbox():
    seen, checked = set(), 0
    for subject, rule_id, family, patch in PATCHES:
        if family not in (RemedyFamily.reward_shaping, RemedyFamily.safety_constraint):
            continue
        key = (subject.env_id, patch.model_dump_json())
        if key in seen:
            continue
        seen.add(key)
        report = check_patch(patch, subject.env_id, subject.env_kwargs, subject.algo, n_random=20)
        assert report.ok, f"{rule_id} for {subject.env_id}: {report.rule}: {report.message}"
        checked += 1
    assert checked >= 6  # time cost, sparse success, potential shaping (several envs), safety predicates


def test_safety_template_enforces_the_declared_constraint():
    sig = Signature(features={"constraint_violation_rate": 0.3}, symptoms=["constraint_violations"], summary="x")
    assert [m.rule.id for m in match_priors(SUBJECTS[0], sig)] == ["prior-constraints"]
    assert match_priors(SUBJECTS[0], sig)[0].patches == ()  # nothing declared: nothing to enforce
    ((_tmpl, patch),) = match_priors(SUBJECTS[0], sig, constraints=("abs(obs[0]) > 0.2",))[0].patches
    assert patch.parts[0].predicate == "abs(obs[0]) > 0.2" and patch.parts[0].mode == "penalty"


def test_learning_rate_priors_compare_with_the_algorithm_default():
    sig = Signature(symptoms=["low_success", "unstable_learning"], summary="x")
    high = SUBJECTS[3].model_copy(update={"hyperparams": {"learning_rate": 0.05}})  # A2C default 7e-4
    ids = [m.rule.id for m in match_priors(high, sig)]
    assert "prior-lr-too-high" in ids and "prior-lr-too-low" not in ids
    low = SUBJECTS[3].model_copy(update={"hyperparams": {"learning_rate": 1e-6}})
    matches = {m.rule.id: m for m in match_priors(low, sig)}
    assert matches["prior-lr-too-low"].patches[0][1].parts[0].changes == {"learning_rate": 7e-4}
    # the generic "unstable" prior must not push an already tiny learning rate lower still
    assert all(p.parts[0].kind != "hyperparameters" for _, p in matches["prior-unstable"].patches)


def test_time_cost_restores_the_original_reward_and_charges_per_step():
    lander = SUBJECTS[0]
    patch = next(
        p
        for s, rid, fam, p in PATCHES
        if s is lander and rid == "prior-hovering-time-cost" and fam == RemedyFamily.reward_shaping
    )
    fn = compile_reward(patch.parts[0].code)
    obs = [0.0] * 8
    cost = float(patch.parts[0].description.rsplit(" ", 1)[1])
    assert 0.01 <= cost <= 1.0  # a tenth of the per-step reward scale, not a lander-specific constant
    # a survival-biased training reward of +1.3 while the env's own reward was -0.2: hovering now costs
    assert fn(obs, [0.0, 0.0], 1.3, obs, False, False, {"original_reward": -0.2}) == pytest.approx(-0.2 - cost)
    landed = fn(obs, [0.0, 0.0], 0.0, obs, True, False, {"original_reward": 100.0})
    assert landed == pytest.approx(100.0 - cost)  # the env's own landing reward, no extra bonus


def test_potential_shaping_is_potential_based():
    car = SUBJECTS[1]
    patch = next(
        p
        for s, rid, fam, p in PATCHES
        if s is car and rid == "prior-sparse-never" and fam == RemedyFamily.reward_shaping
    )
    fn = compile_reward(patch.parts[0].code)
    # a loop s -> s' -> s collects nothing extra beyond (gamma - 1) terms: no reward for circling
    s, s2 = [-0.5, 0.0], [-0.3, 0.04]
    there = fn(s, [0.0], 0.0, s2, False, False, {})
    back = fn(s2, [0.0], 0.0, s, False, False, {})
    assert there > 0 > back and abs(there + back) < 0.05


def test_success_text_round_trips_for_code_templates():
    for spec in (FinalObs(index=0, value=0.45), FinalReward(value=100.0), InfoFlag(key="done"), Terminated()):
        assert success_from_text(spec.describe()) == spec
    assert success_from_text("return >= 200") is None


def test_matching_reports_evidence_with_values():
    sig = Signature(features={"action_jerk": 0.72}, symptoms=["jerky_actions"], summary="chatter")
    matches = match_priors(SUBJECTS[4], sig)
    assert [m.rule.id for m in matches] == ["prior-jerky-continuous"]
    assert "action_jerk=0.72" in matches[0].evidence[0]
    assert match_priors(SUBJECTS[3], sig) == []  # discrete actions: no smoothness prior


def test_registered_time_limit_never_imports_a_module_named_in_an_env_id(tmp_path, monkeypatch):
    import sys

    marker = tmp_path / "ran"
    (tmp_path / "remedy_evil_env_mod.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert registered_time_limit("remedy_evil_env_mod:CartPole-v1") == 500  # the registered part answers
    assert not marker.exists() and "remedy_evil_env_mod" not in sys.modules
