"""The bench on one tiny CartPole scenario: reports with the accuracy fields, stored bench cases, no leaks.

The scenario is written to ``tmp_path`` (1k training steps, 2 envs) and built
into a temporary cache; verification uses one seed and a few hundred steps.
The figures are not the point; the report's shape and the exclusion are.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import ClassVar

import pytest
import yaml
from typer.testing import CliRunner

from remedy.cases.model import Cause, Diagnosis, Effect, RemedyFamily, RootCause, Source, Verification
from remedy.cases.verify.scenarios import build, load_scenarios
from remedy.kb.bench import BenchSettings, run_bench, score_causes, summarize
from remedy.kb.bench_report import write_report
from remedy.kb.cli import app
from remedy.kb.diagnose import diagnose_run

SCENARIO = {
    "name": "tiny_cartpole_undertrained",
    "description": "PPO CartPole stopped after 1k steps (test scenario).",
    "env_id": "CartPole-v1",
    "algo": "PPO",
    "hyperparams": {"n_steps": 64, "batch_size": 64, "n_epochs": 2, "policy_kwargs": {"net_arch": [16]}},
    "train_steps": 1024,
    "n_envs": 2,
    "fault": "training stopped far too early",
    "ground_truth": ["undertraining"],
    "expected_families": ["training_budget"],
    "success": {"kind": "return_threshold", "threshold": 100},
    "eval_episodes": 3,
    "finetune_budget": 256,
}
TINY = BenchSettings(rounds=1, candidates=1, seeds=1, eval_episodes=3, n_envs=2, diagnose_episodes=3)


@pytest.fixture(scope="module")
def scenario_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("scenarios") / "tiny.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    return path


@pytest.fixture(scope="module")
def cache(tmp_path_factory, scenario_file):
    """The built patient, cached once for the module."""
    cache = tmp_path_factory.mktemp("cache")
    build(load_scenarios(str(scenario_file))[0], cache_dir=cache)
    return cache


def test_score_causes_against_ground_truth():
    truth = [RootCause.undertraining, RootCause.sparse_reward]
    assert score_causes(["undertraining", "unknown"], truth) == (True, True)
    assert score_causes(["unknown", "action_jitter", "sparse_reward", "undertraining"], truth) == (False, True)
    assert score_causes(["unknown", "action_jitter", "reward_hacking", "undertraining"], truth) == (False, False)
    assert score_causes([], truth) == (False, False)
    assert summarize([]).n == 0 and summarize([]).fix_rate == 0.0


def test_bench_run_cli_writes_json_and_markdown(tmp_path, scenario_file, cache):
    kb, reports = tmp_path / "kb", tmp_path / "reports"
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "run",
            "--scenarios",
            str(scenario_file),
            "--cold",
            "--rounds",
            "1",
            "--candidates",
            "1",
            "--seeds",
            "1",
            "--budget",
            "256",
            "--kb",
            str(kb),
            "--reports",
            str(reports),
            "--cache",
            str(cache),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["label"] == "cold" and data["kb"] is None  # cold: retrieval saw no KB
    (row,) = data["scenarios"]
    assert row["scenario"] == SCENARIO["name"] and row["error"] == "" and row["attempts"] >= 1
    assert row["first_causes"] and row["top1"] == (row["first_causes"][0] == "undertraining")
    for key in (
        "top1_accuracy",
        "top3_accuracy",
        "fix_rate",
        "mean_attempts_to_fix",
        "mean_env_steps_to_fix",
        "mean_wall_time_to_fix_s",
    ):
        assert key in data["summary"]
    assert data["summary"]["fix_rate"] == (1.0 if row["fixed"] else 0.0)
    names = {p.name for p in reports.iterdir()}
    assert {"latest.json", "latest.md"} <= names and len(names) == 4
    assert json.loads((reports / "latest.json").read_text())["summary"] == data["summary"]
    md = (reports / "latest.md").read_text()
    assert "top-1 accuracy" in md and "top-3 accuracy" in md and SCENARIO["name"] in md
    # the attempts were stored in --kb as bench cases of the scenario
    from remedy.kb.facade import KnowledgeBase

    with KnowledgeBase.open(kb, create=False) as base:
        stored = [base.get(cid) for cid in row["case_ids"]]
    assert all(c.source is Source.bench and c.scenario == SCENARIO["name"] and c.diagnosis for c in stored)


def _planted(case, scenario: str, cid: str):
    """A copy of ``case`` as an improved case of ``scenario`` (same signature: the nearest possible neighbour)."""
    eff = Effect(metric="return_iqm", treatment=100.0, control=20.0, diff=80.0, ci_low=40.0, ci_high=120.0)
    return case.model_copy(
        update={
            "case_id": cid,
            "scenario": scenario,
            "source": Source.bench,
            "verification": Verification(status="improved", effect=eff, seeds=3),
            "diagnosis": Diagnosis(causes=[Cause(cause=RootCause.undertraining, confidence=0.9)]),
        }
    )


def test_bench_never_cites_the_evaluated_scenarios_own_cases(kb, scenario_file, cache, tmp_path):
    (s,) = load_scenarios(str(scenario_file))
    run = build(s, cache_dir=cache)
    probe = diagnose_run(None, run, n_episodes=3)
    from remedy.cases.model import Case
    from remedy.cases.patches.spec import Patch

    base = Case(
        case_id="c-probe",
        source=Source.bench,
        subject=run.subject(),
        signature=probe.signature,
        patch=Patch.from_data({"kind": "training_budget", "extra_steps": 2000}),
    )
    own, other = _planted(base, s.name, "c-own"), _planted(base, "some_other_scenario", "c-other")
    kb.add_many([own, other])
    # without exclusion the planted case of this very scenario is the nearest and gets cited
    assert "c-own" in diagnose_run(kb, run, n_episodes=3).diagnosis.cited_cases
    report = run_bench(kb, [s], TINY, store=kb, cache_dir=cache)
    (row,) = report.scenarios
    assert row.error == "" and row.cited_cases
    assert "c-own" not in row.cited_cases and "c-other" in row.cited_cases
    for cid in row.case_ids:  # and the bench attempts went to the KB with the scenario set
        assert kb.get(cid).scenario == s.name and kb.get(cid).source is Source.bench
    paths = write_report(report, tmp_path / "r")
    assert {p.name for p in paths} >= {"latest.json", "latest.md"}


def _offer(ctx, backend: str, cause: RootCause, patch: dict, family: RemedyFamily):
    """A test diagnoser's report: one cause and one candidate patch."""
    from remedy.cases.patches.spec import Patch
    from remedy.retrieval.diagnosis import CandidatePatch, DiagnosisReport

    diag = Diagnosis(causes=[Cause(cause=cause, confidence=0.5)], backend=backend)
    candidate = CandidatePatch(patch=Patch.from_data(patch), family=family)
    return DiagnosisReport(signature=ctx.signature, diagnosis=diag, candidates=[candidate])


