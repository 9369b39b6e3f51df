"""Local or served, one behaviour: `verify --server` screens AND confirms as local does, `fix --server`
carries every option, and /docs works without a CDN.

The CLI's client is routed to an in-process service (its TestClient), so commands, routes and the job
worker run for real without a port.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
import time
from importlib import resources
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from remedy.cases.patches.io import load_patch
from remedy.kb.cli import app as cli
from remedy.kb.client import RemedyClient
from remedy.kb.server.handlers import fixes_dir
from remedy.kb.server.models import FixJobIn, VerifyJobIn
from remedy.kb.settings import FixSettings, VerifySettings
from remedy.kb.verify import verify

from ..test_fixed_agent import SLOW_LEARNER
from .conftest import serve

QUICK = Path(str(resources.files("remedy.cases") / "scenarios" / "checkpoints" / "cartpole_undertrained"))
SERVER = "http://testserver"
runner = CliRunner()


@pytest.fixture
def remote(kb_path, embedder, monkeypatch):
    """The service with its job worker, and the CLI's --server client routed to it with a writer token."""
    for s in serve(kb_path, embedder):
        from remedy.kb.cli import connect

        monkeypatch.setattr(
            connect, "client", lambda server, s=s: RemedyClient(server, s.tokens["writer"], http=s.client)
        )
        yield s


def _ok(*args):
    result = runner.invoke(cli, [str(a) for a in args])
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


def _queued_params(remote, *args) -> dict:
    """Submit a command with --no-wait while the worker is stopped; the job's recorded params."""
    remote.service.runner.stop()  # keep the job queued: only what was sent is checked
    job = json.loads(_ok(*args, "--server", SERVER, "--no-wait", "--json"))
    assert job["state"] == "queued"
    return remote.service.jobs.get(job["job_id"]).params


FIX_OPTIONS = {
    "--rounds": 2,
    "--candidates": 3,
    "--seeds": 2,
    "--confirm-seeds": 4,
    "--screen-confidence": 0.9,
    "--budget": 500,
    "--executor": "ray",
    "--confirmations": 3,
    "--out": "team/cartpole",
    "--race-fraction": 0.5,
    "--race-seeds": 3,
}


def test_fix_through_the_service_carries_every_option(remote):
    flags = [str(x) for kv in FIX_OPTIONS.items() for x in kv]
    params = _queued_params(remote, "fix", QUICK, *flags, "--exhaustive", "--no-race")
    local = FixSettings(
        rounds=2,
        candidates=3,
        seeds=2,
        confirm_seeds=4,
        screen_confidence=0.9,
        budget=500,
        executor="ray",
        confirmations=3,
        out="team/cartpole",
        exhaustive=True,
        race=False,
        race_fraction=0.5,
        race_seeds=3,
    )
    assert {k: v for k, v in params.items() if k != "run_id"} == local.model_dump()
    served = FixJobIn.model_validate(params)
    assert served.loop_kwargs() == local.loop_kwargs()  # the same loop: config, rounds, exhaustive, race...
    assert served.loop_kwargs()["config"].executor == "ray" and served.loop_kwargs()["exhaustive"]
    root = remote.service.kb.root.resolve()
    assert fixes_dir(remote.service, served.out) == root / "fixes" / "team" / "cartpole"


@pytest.mark.parametrize("out", ["../elsewhere", "/tmp/abs", "a/../../b", "x y"])
def test_fix_out_on_the_service_stays_under_its_fixes_folder(remote, out):
    result = runner.invoke(cli, ["fix", str(QUICK), "--out", out, "--server", SERVER, "--no-wait"])
    assert result.exit_code != 0 and "<kb>/fixes/" in str(result.exception), result.output
    assert remote.service.jobs.list() == []


def test_verify_through_the_service_sends_the_confirmation_settings(remote, tmp_path):
    patch = tmp_path / "lr.yaml"
    patch.write_text(yaml.safe_dump({"kind": "hyperparameters", "changes": {"learning_rate": 0.001}}))
    args = ["--seeds", 2, "--confirm-seeds", 5, "--screen-confidence", 0.9, "--seed-base", 7, "--no-confirm"]
    params = _queued_params(remote, "verify", QUICK, "--patch", patch, *args)
    req = VerifyJobIn.model_validate(params)
    assert (req.seeds, req.confirm_seeds, req.screen_confidence, req.seed_base, req.confirm) == (2, 5, 0.9, 7, False)
    config = req.config()
    assert config.confirmation(0).seeds == 5 and config.seed_base == 7 and config.screen_confidence == 0.9


