"""The case factory (remedy.kb.factory; faces: `remedy bench factory`, bench/factory.py): shards partition the
zoo, a re-run resumes (also from a manifest the earlier script wrote), chunks land with a manifest."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from remedy.cases.io import read_cases
from remedy.cases.model import Stage, Status
from remedy.cases.verify.solvability import ORACLE_FILE, latest_results, not_failing
from remedy.kb import factory as factory_module
from remedy.kb.bench import BenchSettings, select_scenarios

from .conftest import invoke, make_case

ROOT = Path(__file__).parents[2]
COMMITTED = ROOT / "bench" / "data" / "factory" / "manifest.json"


@pytest.fixture(scope="module")
def factory():
    return factory_module


@pytest.fixture(scope="module")
def zoo():
    return select_scenarios("cartpole_*")[:3]


def _fake_runner(calls: list[str]):
    """A unit runner that records its calls and returns a screen and its confirmation (improved and fixed)."""

    def run(unit, settings, executor=None, start=None):
        calls.append(unit.key)
        screen = make_case(f"s-{unit.key.replace('@', '.')}", status="inconclusive")
        conf = make_case(f"c-{unit.key.replace('@', '.')}", status="improved")
        v = conf.verification.model_copy(
            update={"stage": Stage.confirm, "confirms": screen.case_id, "fixed": True, "env_steps": 100}
        )
        conf = conf.model_copy(update={"verification": v, "tags": ["chosen:exploration", "rank:3"]})
        cases = [screen, conf]
        s = unit.scenario
        return cases, {
            "unit": unit.key,
            "scenario": s.name,
            "family": s.family,
            "wall_time_s": 2.0,
            **factory_counts(cases),
        }

    return run


def factory_counts(cases):
    return factory_module.counts(cases)


def test_shards_partition_the_units(factory, zoo):
    every = [u.key for u in factory.units(zoo, 2, None)]
    assert len(every) == 6 and len(set(every)) == 6
    parts = [[u.key for u in factory.units(zoo, 2, (i, 3))] for i in (1, 2, 3)]
    assert sorted(k for p in parts for k in p) == sorted(every)  # complete
    assert all(set(a).isdisjoint(b) for i, a in enumerate(parts) for b in parts[i + 1 :])  # disjoint
    assert every[:3] == [f"{s.name}@0" for s in zoo]  # pass by pass


def test_factory_resumes_and_seals_chunks(factory, zoo, tmp_path):
    calls: list[str] = []
    out = tmp_path / "factory"
    ran = factory.run_factory(zoo, BenchSettings(), out, chunk=2, unit_runner=_fake_runner(calls))
    assert ran == calls == [f"{s.name}@0" for s in zoo]
    manifest = json.loads((out / "manifest.json").read_text())
    assert [c["n_units"] for c in manifest["chunks"]] == [2, 1]  # every 2 units, the rest at the end
    t = manifest["totals"]
    assert (t["attempts"], t["improved"], t["fixed"], t["exploration"], t["env_steps"]) == (3, 3, 3, 3, 300)
    assert t["confirmations"] == 3 and t["n_units"] == 3 and t["wall_time_s"] == 6.0
    first = manifest["chunks"][0]
    assert first["settings"]["explore"] == 0.0 and "remedy" in first["versions"] and "git_commit" in first
    cases = read_cases(out / first["file"])[0]
    assert len(cases) == 4 and {c.case_id for c in cases} == {f"{p}-{zoo[i].name}.0" for p in "sc" for i in (0, 1)}
    assert not list((out / "pending").glob("*"))
    # a second run has nothing left to do
    assert factory.run_factory(zoo, BenchSettings(), out, chunk=2, unit_runner=_fake_runner(calls)) == []
    assert len(calls) == 3
    # a second pass runs only the new units
    more = factory.run_factory(zoo, BenchSettings(), out, passes=2, chunk=5, unit_runner=_fake_runner(calls))
    assert more == [f"{s.name}@1" for s in zoo]


def test_a_unit_left_pending_is_sealed_on_resume(factory, zoo, tmp_path):
    out = tmp_path / "factory"
    calls: list[str] = []
    unit = factory.units(zoo, 1, None)[0]
    cases, summary = _fake_runner(calls)(unit, BenchSettings())
    factory.save_pending(out, unit, cases, {**summary, "shard": "all"})  # a run killed before sealing
    assert factory.done_units(out) == {unit.key}
    ran = factory.run_factory(zoo, BenchSettings(), out, chunk=10, unit_runner=_fake_runner(calls))
    assert unit.key not in ran and len(ran) == 2
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["totals"]["n_units"] == 3 and len(manifest["chunks"]) == 1


def test_sharded_runs_share_one_manifest(factory, zoo, tmp_path):
    out, calls = tmp_path / "factory", []
    for i in (1, 2):
        factory.run_factory(zoo, BenchSettings(), out, shard=(i, 2), chunk=1, unit_runner=_fake_runner(calls))
    manifest = json.loads((out / "manifest.json").read_text())
    files = [c["file"] for c in manifest["chunks"]]
    assert len(files) == len(set(files)) == 3 and sorted(calls) == sorted(f"{s.name}@0" for s in zoo)
    assert {c["shard"] for c in manifest["chunks"]} == {"1/2", "2/2"}


def test_solvable_patients_first_and_not_failing_dropped(factory):
    scenarios = select_scenarios()
    zoo = factory.order_zoo(scenarios, ORACLE_FILE)
    verdicts = latest_results(scenarios, ORACLE_FILE)
    solvable = [s.name for s in scenarios if s.name in verdicts and verdicts[s.name].verdict == "solvable"]
    assert solvable and [s.name for s in zoo[: len(solvable)]] == sorted(solvable)
    assert not {s.name for s in zoo} & not_failing(scenarios, ORACLE_FILE)


def test_unchecked_patients_go_cheapest_check_first(factory, tmp_path):
    zoo = factory.order_zoo(select_scenarios("pendulum_*"), tmp_path / "no-records.jsonl")  # every one unchecked
    costs = [factory.estimated_steps(s) for s in zoo]
    assert len(zoo) > 3 and costs == sorted(costs) and costs[0] < costs[-1]


def test_counts_take_each_attempt_once_at_its_final_verdict(factory):
    screen = make_case("s1", status="inconclusive")
    conf = make_case("c1", status="improved")
    conf = conf.model_copy(
        update={"verification": conf.verification.model_copy(update={"stage": Stage.confirm, "confirms": "s1"})}
    )
    lone = make_case("s2", status="no_effect")
    c = factory.counts([screen, conf, lone])
    assert (c["attempts"], c["improved"], c["fixed"], c["confirmations"], c["cases"]) == (2, 1, 0, 1, 3)
    assert conf.verification.status is Status.improved


def test_bad_shard_is_one_error_line(factory, capsys):
    res = subprocess.run(
        [sys.executable, "bench/factory.py", "--shard", "3/2", "--dry-run"], cwd=ROOT, capture_output=True, text=True
    )
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0 and "--shard" in res.stderr


def test_a_patient_that_does_not_fail_becomes_a_skipped_unit(factory, zoo, tmp_path, monkeypatch):
    out, calls = tmp_path / "factory", []
    monkeypatch.setattr(
        factory, "check_oracle", lambda unit, oracle, say=None, keep=None: unit.scenario.name != zoo[0].name
    )
    ran = factory.run_factory(
        zoo, BenchSettings(), out, chunk=5, unit_runner=_fake_runner(calls), oracle=tmp_path / "o"
    )
    assert calls == ran == [f"{s.name}@0" for s in zoo[1:]]
    units = json.loads((out / "manifest.json").read_text())["chunks"][0]["units"]
    skipped = [u for u in units if u.get("skipped")]
    assert [u["unit"] for u in skipped] == [f"{zoo[0].name}@0"] and skipped[0]["attempts"] == 0
    assert factory.run_factory(zoo, BenchSettings(), out, unit_runner=_fake_runner(calls), oracle=tmp_path / "o") == []


def test_the_oracle_checks_attempts_are_kept_tagged_and_counted_apart(factory, zoo, tmp_path, monkeypatch):
    """A new patient's oracle check verifies the known fix against a control: real experience, kept in the unit's
    chunk as ``chosen:oracle``; a copy of a case the loop also made (same patch, same seeds) is left out."""

    def check(unit, oracle, say=None, keep=None):
        tag = unit.key.replace("@", ".")
        screen = make_case(f"os-{tag}", status="inconclusive")
        conf = make_case(f"oc-{tag}", status="improved")
        v = conf.verification.model_copy(update={"stage": Stage.confirm, "confirms": screen.case_id, "env_steps": 7})
        dup = make_case(f"s-{tag}", status="inconclusive")  # the loop's own screen has this id too
        keep.extend(c.model_copy(update={"tags": [*c.tags, factory.ORACLE_TAG]}) for c in (
            screen, conf.model_copy(update={"verification": v}), dup))  # fmt: skip
        return True

    monkeypatch.setattr(factory, "check_oracle", check)
    out, calls = tmp_path / "factory", []
    factory.run_factory(zoo[:1], BenchSettings(), out, chunk=5, unit_runner=_fake_runner(calls), oracle=tmp_path / "o")
    manifest = json.loads((out / "manifest.json").read_text())
    t = manifest["totals"]
    assert (t["attempts"], t["improved"], t["oracle"], t["oracle_improved"]) == (2, 2, 1, 1)
    assert t["env_steps"] == 107  # the oracle's confirmation and the loop's
    cases = read_cases(out / manifest["chunks"][0]["file"])[0]
    tag = f"{zoo[0].name}.0"
    assert [c.case_id for c in cases] == [f"os-{tag}", f"oc-{tag}", f"s-{tag}", f"c-{tag}"]
    assert [factory.ORACLE_TAG in c.tags for c in cases] == [True, True, False, False]


@pytest.mark.skipif(not COMMITTED.is_file(), reason="no committed factory manifest in this checkout")
def test_resumes_from_the_manifest_the_script_wrote(factory, tmp_path):
    """The committed manifest (read, never written: a copy) is resumed: its units are done, new ones seal into
    the next chunk of the shard, and the totals add up."""
    out = tmp_path / "factory"
    out.mkdir()
    shutil.copy(COMMITTED, out / "manifest.json")
    old = json.loads((out / "manifest.json").read_text())
    done = {u["unit"] for c in old["chunks"] for u in c["units"]}
    assert done and factory.done_units(out) == done
    by_name = {s.name: s for s in select_scenarios()}
    seen = [by_name[k.split("@")[0]] for k in sorted(done) if k.endswith("@0") and k.split("@")[0] in by_name][:2]
    fresh = [s for s in select_scenarios("cartpole_*") if f"{s.name}@0" not in done][:1]
    calls: list[str] = []
    ran = factory.run_factory([*seen, *fresh], BenchSettings(), out, chunk=4, unit_runner=_fake_runner(calls))
    assert ran == calls == [f"{s.name}@0" for s in fresh]
    new = json.loads((out / "manifest.json").read_text())
    assert new["chunks"][: len(old["chunks"])] == old["chunks"]  # nothing rewritten
    n_all = sum(1 for c in old["chunks"] if c["shard"] == "all")
    assert new["chunks"][-1]["file"] == f"chunk-all-{n_all + 1:04d}.parquet"
    for key in ("attempts", "improved", "fixed", "env_steps"):
        assert new["totals"][key] == old["totals"][key] + new["chunks"][-1][key]
    assert new["totals"]["chunks"] == len(old["chunks"]) + 1
    families = factory.status(out)["by_family"]  # per family, the same totals
    for key in ("attempts", "improved", "fixed"):
        assert sum(row[key] for row in families.values()) == new["totals"][key]


def test_cli_status_dry_run_and_a_run(factory, zoo, tmp_path, monkeypatch, capsys):
    out = tmp_path / "factory"
    code, stdout, _ = invoke(monkeypatch, capsys, "bench", "factory", "--status", "--json", "--out", out)
    state = json.loads(stdout)
    assert code == 0 and {k: state[k] for k in ("totals", "by_family", "pending")} == {
        "totals": {},
        "by_family": {},
        "pending": [],
    }
    assert state["zoo"]["patients"] == len(select_scenarios())  # the zoo's oracle verdicts beside the totals
    code, stdout, _ = invoke(
        monkeypatch,
        capsys,
        "bench",
        "factory",
        "--dry-run",
        "--scenarios",
        "cartpole_*",
        "--out",
        out,
        "--shard",
        "1/2",
    )
    assert code == 0 and stdout.strip().splitlines()[-1].endswith("unit(s) to run")
    calls: list[str] = []
    fake = _fake_runner(calls)
    monkeypatch.setattr(factory, "run_unit", lambda u, s, executor=None, start=None, say=None: fake(u, s))
    args = ("bench", "factory", "--scenarios", zoo[0].name, "--out", out, "--chunk", "1", "--json", "--seeds", "3")
    code, stdout, stderr = invoke(monkeypatch, capsys, *args)
    assert code == 0 and calls == [f"{zoo[0].name}@0"]
    state = json.loads(stdout)
    assert state["totals"]["n_units"] == 1 and state["totals"]["fixed"] == 1 and state["pending"] == []
    assert state["by_family"] == {zoo[0].family: {"units": 1, "attempts": 1, "improved": 1, "fixed": 1}}
    assert f"unit 1/1: {zoo[0].name}@0" in stderr and f"done {zoo[0].name}@0" in stderr  # a line per unit
    settings = json.loads((out / "manifest.json").read_text())["chunks"][0]["settings"]
    assert (settings["seeds"], settings["rounds"], settings["explore"]) == (3, 2, 0.2)
    code, stdout, _ = invoke(monkeypatch, capsys, *args)  # resumed: nothing left
    assert code == 0 and calls == [f"{zoo[0].name}@0"]
    code, _, stderr = invoke(monkeypatch, capsys, "bench", "factory", "--dry-run", "--split", "lofo:nope")
    assert code == 1 and "lofo" in stderr and stderr.strip().count("\n") == 0


def test_zoo_verdicts_count_every_patient_once(factory, tmp_path):
    zoo = select_scenarios()
    v = factory.zoo_verdicts(zoo, ORACLE_FILE)
    records = latest_results(zoo, ORACLE_FILE)
    assert v["patients"] == len(zoo) == v["solvable"] + v["unsolvable"] + v["not_failing"] + v["unchecked"]
    assert v["solvable"] == sum(1 for r in records.values() if r.verdict == "solvable")
    assert 0 < v["solvable_share_of_checked"] < 1
    empty = factory.zoo_verdicts(zoo[:3], tmp_path / "none.jsonl")
    assert empty["unchecked"] == 3 and empty["solvable_share_of_checked"] is None
    state = factory.status(tmp_path / "no-factory", ORACLE_FILE)
    assert state["zoo"]["patients"] == len(zoo) and state["totals"] == {}


def test_oracle_cases_rerun_solvable_checks_once_and_skip_shipped_ids(factory, tmp_path, monkeypatch):
    """`--oracle-cases`: each solvable patient's oracle check again, its attempts kept as `chosen:oracle` in chunks of
    their own shard; a case id the dataset already holds is not shipped twice; a re-run has nothing left."""
    zoo = [s for s in select_scenarios("pendulum_*") if s.name in _solvable()][:2]
    assert len(zoo) == 2
    out, calls = tmp_path / "factory", []

    def fake(unit, oracle, say=print):
        calls.append(unit.key)
        tag = unit.scenario.name
        cases = [make_case(f"o-{tag}", status="improved"), make_case("shipped-already", status="no_effect")]
        cases = [c.model_copy(update={"tags": [factory.ORACLE_TAG]}) for c in cases]
        return cases, {"unit": unit.key, "scenario": tag, "family": unit.scenario.family, **factory.counts(cases)}

    monkeypatch.setattr(factory, "run_oracle_unit", fake)
    factory.save_pending(out, factory.OracleUnit(zoo[0]), [make_case("shipped-already")], {"shard": "other"})
    ran = factory.run_factory(zoo, BenchSettings(), out, chunk=5, oracle=ORACLE_FILE, oracle_cases=True)
    assert ran == calls == [f"{s.name}@oracle" for s in zoo][1:]  # the first one is pending already: done
    manifest = json.loads((out / "manifest.json").read_text())
    (entry,) = manifest["chunks"]
    assert entry["shard"] == "oracleall" and entry["file"].startswith("chunk-oracleall-")
    ids = [c.case_id for c in read_cases(out / entry["file"])[0]]
    assert ids == [f"o-{zoo[1].name}"]  # the id already in the dataset is left out
    assert (entry["oracle"], entry["oracle_improved"]) == (1, 1)
    assert factory.run_factory(zoo, BenchSettings(), out, oracle=ORACLE_FILE, oracle_cases=True) == []


def _solvable() -> set[str]:
    return {n for n, r in latest_results(select_scenarios(), ORACLE_FILE).items() if r.verdict == "solvable"}