class _Hostile:
    """A registered diagnoser that offers one hostile patch (refused before any training) and logs what it saw."""

    name = "test-hostile"
    seen: ClassVar[list] = []

    def diagnose(self, ctx):
        _Hostile.seen.append(ctx)
        code = (
            "import os\n\ndef shaped_reward(obs, action, reward, next_obs, terminated, truncated, info):\n"
            "    return float(os.getpid())\n"
        )
        patch = {"kind": "reward_shaping", "description": "hostile", "code": code}
        return _offer(ctx, self.name, RootCause.undertraining, patch, RemedyFamily.reward_shaping)


def test_curve_warm_pass_sees_only_the_other_scenarios_cold_cases(kb, tmp_path, cache):
    from remedy.kb.bench import run_curve
    from remedy.retrieval.diagnosis import register_diagnoser

    register_diagnoser("test-hostile", _Hostile)
    paths = []
    for name in ("tiny_a", "tiny_b"):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({**SCENARIO, "name": name}))
        paths.append(str(path))
    scenarios = load_scenarios(paths)
    _Hostile.seen = []
    settings = BenchSettings(
        diagnoser="test-hostile", rounds=1, candidates=1, seeds=1, eval_episodes=3, n_envs=2, diagnose_episodes=3
    )
    curve = run_curve(scenarios, settings, work_kb=kb, cache_dir=cache)
    cold_a, cold_b, warm_a, warm_b = _Hostile.seen
    assert cold_a.cases == () and cold_b.cases == ()  # cold: retrieval saw nothing, not even tiny_a's cases
    assert {r.case.scenario for r in warm_a.cases} == {"tiny_b"}
    assert {r.case.scenario for r in warm_b.cases} == {"tiny_a"}
    assert [r.label for r in (curve.cold, curve.warm)] == ["cold", "warm"]
    assert all(r.statuses == ["failed"] and not r.fixed for r in curve.cold.scenarios + curve.warm.scenarios)
    assert curve.cold.summary.fix_rate == 0.0 and curve.warm.summary.n == 2
    stored = {c.case_id for c in kb.cases()}  # cold cases, then the warm ones kept after the pass
    assert {cid for r in curve.cold.scenarios + curve.warm.scenarios for cid in r.case_ids} <= stored
    md = write_report(curve, tmp_path / "r")[1].read_text()
    assert "| top-1 accuracy |" in md and "cold" in md and "warm" in md


