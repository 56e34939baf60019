"""The HTML report as a reader sees it: headless Chromium opens the file (offline, nothing
to fetch) and takes a screenshot, which must show the charts: a page that is not blank,
with plenty of pixels in each workload's colour.

Needs the `chromium` binary (Debian's `chromium` package; `deploy/bootstrap.sh` installs
it); skipped without it."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from PIL import Image

from bridge.page import WORKLOAD_COLOURS
from tests.unit.report_ledger import render_page

CHROMIUM = shutil.which("chromium")
#: pixels of a workload's colour a drawn chart shows at least (bars are thousands)
MIN_PIXELS = 1500


def _rgb(colour: str) -> npt.NDArray[np.int_]:
    return np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install chromium)")
def test_chromium_renders_the_charts(tmp_path: Path) -> None:
    assert CHROMIUM is not None
    page = tmp_path / "report.html"
    page.write_text(render_page(tmp_path), encoding="utf-8")
    shot = tmp_path / "shot.png"
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",  # tests run as root
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1400,2400",
        f"--screenshot={shot}",
        page.as_uri(),
    ]
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    took = time.monotonic() - started
    assert shot.exists(), f"no screenshot (rc {done.returncode}): {done.stderr[-2000:]}"

    img = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert img.shape[:2] == (2400, 1400)
    inked = (img < 230).any(axis=2).mean()
    assert inked > 0.03, f"the page looks blank ({inked:.1%} of pixels not white)"
    for workload in ("training", "elastic", "inference"):
        close = (np.abs(img - _rgb(WORKLOAD_COLOURS[workload])) <= 24).all(axis=2)
        assert close.sum() >= MIN_PIXELS, f"{workload} bars not drawn ({close.sum()} px)"
    print(f"chromium took {took:.1f}s")
