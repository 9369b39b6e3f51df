"""A checkpoint is code: loading an untrusted run directory must run none of it (issue 29).

Each hostile artefact is tiny; each payload would create a marker file if it ran, and a
trusted load (``--trust-checkpoint``) shows the payload is live.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import shutil
import zipfile

import cloudpickle
import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from remedy.cases.errors import CheckpointError, EnvError
from remedy.cases.evidence.checkpoint import check_zip, read_data, serialized_keys
from remedy.cases.evidence.rundir import RunDir


class _OpenMarker:
    """Unpickling this calls ``open(marker, "w")``: the file appears iff the pickle was executed."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


class _SystemMarker(_OpenMarker):
    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def run_copy(cartpole_run, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(cartpole_run, dst)
    return dst


def _rewrite_data(model_zip, change) -> None:
    """Rewrite the ``data`` entry of ``model_zip`` with ``change(data)`` applied, other entries as they were."""
    with zipfile.ZipFile(model_zip) as zf:
        entries = {name: zf.read(name) for name in zf.namelist()}
    data = json.loads(entries["data"])
    change(data)
    entries["data"] = json.dumps(data).encode()
    with zipfile.ZipFile(model_zip, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, raw in entries.items():
            zf.writestr(name, raw)


def _payload(obj) -> dict:
    return {":type:": "<class 'object'>", ":serialized:": base64.b64encode(cloudpickle.dumps(obj)).decode()}


def _edit_yaml(path, **changes):
    data = yaml.safe_load((path / "run.yaml").read_text())
    data.update(changes)
    (path / "run.yaml").write_text(yaml.safe_dump(data))


# -- model.zip ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["evil", "policy_class", "lr_schedule", "observation_space"])
def test_serialized_payload_is_not_run_and_model_still_acts(run_copy, tmp_path, key):
    obs = np.zeros(4, dtype=np.float32)
    clean_action = RunDir.load(run_copy).load_model().predict(obs, deterministic=True)[0]
    marker = tmp_path / f"pwned-{key}"

    def inject(data):  # a new key, or an existing one keeping its recorded attributes with other bytes
        data[key] = {**_payload(_OpenMarker(marker)), **data.get(key, {})}
        data[key][":serialized:"] = _payload(_OpenMarker(marker))[":serialized:"]

    _rewrite_data(run_copy / "model.zip", inject)
    assert key in serialized_keys(read_data(run_copy / "model.zip"))
    model = RunDir.load(run_copy).load_model()
    assert not marker.exists()
    assert model.predict(obs, deterministic=True)[0] == clean_action  # same weights, same action
    fine_tune = RunDir.load(run_copy).load_model(learning_rate=1e-4)  # the arms' path: overrides, same safety
    assert not marker.exists() and fine_tune.learning_rate == 1e-4


def test_trusted_load_runs_the_payload_so_the_test_payload_is_live(run_copy, tmp_path):
    marker = tmp_path / "pwned-trusted"
    _rewrite_data(run_copy / "model.zip", lambda d: d.update(evil=_payload(_OpenMarker(marker))))
    RunDir.load(run_copy, trust=True).load_model()
    assert marker.exists()


def test_custom_policy_class_is_refused_untrusted(run_copy):
    def custom(data):
        data["policy_class"]["__module__"] = "my_project.policies"

    _rewrite_data(run_copy / "model.zip", custom)
    with pytest.raises(CheckpointError, match="--trust-checkpoint"):
        RunDir.load(run_copy).load_model()


def test_recorded_spaces_still_checked_against_the_env(run_copy):
    _rewrite_data(run_copy / "model.zip", lambda d: d["observation_space"].update(_shape=[6]))
    with pytest.raises(CheckpointError, match="observation space .* does not match"):
        RunDir.load(run_copy).load_model()


def test_network_far_larger_than_the_stored_weights_is_refused_before_it_is_built(run_copy):
    _rewrite_data(run_copy / "model.zip", lambda d: d["policy_kwargs"].update(net_arch=[100_000, 100_000]))
    with pytest.raises(CheckpointError, match="net_arch describes a network of at least 10,000,000,000 weights"):
        RunDir.load(run_copy).load_model()


def _bomb(path, data_bytes: int, *, prefix: bytes = b'{"a": 1') -> None:
    """A zip whose ``data`` entry inflates to ``data_bytes`` of spaces: written as a stream, a few KB on disk."""
    chunk = b" " * (1 << 20)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open("data", "w", force_zip64=True) as f:
            f.write(prefix)
            for _ in range(data_bytes // len(chunk)):
                f.write(chunk)
            f.write(b"}")
        zf.writestr("policy.pth", b"")


def test_zip_bomb_refused_at_the_cap(tmp_path):
    bomb = tmp_path / "bomb.zip"
    _bomb(bomb, 8 << 20)
    assert bomb.stat().st_size < 64 << 10  # the artefact is small; only its inflated size is large
    with pytest.raises(CheckpointError, match="'data' inflates past 1 MiB"):
        check_zip(bomb, max_data_bytes=1 << 20)
    with pytest.raises(CheckpointError, match="inflates past 1 MiB"):
        read_data(bomb, max_bytes=1 << 20)
    check_zip(bomb, max_data_bytes=16 << 20)  # under a higher cap the same file is fine


def test_zip_bomb_in_a_run_directory_is_refused_by_default(run_copy):
    _bomb(run_copy / "model.zip", 65 << 20)  # past the default 64 MiB; streamed, never held whole
    with pytest.raises(CheckpointError, match="'data' inflates past 64 MiB"):
        RunDir.load(run_copy)


def test_entry_larger_than_its_header_says_is_corrupt(run_copy):
    mp = run_copy / "model.zip"
    raw = bytearray(mp.read_bytes())
    at = raw.find(b"PK\x01\x02")  # first central-directory record ("data"): uncompressed size at +24
    raw[at + 24 : at + 28] = (10).to_bytes(4, "little")
    mp.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="corrupt"):
        RunDir.load(run_copy)


# -- vecnormalize.pkl --------------------------------------------------------------------------------
@pytest.mark.parametrize("payload", [_OpenMarker, _SystemMarker])
def test_malicious_vecnormalize_is_refused_not_run(run_copy, tmp_path, payload):
    marker = tmp_path / "pwned-pkl"
    (run_copy / "vecnormalize.pkl").write_bytes(pickle.dumps(payload(marker)))
    run = RunDir.load(run_copy)
    from stable_baselines3.common.vec_env import DummyVecEnv

    with pytest.raises(CheckpointError, match="is not allowed in normalization statistics") as err:
        run.load_vecnormalize(DummyVecEnv([run.make_env]))
    assert "\n" not in str(err.value) and "--trust-checkpoint" in str(err.value)
    assert not marker.exists()


def test_damaged_vecnormalize_is_one_clear_error(run_copy):
    (run_copy / "vecnormalize.pkl").write_bytes(b"\x80\x05not a pickle")
    run = RunDir.load(run_copy)
    from stable_baselines3.common.vec_env import DummyVecEnv

    with pytest.raises(CheckpointError, match="save it again"):
        run.load_vecnormalize(DummyVecEnv([run.make_env]))


# -- env ids -----------------------------------------------------------------------------------------
@pytest.fixture
def marker_module(tmp_path, monkeypatch):
    """An importable module that writes a marker when imported and registers nothing."""
    name = f"remedy_marker_{tmp_path.name.replace('-', '_')}"
    marker = tmp_path / "imported"
    (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name, marker


def test_module_env_id_imports_nothing_untrusted(run_copy, marker_module):
    module, marker = marker_module
    _edit_yaml(run_copy, env_id=f"{module}:Nope-v0")
    with pytest.raises(EnvError, match=f"would import module '{module}'.*--trust-checkpoint"):
        RunDir.load(run_copy)
    assert not marker.exists()


def test_module_prefix_of_a_registered_id_is_not_imported(run_copy, marker_module):
    module, marker = marker_module
    _edit_yaml(run_copy, env_id=f"{module}:CartPole-v1")
    run = RunDir.load(run_copy)
    run.make_env().close()
    assert not marker.exists()


def test_trusted_module_must_register_the_env(run_copy, marker_module):
    module, marker = marker_module
    _edit_yaml(run_copy, env_id=f"{module}:Nope-v0")
    with pytest.raises(EnvError, match=f"importing '{module}' registered no env 'Nope-v0'"):
        RunDir.load(run_copy, trust=True)
    assert marker.exists()  # trusted: the user's own module was imported


# -- the CLI -----------------------------------------------------------------------------------------
def test_trust_checkpoint_flag_on_every_command_that_loads_a_checkpoint():
    from remedy.kb.cli import app

    for command in (["signature"], ["diagnose"], ["similar"], ["verify"], ["fix"]):
        out = CliRunner().invoke(app, [*command, "--help"], terminal_width=200).output
        assert "--trust-checkpoint" in out, command


def test_signature_cli_refuses_a_payload_run_then_trusts_the_users_own(run_copy, tmp_path, marker_module):
    from remedy.kb.cli import app

    module, marker = marker_module
    _edit_yaml(run_copy, env_id=f"{module}:Nope-v0")
    refused = CliRunner().invoke(app, ["signature", str(run_copy), "--episodes", "1", "--json"])
    assert isinstance(refused.exception, EnvError) and "--trust-checkpoint" in str(refused.exception)
    assert not marker.exists()
    _edit_yaml(run_copy, env_id=f"{module}:CartPole-v1")
    trusted = CliRunner().invoke(app, ["signature", str(run_copy), "--episodes", "1", "--json", "--trust-checkpoint"])
    assert trusted.exit_code == 0, trusted.output
    assert marker.exists() and "symptoms" in json.loads(trusted.stdout)