def test_leave_one_family_out_split_holds_out_a_whole_family():
    from remedy.cases.errors import ScenarioError
    from remedy.kb.bench import lofo_families, select_scenarios

    every = select_scenarios()
    family = "reward_sign"
    test = select_scenarios(split=f"lofo:{family}")
    train = select_scenarios(split=f"lofo-train:{family}")
    assert test and {s.family for s in test} == {family}
    assert {s.split for s in test} == {"dev", "holdout"}  # the family's dev and holdout cells alike
    assert family not in {s.family for s in train}
    assert sorted(s.name for s in test + train) == sorted(s.name for s in every)  # a partition
    assert family in lofo_families(every) and len(lofo_families(every)) >= 8
    with pytest.raises(ScenarioError, match="reward_sign"):  # the message lists the families
        select_scenarios(split="lofo:reward_sgn")
    with pytest.raises(ScenarioError, match="lofo"):
        select_scenarios(split="lofo_reward_sign")


def test_bench_run_tables_show_improved_and_fixed_apart():
    """Two confirmed ``improved`` scenarios, one whose agent now works: the tables say 100% improved, 50% fixed."""
    from rich.console import Console

    from remedy.kb.bench import BenchReport, BenchSettings, ScenarioResult, split_summaries, summarize
    from remedy.kb.cli.bench import _bench_table, _scenario_table, _split_table

    def row(name: str, works: bool) -> ScenarioResult:
        return ScenarioResult(
            **{"scenario": name, "env_id": "CartPole-v1", "ground_truth": ["undertraining"], "expected_families": []},
            **{"first_causes": ["undertraining"], "top1": True, "top3": True, "fixed": True, "attempts": 1},
            **{"attempts_to_fix": 1, "env_steps_to_fix": 10, "wall_time_to_fix_s": 1.0, "total_env_steps": 10},
            **{"total_wall_time_s": 1.0, "winning_patch": "p", "winning_effect": None, "cited_cases": []},
            **{"case_ids": [], "statuses": ["improved"], "solvable": True, "works": works},
        )

    rows = [row("a", True), row("b", False)]
    report = BenchReport("kb", None, BenchSettings(), rows, summarize(rows), "now", 1.0, split_summaries(rows))
    assert (report.summary.fix_rate, report.summary.works_rate) == (1.0, 0.5)
    console = Console(record=True, width=250)
    for table in (_bench_table([report]), _split_table([report]), _scenario_table(report)):
        console.print(table)
    text = console.export_text()
    assert "confirmed-improved rate" in text and "fixed rate (the agent now works)" in text
    overall = next(line for line in text.splitlines() if "fixed rate (the agent now works)" in line)
    assert "50%" in overall
    assert "100% of 2" in text and "50% of 2" in text  # the split table: improved, then fixed, over solvable
    assert "fixed (works)" in text


class _Tweak:
    """A registered diagnoser that offers one hyperparameter change (its control is trained, and cached)."""

    name = "test-tweak"

    def diagnose(self, ctx):
        patch = {"parts": [{"kind": "hyperparameters", "changes": {"ent_coef": 0.01}}]}
        return _offer(ctx, self.name, RootCause.insufficient_exploration, patch, RemedyFamily.hyperparameters)


def test_a_patient_run_again_counts_its_controls_again(kb, scenario_file, cache):
    """A patient rerun on the KB its first run stored into (a bench resumed after a kill) trains its control
    arms again and counts their env steps, instead of taking the first run's cached controls for free."""
    from remedy.retrieval.diagnosis import register_diagnoser

    register_diagnoser("test-tweak", _Tweak)
    (s,) = load_scenarios(str(scenario_file))
    settings = replace(TINY, diagnoser="test-tweak")
    first = run_bench(None, [s], settings, store=kb, cache_dir=cache).scenarios[0]
    again = run_bench(None, [s], settings, store=kb, cache_dir=cache).scenarios[0]
    assert first.error == "" and again.error == ""
    assert first.total_env_steps == 2 * 256  # one seed: the treatment and its control, each the fine-tune budget
    assert again.total_env_steps == first.total_env_steps
    # the controls were cached for this patient's own rounds (and emptied for the rerun)
    assert list((kb.root / "controls" / "bench" / s.name).glob("*/result.json"))
