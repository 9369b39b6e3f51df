"""`remedy diagnose RUN --report DIR`: a self-contained page with the diagnosis, episode plots and frames.

The page is opened in real headless Chromium (CI installs Debian's ``chromium``; elsewhere the
browser checks skip with the reason): it paints, and its plots and GIF are in the DOM.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread
from typer.testing import CliRunner

from remedy.cases.errors import ValidationError
from remedy.cases.evidence.rollouts import EpisodeRecord
from remedy.kb.cli import app
from remedy.kb.diagnosis_page import typical_failures

PATIENT = Path(__file__).parents[2] / "cases" / "scenarios" / "checkpoints" / "cartpole_undertrained"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CI"),
    reason="chromium is not installed (apt-get install chromium); CI installs it and never skips",
)


def _chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None, "CI must have chromium: .ci/run installs it with apt"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
    return subprocess.run([*cmd, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    """The shipped undertrained CartPole patient diagnosed with --report (empty KB: priors only)."""
    tmp = tmp_path_factory.mktemp("page")
    run = shutil.copytree(PATIENT, tmp / "run", ignore=shutil.ignore_patterns("build.json"))
    argv = ["diagnose", str(run), "--kb", str(tmp / "kb"), "--episodes", "4", "--report", str(tmp / "out")]
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 0, res.output
    html = tmp / "out" / "diagnosis.html"
    assert html.is_file()
    return html


def test_page_holds_the_diagnosis_plots_and_frames(page: Path) -> None:
    text = page.read_text()
    assert "undertraining" in text  # the top cause of this patient, from the priors
    assert len(re.findall(r'class="episode-plot"[^>]*src="data:image/png;base64,', text)) >= 1
    assert re.search(r'id="frames"[^>]*src="data:image/gif;base64,', text)  # CartPole renders headless
    assert not list(page.parent.glob("*.tmp"))


@needs_chromium
def test_page_paints_in_headless_chromium(page: Path, tmp_path: Path) -> None:
    shot = tmp_path / "shot.png"
    _chromium(tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,2400", page.resolve().as_uri())
    pixels = imread(shot)[..., :3]
    assert (pixels < 0.95).any(axis=-1).mean() > 0.05, "the page is nearly blank"
    saturated = (pixels.max(axis=-1) - pixels.min(axis=-1) > 0.3).mean()
    assert saturated > 0.001, "the coloured plot lines are missing"
    dom = _chromium(tmp_path / "profile2", "--dump-dom", page.resolve().as_uri()).stdout
    assert '<table id="causes">' in dom and 'class="episode-plot"' in dom


def test_report_needs_a_local_run_directory(tmp_path: Path) -> None:
    argv = ["diagnose", "--describe", "it hovers", "--report", str(tmp_path), "--kb", str(tmp_path / "kb")]
    res = CliRunner().invoke(app, argv)
    assert isinstance(res.exception, ValidationError)  # main() prints it as one red line, exit 1
    assert "--report" in str(res.exception)


def _episode(seed: int, ret: float, success: bool) -> EpisodeRecord:
    return EpisodeRecord(seed, ret, ret, 10, True, False, success, 0.0, rewards=np.ones(10))


def test_typical_failures_are_the_median_and_the_worst_failure() -> None:
    eps = [_episode(0, 50, False), _episode(1, 10, False), _episode(2, 30, False), _episode(3, 500, True)]
    assert [e.seed for e in typical_failures(eps)] == [2, 1]
    assert [e.seed for e in typical_failures([_episode(3, 500, True)])] == [3]  # nothing failed: show what it does
