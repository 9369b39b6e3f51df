"""The HTML report in real headless Chromium: the page paints (not blank) and the rule table is in the DOM.

CI installs Debian's ``chromium`` (``.ci/run``), so there this test never skips; on a developer
machine without it, it skips with the reason.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from remedy.miners.report import write_report

from .report_cases import report_inputs

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CI"),
    reason="chromium is not installed (apt-get install chromium); CI installs it and never skips",
)


def _chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None, "CI must have chromium: .ci/run installs it with apt"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=True)


@pytest.fixture
def rendered(tmp_path):
    """A report over a handful of rules built from real bench cases (or built cases without an export)."""
    rules, cases = report_inputs()
    assert rules, "the fixture always yields rules"
    return rules, write_report(rules, cases, tmp_path / "reports", date=dt.date(2026, 12, 3), kb_label="test")


def test_the_report_paints_in_headless_chromium(tmp_path, rendered):
    _, paths = rendered
    shot = tmp_path / "shot.png"
    _chromium(tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,2000", paths.html.resolve().as_uri())
    pixels = imread(shot)[..., :3]  # RGB floats in [0, 1]
    assert pixels.shape[:2] == (2000, 1280)
    colours = np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 50, "text, tables and the embedded plots give many colours"
    non_white = (pixels < 0.95).any(axis=-1).mean()
    assert non_white > 0.02, f"only {non_white:.1%} of the page is painted"
    # the forest plot's blue/green markers and text are there: saturated pixels exist
    saturated = (pixels.max(axis=-1) - pixels.min(axis=-1) > 0.3).mean()
    assert saturated > 0.0005


def test_the_rule_table_is_in_the_dom_with_one_row_per_rule(tmp_path, rendered):
    rules, paths = rendered
    dom = _chromium(tmp_path / "profile", "--dump-dom", paths.html.resolve().as_uri()).stdout
    table = re.search(r'<table id="rules">(.*?)</table>', dom, flags=re.S)
    assert table is not None, "no rule table in the DOM"
    rows = re.findall(r'<tr class="rule-row">(.*?)</tr>', table.group(1), flags=re.S)
    assert len(rows) == len(rules)
    assert {re.search(r"(r-[0-9a-f]{10})", row).group(1) for row in rows} == {r.id for r in rules}
    assert 'src="data:image/png;base64,' in dom
