"""Blind patients: a bench patient's fault wrappers never reach a diagnoser's inputs or patch code.

A tiny MountainCar patient is trained with two reward faults whose names and
parameters are distinctive strings; everything a diagnoser reads (subject,
reward text, signature, DiagnosisContext, the LLM prompt) and the ``info``
patch code receives is searched for them. Remedy's own measurement must still
see the original task reward.
"""

from __future__ import annotations

import pytest

from remedy.cases.evidence.envs import env_traits
from remedy.cases.evidence.rollouts import collect_evidence
from remedy.cases.evidence.rundir import RunDir, write_run_yaml
from remedy.cases.evidence.signature import compute_signature
from remedy.cases.evidence.wrappers import WrapperSpec
from remedy.cases.model import Diagnosis
from remedy.cases.patches.apply import PatchPlan, make_patched_env_fn
from remedy.cases.patches.spec import Patch
from remedy.cases.verify.scenarios import Scenario, build_scenario, scenario_hash
from remedy.kb.diagnose import diagnose_run, reward_text
from remedy.retrieval.diagnosis import DiagnosisReport

#: strings that name the injected faults or their parameters (the answer key).
FAULT_STRINGS = ("exploitable_shaping", "reward_noise", "shaping_bonus", "abs_obs", "37.5", "0.123", "component.")

#: reward code that reports, in the reward itself, which fault channels it can see in ``info``.
PROBE_CODE = """
def shaped_reward(obs, action, reward, next_obs, terminated, truncated, info):
    seen = 0.0
    if "original_reward" in info:
        seen += 100.0
    if "reward_components" in info:
        seen += 10.0
    return seen
"""


def _scenario() -> Scenario:
    return Scenario(
        name="blind_probe",
        description="test patient",
        env_id="MountainCar-v0",
        algo="PPO",
        hyperparams={"n_steps": 32, "batch_size": 64, "n_epochs": 1, "policy_kwargs": {"net_arch": [8]}},
        train_steps=256,
        n_envs=2,
        wrappers=[
            WrapperSpec(kind="exploitable_shaping", params={"term": "abs_obs", "coef": 37.5, "index": 1}),
            WrapperSpec(kind="reward_noise", params={"std": 0.123, "seed": 3}),
        ],
        fault="a farmable speed bonus and a noisy reward",
        ground_truth=["reward_hacking"],
        expected_families=["reward_shaping"],
        success={"kind": "terminated"},
        eval_episodes=2,
    )


@pytest.fixture(scope="module")
def patient(tmp_path_factory) -> RunDir:
    return build_scenario(_scenario(), tmp_path_factory.mktemp("cache"), evaluate=False).run


class _Recorder:
    """A diagnoser that keeps the context it was handed."""

    name = "recorder"

    def __init__(self):
        self.ctx = None

    def diagnose(self, ctx):
        self.ctx = ctx
        return DiagnosisReport(signature=ctx.signature, diagnosis=Diagnosis(backend="recorder"))


def _assert_blind(text: str, where: str) -> None:
    leaked = [s for s in FAULT_STRINGS if s in text]
    assert not leaked, f"{where} names the fault: {leaked}\n{text}"


def test_scenario_marks_faults_hidden_without_changing_its_hash():
    s = _scenario()
    assert all(w.hidden for w in s.run_config().wrappers)
    assert "hidden" not in s.model_dump(mode="json")["wrappers"][0]  # the hash input is unchanged
    assert scenario_hash(s) == scenario_hash(s.model_copy(update={"wrappers": list(s.wrappers)}))
    assert "farmable" not in s.run_config().notes


def test_no_fault_name_or_parameter_reaches_the_diagnoser(patient):
    pytest.importorskip("dspy")
    from remedy.retrieval.llm import build_inputs

    subject = patient.subject()
    assert subject.reward_ref is None
    _assert_blind(subject.model_dump_json(), "subject")
    _assert_blind(reward_text(patient), "reward text")
    recorder = _Recorder()
    diagnose_run(None, patient, diagnoser=recorder, n_episodes=2, seed=0)
    ctx = recorder.ctx
    _assert_blind(ctx.signature.summary, "signature summary")
    _assert_blind(" ".join(ctx.signature.features), "signature features")
    _assert_blind(repr(ctx), "DiagnosisContext")
    _assert_blind("\n".join(build_inputs(ctx).values()), "LLM prompt")


def test_the_same_wrappers_declared_by_a_user_stay_visible(patient, tmp_path):
    """The control for the test above: the leak it checks for is real when the wrappers are the user's."""
    user = tmp_path / "user"
    user.mkdir()
    (user / "model.zip").write_bytes(patient.model_path.read_bytes())
    c = patient.config
    write_run_yaml(
        user, c.model_copy(update={"wrappers": [w.model_copy(update={"hidden": False}) for w in c.wrappers]})
    )
    run = RunDir.load(user)
    assert "exploitable_shaping" in (run.subject().reward_ref or "")
    assert "37.5" in reward_text(run)
    sig = compute_signature(collect_evidence(run, n_episodes=2, seed=0), run.subject())
    assert "component.shaping_bonus.mean" in sig.features


def _probe_rewards(config) -> list[float]:
    patch = Patch.from_data({"kind": "reward_shaping", "code": PROBE_CODE})
    plan = PatchPlan.from_patch(patch, env_traits(config.env_id, config.env_kwargs), config.algo)
    env = make_patched_env_fn(config.env_id, config.env_kwargs, config.wrappers, plan, seed=0)()
    env.reset(seed=0)
    return [env.step(env.action_space.sample())[1] for _ in range(5)]


def test_patch_code_sees_no_fault_channel_in_info(patient):
    assert _probe_rewards(patient.config) == [0.0] * 5
    visible = patient.config.model_copy(
        update={"wrappers": [w.model_copy(update={"hidden": False}) for w in patient.config.wrappers]}
    )
    assert _probe_rewards(visible) == [110.0] * 5  # a user's own wrappers: both channels are theirs to use


def test_remedy_still_measures_the_original_task_reward(patient):
    bundle = collect_evidence(patient, n_episodes=2, seed=0, stochastic=False)
    for ep in bundle.deterministic:
        assert ep.ret == pytest.approx(-ep.length)  # MountainCar pays -1 per step; the fault is not in it
        assert ep.train_ret != pytest.approx(ep.ret)  # the agent trained on the faulty reward
        assert not ep.reward_components