@pytest.mark.slow
def test_verify_through_the_service_ends_as_local_does(remote, tmp_path):
    """Same patient, patch, seeds and options: the service screens and confirms, with the same status and effect.

    The local run is the library call `remedy verify` makes, sharing the service's cached control arms (a
    cached control is the same run as a fresh one): only the treatments are trained again."""
    from remedy.cases.verify.training import train
    from remedy.kb.fixloop import one_torch_thread

    one_torch_thread()
    patient = train(SLOW_LEARNER, tmp_path / "run", seed=0).path
    patch = tmp_path / "lr.yaml"
    patch.write_text(yaml.safe_dump({"kind": "hyperparameters", "changes": {"learning_rate": 0.003}}))
    args = ["--seeds", 2, "--confirm-seeds", 3, "--budget", 2048, "--episodes", 10, "--n-envs", 2]
    served = json.loads(_ok("verify", patient, "--patch", patch, *args, "--json", "--server", SERVER))
    settings = VerifySettings(seeds=2, confirm_seeds=3, budget=2048, episodes=10, n_envs=2)
    controls = remote.service.kb.root / "controls"
    local = verify(patient, load_patch(patch), settings, store=None, control_cache=controls).as_dict()
    assert local["stage"] == served["stage"] == "confirm" and local["status"] == served["status"] == "improved"
    for mine, theirs in ((local["screen"], served["screen"]), (local, served)):
        assert mine["case_id"] == theirs["case_id"]  # same inputs and seeds: the same measurement
        v, w = mine["case"]["verification"], theirs["case"]["verification"]
        assert v["effect"]["diff"] == pytest.approx(w["effect"]["diff"]) and v["per_seed"] == w["per_seed"]
    assert remote.service.kb.get(served["case_id"]).status == "improved" and served["stored"]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_load_only_local_assets(served, page):
    html = served.client.get(page)
    assert html.status_code == 200
    urls = re.findall(r'(?:src|href)="([^"]+)"', html.text)
    assert urls and "http" not in html.text.replace("http-equiv", "")  # no CDN anywhere on the page
    for url in urls:
        assert url.startswith("/") and not url.startswith("//"), url
        asset = served.client.get(url)
        assert asset.status_code == 200 and asset.content, url
    assert any(u.endswith(".js") for u in urls)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium); CI installs it")
def test_docs_paint_the_operations_in_headless_chromium(kb_path, embedder, tmp_path):
    """Served by a real uvicorn on a loopback port, /docs renders every route with only the app's own assets."""
    import uvicorn

    from remedy.kb.server import create_app

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(kb_path, embedder=embedder, run_jobs=False), port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(600):  # bounded: at most 60 s for the KB to open
            if server.started:
                break
            time.sleep(0.1)
        assert server.started
        dom = subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                f"--user-data-dir={tmp_path / 'profile'}",
                "--virtual-time-budget=10000",
                "--dump-dom",
                f"http://127.0.0.1:{port}/docs",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
    finally:
        server.should_exit = True
        thread.join(30)
    assert "opblock-summary-path" in dom and "/v1/jobs/fix" in dom, dom[-2000:]
    assert "Unable to render" not in dom and "Failed to load" not in dom


def test_settings_out_of_bounds_are_one_error_line_locally_too(tmp_path):
    """The CLI and the service refuse the same values with the same limits (one settings type)."""
    from remedy.cases.errors import ValidationError
    from remedy.kb.settings import VerifySettings, settings_from

    with pytest.raises(ValidationError, match="seeds"):
        settings_from(VerifySettings, seeds=50)
    patch = tmp_path / "lr.yaml"
    patch.write_text(yaml.safe_dump({"kind": "hyperparameters", "changes": {"learning_rate": 0.001}}))
    result = runner.invoke(cli, ["verify", str(QUICK), "--patch", str(patch), "--seeds", "50", "--no-store"])
    assert result.exit_code != 0 and "seeds" in str(result.exception)
    served = runner.invoke(cli, ["verify", str(QUICK), "--patch", str(patch), "--no-store", "--server", SERVER])
    assert served.exit_code != 0 and "--no-store" in str(served.exception)
